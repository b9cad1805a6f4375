// StoreKvTier: the persistent store as the engine's KV tier (cache/kv_tier.h).
// Binds an AgentStore to one KV fingerprint: the model's fingerprint combined
// with the backend's KV format (dtype, e.g. "f32" on the CPU, "bf16" on the
// GPU) and the block size, so blocks computed by another model, another
// dtype or another block geometry are never served.
//
// Thread-safety: as AgentStore (any thread). Ownership: the store must
// outlive the tier; the tier does not close it (one store serves the models
// of a hot-swap in turn).
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "cache/kv_tier.h"
#include "store/agent_store.h"

namespace agentkv::store {

class StoreKvTier : public cache::KvTier {
 public:
  // `model_fingerprint_hex`: ModelFiles::Fingerprint(). `element_size`: bytes
  // of one KV element (4 for f32, 2 for bf16), the shuffle width the codec
  // uses. Records the model's description under the combined fingerprint.
  static Result<std::unique_ptr<StoreKvTier>> Create(AgentStore* store,
                                                     const std::string& model_fingerprint_hex,
                                                     const std::string& kv_format, int block_size,
                                                     uint32_t element_size,
                                                     const std::string& model_name = {});

  // The fingerprint the KV records are tagged with.
  static ModelFingerprint KvFingerprint(const std::string& model_fingerprint_hex,
                                        const std::string& kv_format, int block_size);

  const char* source_name() const override { return "disk"; }
  Result<cache::KvTierLoad> Load(std::span<const int32_t> tokens, const cache::BlockHash& root,
                                 int block_size, int32_t first_block, int32_t max_blocks) override;
  Result<int32_t> CountStored(std::span<const int32_t> tokens, const cache::BlockHash& root,
                              int block_size, int32_t first_block, int32_t max_blocks) override;
  Result<cache::KvTierLoadInto> LoadInto(std::span<const int32_t> tokens,
                                         const cache::BlockHash& root, int block_size,
                                         int32_t first_block, int32_t max_blocks,
                                         std::span<std::byte> dst, size_t block_bytes) override;
  void Save(const std::string& agent_key, uint32_t first_index,
            std::vector<cache::KvTierBlock> blocks) override;
  Status Flush() override { return store_->Flush(); }

  const ModelFingerprint& fingerprint() const { return fp_; }

 private:
  StoreKvTier(AgentStore* store, ModelFingerprint fp, uint32_t element_size)
      : store_(store), fp_(fp), element_size_(element_size) {}

  // Blocks [first_block, first_block + max_blocks) of `tokens` that are
  // full: their hashes (chained from `root`) and tokens; nullopt when there
  // are none.
  struct Range {
    std::vector<cache::BlockHash> hashes;
    std::span<const int32_t> tokens;
  };
  static std::optional<Range> RangeOf(std::span<const int32_t> tokens, const cache::BlockHash& root,
                                      int block_size, int32_t first_block, int32_t max_blocks);

  AgentStore* store_;
  ModelFingerprint fp_;
  uint32_t element_size_;
};

}  // namespace agentkv::store
