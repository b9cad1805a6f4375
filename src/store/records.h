// Keys and typed payloads of the store's small records (agent meta, turns,
// chain entries, KV meta, models): docs/store-format.md, version 1.
// Decoders check the envelope and the payload's own structure and return
// Corruption naming the record; they never trust a length they read.
// Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "cache/block_hash.h"
#include "store/fingerprint.h"
#include "util/status.h"

namespace agentkv::store {

inline constexpr size_t kMaxAgentIdBytes = 256;

// Agent ids are 1..256 bytes without NUL (NUL ends the id inside keys).
Status ValidateAgentId(std::string_view id);

// --- keys -------------------------------------------------------------------
std::string HistoryPrefix(std::string_view agent);  // agent, 0x00
std::string HistoryKey(std::string_view agent, uint32_t turn);
std::string ChainPrefix(std::string_view agent);  // every fingerprint
std::string ChainPrefix(std::string_view agent, const ModelFingerprint& fp);
std::string ChainKey(std::string_view agent, const ModelFingerprint& fp, uint32_t index);
std::string KvKey(const ModelFingerprint& fp, const cache::BlockHash& hash);
void EncodeBlockHash(const cache::BlockHash& h, char out[16]);
cache::BlockHash DecodeBlockHash(const char in[16]);
// Splits a chains key into its fingerprint and index; false if malformed.
bool ParseChainKey(std::string_view key, size_t agent_len, ModelFingerprint* fp, uint32_t* index);
// Readable form of a binary key for messages: "agent/turn", hex, ...
std::string DescribeKey(int db, std::string_view key);

// --- records ----------------------------------------------------------------
struct AgentMeta {
  std::string id;  // from the key, not stored in the value
  int64_t created_ms = 0;
  int64_t last_used_ms = 0;
  uint32_t turns = 0;
  std::string system_prompt_hash;
  nlohmann::json extras = nlohmann::json::object();
};
std::string EncodeAgentMeta(const AgentMeta& meta);
Result<AgentMeta> DecodeAgentMeta(std::string_view id, std::string_view value);

struct ChainEntry {
  cache::BlockHash hash;
  std::vector<int32_t> tokens;
};
std::string EncodeChainEntry(const cache::BlockHash& hash, std::span<const int32_t> tokens);
Result<ChainEntry> DecodeChainEntry(std::string_view value, std::string_view where);

struct KvMeta {
  uint64_t last_access_ms = 0;
  uint32_t refcount = 0;
  uint32_t stored_bytes = 0;
};
std::string EncodeKvMeta(const KvMeta& meta);
Result<KvMeta> DecodeKvMeta(std::string_view value, std::string_view where);

// Turns, models and the store meta: JSON text in an envelope. Decoding
// checks the envelope and that the text parses as JSON.
Result<std::string> DecodeJsonRecord(int type, std::string_view value, std::string_view where);

}  // namespace agentkv::store
