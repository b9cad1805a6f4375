#include "store/kv_block_codec.h"

#include <zstd.h>

#include <cstring>

#include "store/byte_order.h"
#include "store/record_envelope.h"
#include "store/records.h"

namespace agentkv::store {
namespace {

constexpr size_t kFixedHeader = 56;  // fp, hash, tokens, elem, usize, csize, reserved

// Byte plane k of the output holds byte k of every element.
void Shuffle(const char* in, size_t n, uint32_t es, char* out) {
  const size_t count = n / es;
  for (size_t i = 0; i < count; ++i)
    for (uint32_t b = 0; b < es; ++b) out[b * count + i] = in[i * es + b];
}
void Unshuffle(const char* in, size_t n, uint32_t es, char* out) {
  const size_t count = n / es;
  if (es == 2) {
    const char* p0 = in;
    const char* p1 = in + count;
    for (size_t i = 0; i < count; ++i) {
      out[2 * i] = p0[i];
      out[2 * i + 1] = p1[i];
    }
    return;
  }
  for (uint32_t b = 0; b < es; ++b) {
    const char* plane = in + b * count;
    for (size_t i = 0; i < count; ++i) out[i * es + b] = plane[i];
  }
}

}  // namespace

struct KvBlockCodec::Contexts {
  ZSTD_CCtx* c = ZSTD_createCCtx();
  ZSTD_DCtx* d = ZSTD_createDCtx();
  ~Contexts() {
    ZSTD_freeCCtx(c);
    ZSTD_freeDCtx(d);
  }
};

std::vector<int32_t> KvBlockView::Tokens() const {
  std::vector<int32_t> t(token_count);
  for (uint32_t i = 0; i < token_count; ++i)
    t[i] = static_cast<int32_t>(GetU32(tokens_le.data() + 4 * i));
  return t;
}

KvBlockCodec::KvBlockCodec(int level) : ctx_(std::make_unique<Contexts>()), level_(level) {}
KvBlockCodec::~KvBlockCodec() = default;

Result<std::string> KvBlockCodec::Encode(const ModelFingerprint& fp, const cache::BlockHash& hash,
                                         std::span<const int32_t> tokens, std::string_view data,
                                         uint32_t element_size) {
  if (element_size != 1 && element_size != 2 && element_size != 4) {
    return InvalidArgument("KV element size must be 1, 2 or 4");
  }
  if (data.size() % element_size != 0) {
    return InvalidArgument("KV block size is not a multiple of its element size");
  }
  std::string_view src = data;
  if (element_size > 1) {
    scratch_.resize(data.size());
    Shuffle(data.data(), data.size(), element_size, scratch_.data());
    src = scratch_;
  }
  const size_t bound = ZSTD_compressBound(src.size());
  const size_t head = kEnvelopeSize + kFixedHeader + 4 * tokens.size();
  std::string out(head + bound, '\0');
  ZSTD_CCtx* c = ctx_->c;
  ZSTD_CCtx_reset(c, ZSTD_reset_session_and_parameters);
  ZSTD_CCtx_setParameter(c, ZSTD_c_compressionLevel, level_);
  ZSTD_CCtx_setParameter(c, ZSTD_c_checksumFlag, 1);
  ZSTD_CCtx_setParameter(c, ZSTD_c_contentSizeFlag, 1);
  const size_t csize = ZSTD_compress2(c, out.data() + head, bound, src.data(), src.size());
  if (ZSTD_isError(csize)) return Internal(std::string("zstd: ") + ZSTD_getErrorName(csize));
  out.resize(head + csize);
  char* p = out.data() + kEnvelopeSize;
  std::memcpy(p, fp.bytes.data(), 16);
  EncodeBlockHash(hash, p + 16);
  PutU32(p + 32, static_cast<uint32_t>(tokens.size()));
  PutU32(p + 36, element_size);
  PutU64(p + 40, data.size());
  PutU32(p + 48, static_cast<uint32_t>(csize));
  PutU32(p + 52, 0);
  for (size_t i = 0; i < tokens.size(); ++i)
    PutU32(p + kFixedHeader + 4 * i, static_cast<uint32_t>(tokens[i]));
  const std::string_view payload(out.data() + kEnvelopeSize, out.size() - kEnvelopeSize);
  const std::string header = EnvelopeHeader(RecordType::kKvBlock, payload);
  std::memcpy(out.data(), header.data(), kEnvelopeSize);
  return out;
}

Result<KvBlockView> KvBlockCodec::Parse(std::string_view value, const ModelFingerprint& fp,
                                        const cache::BlockHash& hash, uint64_t max_uncompressed,
                                        std::string_view where) {
  auto bad = [&](const std::string& why) { return Corruption(std::string(where) + ": " + why); };
  ASSIGN_OR_RETURN(OpenedRecord rec, OpenRecord(RecordType::kKvBlock, value, where));
  const std::string_view p = rec.payload;
  if (p.size() < kFixedHeader) return bad("KV header truncated");
  KvBlockView v;
  std::memcpy(v.fp.bytes.data(), p.data(), 16);
  v.hash = DecodeBlockHash(p.data() + 16);
  if (!(v.fp == fp)) return bad("record is for model " + v.fp.Hex());
  if (!(v.hash == hash)) return bad("record is for another block");
  v.token_count = GetU32(p.data() + 32);
  v.element_size = GetU32(p.data() + 36);
  v.uncompressed_size = GetU64(p.data() + 40);
  const uint32_t csize = GetU32(p.data() + 48);
  if (v.element_size != 1 && v.element_size != 2 && v.element_size != 4) {
    return bad("bad element size");
  }
  if (v.uncompressed_size > max_uncompressed) {
    return bad("uncompressed size " + std::to_string(v.uncompressed_size) + " over the limit " +
               std::to_string(max_uncompressed));
  }
  if (v.uncompressed_size % v.element_size != 0) return bad("size not a multiple of elements");
  if (uint64_t{kFixedHeader} + 4ull * v.token_count + csize != p.size()) {
    return bad("KV sizes do not add up to the record length");
  }
  v.tokens_le = p.substr(kFixedHeader, 4ull * v.token_count);
  v.compressed = p.substr(kFixedHeader + 4ull * v.token_count);
  return v;
}

Status KvBlockCodec::Decode(const KvBlockView& v, std::string* out, std::string_view where) {
  if (v.uncompressed_size > out->max_size()) {
    return Corruption(std::string(where) + ": uncompressed size too large");
  }
  out->resize(static_cast<size_t>(v.uncompressed_size));
  return DecodeInto(v, std::span<char>(out->data(), out->size()), where);
}

Status KvBlockCodec::DecodeInto(const KvBlockView& v, std::span<char> out, std::string_view where) {
  auto bad = [&](const std::string& why) { return Corruption(std::string(where) + ": " + why); };
  const unsigned long long declared =
      ZSTD_getFrameContentSize(v.compressed.data(), v.compressed.size());
  if (declared == ZSTD_CONTENTSIZE_ERROR || declared == ZSTD_CONTENTSIZE_UNKNOWN ||
      declared != v.uncompressed_size) {
    return bad("zstd frame size does not match the header");
  }
  if (v.uncompressed_size != out.size()) {
    return bad("block holds " + std::to_string(v.uncompressed_size) + " bytes, expected " +
               std::to_string(out.size()));
  }
  const size_t n = out.size();
  char* dst = out.data();
  if (v.element_size > 1) {
    scratch_.resize(n);
    dst = scratch_.data();
  }
  ZSTD_DCtx_reset(ctx_->d, ZSTD_reset_session_and_parameters);
  const size_t got = ZSTD_decompressDCtx(ctx_->d, dst, n, v.compressed.data(), v.compressed.size());
  if (ZSTD_isError(got)) return bad(std::string("zstd: ") + ZSTD_getErrorName(got));
  if (got != n) return bad("decompressed size mismatch");
  if (v.element_size > 1) Unshuffle(scratch_.data(), n, v.element_size, out.data());
  return Status::Ok();
}

}  // namespace agentkv::store
