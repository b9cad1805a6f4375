#include "store/store_kv_tier.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <optional>

#include "util/hash.h"

namespace agentkv::store {

ModelFingerprint StoreKvTier::KvFingerprint(const std::string& model_fingerprint_hex,
                                            const std::string& kv_format, int block_size) {
  const std::string id = "agentkv-kv-v1|model=" + model_fingerprint_hex + "|kv=" + kv_format +
                         "|block=" + std::to_string(block_size);
  const Hash128 h = Xxh3_128(id);
  ModelFingerprint fp;
  for (int i = 0; i < 8; ++i) {
    fp.bytes[i] = static_cast<uint8_t>(h.high >> (56 - 8 * i));
    fp.bytes[8 + i] = static_cast<uint8_t>(h.low >> (56 - 8 * i));
  }
  return fp;
}

Result<std::unique_ptr<StoreKvTier>> StoreKvTier::Create(AgentStore* store,
                                                         const std::string& model_fingerprint_hex,
                                                         const std::string& kv_format,
                                                         int block_size, uint32_t element_size,
                                                         const std::string& model_name) {
  if (store == nullptr) return InvalidArgument("StoreKvTier: no store");
  if (element_size != 1 && element_size != 2 && element_size != 4)
    return InvalidArgument("StoreKvTier: element size must be 1, 2 or 4");
  if (block_size <= 0) return InvalidArgument("StoreKvTier: block size must be positive");
  const ModelFingerprint fp = KvFingerprint(model_fingerprint_hex, kv_format, block_size);
  nlohmann::json desc = {{"model_fingerprint", model_fingerprint_hex},
                         {"kv_format", kv_format},
                         {"block_size", block_size}};
  if (!model_name.empty()) desc["name"] = model_name;
  RETURN_IF_ERROR(store->PutModel(fp, desc.dump()));
  return std::unique_ptr<StoreKvTier>(new StoreKvTier(store, fp, element_size));
}

std::optional<StoreKvTier::Range> StoreKvTier::RangeOf(std::span<const int32_t> tokens,
                                                       const cache::BlockHash& root, int block_size,
                                                       int32_t first_block, int32_t max_blocks) {
  const int64_t full = static_cast<int64_t>(tokens.size()) / block_size;
  const int64_t last = std::min<int64_t>(full, static_cast<int64_t>(first_block) + max_blocks);
  if (first_block < 0 || first_block >= last) return std::nullopt;
  Range r;
  r.hashes =
      cache::HashFullBlocks(tokens.first(static_cast<size_t>(last * block_size)), block_size, root);
  r.hashes.erase(r.hashes.begin(), r.hashes.begin() + first_block);
  r.tokens = tokens.subspan(static_cast<size_t>(first_block) * block_size,
                            static_cast<size_t>(last - first_block) * block_size);
  return r;
}

Result<cache::KvTierLoad> StoreKvTier::Load(std::span<const int32_t> tokens,
                                            const cache::BlockHash& root, int block_size,
                                            int32_t first_block, int32_t max_blocks) {
  cache::KvTierLoad out;
  const std::optional<Range> r = RangeOf(tokens, root, block_size, first_block, max_blocks);
  if (!r) return out;
  ASSIGN_OR_RETURN(KvPrefix p, store_->LoadKvPrefix(fp_, r->hashes, r->tokens, block_size));
  out.problem = p.problem;
  out.blocks.reserve(p.blocks.size());
  for (KvBlock& b : p.blocks)
    out.blocks.push_back(cache::KvTierBlock{b.hash, std::move(b.tokens), std::move(b.data)});
  return out;
}

Result<int32_t> StoreKvTier::CountStored(std::span<const int32_t> tokens,
                                         const cache::BlockHash& root, int block_size,
                                         int32_t first_block, int32_t max_blocks) {
  const std::optional<Range> r = RangeOf(tokens, root, block_size, first_block, max_blocks);
  if (!r) return 0;
  ASSIGN_OR_RETURN(size_t n, store_->CountKvPrefix(fp_, r->hashes));
  return static_cast<int32_t>(n);
}

Result<cache::KvTierLoadInto> StoreKvTier::LoadInto(std::span<const int32_t> tokens,
                                                    const cache::BlockHash& root, int block_size,
                                                    int32_t first_block, int32_t max_blocks,
                                                    std::span<std::byte> dst, size_t block_bytes) {
  cache::KvTierLoadInto out;
  const std::optional<Range> r = RangeOf(tokens, root, block_size, first_block, max_blocks);
  if (!r) return out;
  ASSIGN_OR_RETURN(KvPrefixInto p, store_->LoadKvPrefixInto(fp_, r->hashes, r->tokens, block_size,
                                                            dst, block_bytes));
  out.blocks = static_cast<int32_t>(p.blocks);
  out.problem = p.problem;
  return out;
}

void StoreKvTier::Save(const std::string& agent_key, uint32_t first_index,
                       std::vector<cache::KvTierBlock> blocks) {
  if (blocks.empty()) return;
  KvChainWrite w;
  // An agent key the store cannot take as an id still stores the blocks
  // (content-addressed), only without a chain.
  if (ValidateAgentId(agent_key).ok()) w.agent_id = agent_key;
  w.fp = fp_;
  w.first_index = first_index;
  w.element_size = element_size_;
  w.blocks.reserve(blocks.size());
  for (cache::KvTierBlock& b : blocks)
    w.blocks.push_back(KvBlockWrite{b.hash, std::move(b.tokens), std::move(b.data)});
  store_->PutKvBlocks(std::move(w));
}

}  // namespace agentkv::store
