// Fuzzes the store's record decoders, the code that reads whatever bytes a
// damaged or hostile store file holds: the envelope (OpenRecord), agent
// meta, chain entries, KV meta, JSON records (turns, models, store meta),
// KV block records (Parse, then bounded zstd decoding) and key parsing.
// The first byte picks the record type and whether the rest is the raw
// value or a payload sealed in a valid envelope (so the fuzzer gets past the
// checksum to the payload's own structure). A decoder must return a Status
// for any input; decoded records are re-encoded and must decode the same.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>

#include "store/kv_block_codec.h"
#include "store/lmdb_env.h"
#include "store/record_envelope.h"
#include "store/records.h"

namespace {

using namespace agentkv::store;

void Fail(const char* what) {
  std::fprintf(stderr, "fuzz: %s\n", what);
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const int type = 1 + (data[0] & 7) % 7;
  const bool seal = data[0] & 8;
  std::string_view rest(reinterpret_cast<const char*>(data + 1), size - 1);
  const std::string value =
      seal ? SealRecord(static_cast<RecordType>(type), rest) : std::string(rest);
  const std::string_view where = "fuzz";

  (void)OpenRecord(static_cast<RecordType>(type), value, where);
  switch (static_cast<RecordType>(type)) {
    case RecordType::kAgent: {
      auto m = DecodeAgentMeta("agent", value);
      if (m.ok()) {
        auto again = DecodeAgentMeta("agent", EncodeAgentMeta(*m));
        if (!again.ok() || again->turns != m->turns || again->created_ms != m->created_ms ||
            again->last_used_ms != m->last_used_ms ||
            again->system_prompt_hash != m->system_prompt_hash) {
          Fail("agent meta does not survive re-encoding");
        }
      }
      break;
    }
    case RecordType::kChainEntry: {
      auto e = DecodeChainEntry(value, where);
      if (e.ok()) {
        auto again = DecodeChainEntry(EncodeChainEntry(e->hash, e->tokens), where);
        if (!again.ok() || !(again->hash == e->hash) || again->tokens != e->tokens) {
          Fail("chain entry does not survive re-encoding");
        }
      }
      break;
    }
    case RecordType::kKvMeta: {
      auto m = DecodeKvMeta(value, where);
      if (m.ok()) {
        auto again = DecodeKvMeta(EncodeKvMeta(*m), where);
        if (!again.ok() || again->refcount != m->refcount ||
            again->last_access_ms != m->last_access_ms || again->stored_bytes != m->stored_bytes) {
          Fail("KV meta does not survive re-encoding");
        }
      }
      break;
    }
    case RecordType::kKvBlock: {
      // The record must name the block it is looked up under: take the
      // fingerprint and hash from where the header keeps them, so the
      // fuzzer reaches the sizes and the zstd frame.
      ModelFingerprint fp;
      agentkv::cache::BlockHash hash;
      if (rest.size() >= 32) {
        std::memcpy(fp.bytes.data(), rest.data(), 16);
        hash = DecodeBlockHash(rest.data() + 16);
      }
      auto view = KvBlockCodec::Parse(value, fp, hash, 1 << 20, where);
      if (view.ok()) {
        (void)view->Tokens();
        static KvBlockCodec codec;
        std::string out;
        (void)codec.Decode(*view, &out, where);
      }
      break;
    }
    default:
      (void)DecodeJsonRecord(type, value, where);
      break;
  }
  for (int db = 0; db < kDbCount; ++db) (void)DescribeKey(db, rest);
  ModelFingerprint fp;
  uint32_t index = 0;
  (void)ParseChainKey(rest, rest.find('\0') == std::string_view::npos ? 0 : rest.find('\0'), &fp,
                      &index);
  (void)ValidateAgentId(rest);
  return 0;
}
