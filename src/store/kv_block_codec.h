// KvBlockCodec: encodes one KV block into its record (docs/store-format.md,
// type 4: header, token ids, one zstd frame with content size and content
// checksum) and decodes it with bounded decompression.
//
// Thread-safety: one codec per thread (it owns zstd contexts); the static
// Parse() is thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "cache/block_hash.h"
#include "store/fingerprint.h"
#include "util/status.h"

namespace agentkv::store {

// The parsed, checksum-verified header of a KV block record. Views point
// into the value.
struct KvBlockView {
  ModelFingerprint fp;
  cache::BlockHash hash;
  uint32_t element_size = 1;
  uint64_t uncompressed_size = 0;
  uint32_t token_count = 0;
  std::string_view tokens_le;   // token_count little-endian i32s
  std::string_view compressed;  // the zstd frame
  std::vector<int32_t> Tokens() const;
};

class KvBlockCodec {
 public:
  // `level`: zstd level (1 is fast and near the best ratio on KV data).
  explicit KvBlockCodec(int level = 1);
  ~KvBlockCodec();
  KvBlockCodec(const KvBlockCodec&) = delete;
  KvBlockCodec& operator=(const KvBlockCodec&) = delete;
  void set_level(int level) { level_ = level; }

  // `element_size` 2 or 4 shuffles bytes by element before compressing
  // (bf16/fp16 or fp32 data compress better); 1 stores them as given.
  Result<std::string> Encode(const ModelFingerprint& fp, const cache::BlockHash& hash,
                             std::span<const int32_t> tokens, std::string_view data,
                             uint32_t element_size);

  // Checks the envelope, that the record belongs to (fp, hash) and that its
  // sizes are consistent and at most `max_uncompressed`. `where` names the
  // record in Corruption messages.
  static Result<KvBlockView> Parse(std::string_view value, const ModelFingerprint& fp,
                                   const cache::BlockHash& hash, uint64_t max_uncompressed,
                                   std::string_view where);

  // Decompresses a parsed record into `out` (resized to exactly
  // uncompressed_size); never writes more, and fails on a size or checksum
  // mismatch.
  Status Decode(const KvBlockView& view, std::string* out, std::string_view where);
  // Same into caller memory, which must be exactly uncompressed_size bytes
  // (a record of another size is Corruption); on failure `out` holds
  // unspecified bytes.
  Status DecodeInto(const KvBlockView& view, std::span<char> out, std::string_view where);

 private:
  struct Contexts;
  std::unique_ptr<Contexts> ctx_;
  int level_;
  std::string scratch_;
};

}  // namespace agentkv::store
