#include "store/records.h"

#include <cstring>

#include "store/byte_order.h"
#include "store/lmdb_env.h"
#include "store/record_envelope.h"
#include "util/hash.h"

namespace agentkv::store {
namespace {

void PutBeU32(std::string* s, uint32_t v) {
  for (int i = 3; i >= 0; --i) s->push_back(static_cast<char>(v >> (8 * i)));
}
uint32_t GetBeU32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}

std::string HexBytes(std::string_view b) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  for (char c : b) {
    out.push_back(kDigits[static_cast<uint8_t>(c) >> 4]);
    out.push_back(kDigits[static_cast<uint8_t>(c) & 15]);
  }
  return out;
}

}  // namespace

Status ValidateAgentId(std::string_view id) {
  if (id.empty()) return InvalidArgument("agent id is empty");
  if (id.size() > kMaxAgentIdBytes) {
    return InvalidArgument("agent id is longer than " + std::to_string(kMaxAgentIdBytes) +
                           " bytes");
  }
  if (id.find('\0') != std::string_view::npos) return InvalidArgument("agent id contains NUL");
  return Status::Ok();
}

std::string HistoryPrefix(std::string_view agent) {
  std::string k(agent);
  k.push_back('\0');
  return k;
}

std::string HistoryKey(std::string_view agent, uint32_t turn) {
  std::string k = HistoryPrefix(agent);
  PutBeU32(&k, turn);
  return k;
}

std::string ChainPrefix(std::string_view agent) { return HistoryPrefix(agent); }

std::string ChainPrefix(std::string_view agent, const ModelFingerprint& fp) {
  std::string k = HistoryPrefix(agent);
  k.append(fp.AsKey());
  return k;
}

std::string ChainKey(std::string_view agent, const ModelFingerprint& fp, uint32_t index) {
  std::string k = ChainPrefix(agent, fp);
  PutBeU32(&k, index);
  return k;
}

void EncodeBlockHash(const cache::BlockHash& h, char out[16]) {
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(h.hi >> (56 - 8 * i));
  for (int i = 0; i < 8; ++i) out[8 + i] = static_cast<char>(h.lo >> (56 - 8 * i));
}

cache::BlockHash DecodeBlockHash(const char in[16]) {
  cache::BlockHash h;
  for (int i = 0; i < 8; ++i) h.hi = (h.hi << 8) | static_cast<uint8_t>(in[i]);
  for (int i = 0; i < 8; ++i) h.lo = (h.lo << 8) | static_cast<uint8_t>(in[8 + i]);
  return h;
}

std::string KvKey(const ModelFingerprint& fp, const cache::BlockHash& hash) {
  std::string k(fp.AsKey());
  char h[16];
  EncodeBlockHash(hash, h);
  k.append(h, 16);
  return k;
}

bool ParseChainKey(std::string_view key, size_t agent_len, ModelFingerprint* fp, uint32_t* index) {
  if (key.size() != agent_len + 1 + 16 + 4) return false;
  std::memcpy(fp->bytes.data(), key.data() + agent_len + 1, 16);
  *index = GetBeU32(key.data() + agent_len + 17);
  return true;
}

std::string DescribeKey(int db, std::string_view key) {
  std::string name = std::string(DbName(static_cast<Db>(db))) + " ";
  const size_t nul = key.find('\0');
  switch (static_cast<Db>(db)) {
    case Db::kHistory:
      if (nul != std::string_view::npos && key.size() == nul + 5) {
        return name + std::string(key.substr(0, nul)) + " turn " +
               std::to_string(GetBeU32(key.data() + nul + 1));
      }
      break;
    case Db::kChains:
      if (nul != std::string_view::npos && key.size() == nul + 21) {
        return name + std::string(key.substr(0, nul)) + " fp " + HexBytes(key.substr(nul + 1, 16)) +
               " block " + std::to_string(GetBeU32(key.data() + nul + 17));
      }
      break;
    case Db::kKv:
    case Db::kKvMeta:
      if (key.size() == 32) {
        return name + "fp " + HexBytes(key.substr(0, 16)) + " block " + HexBytes(key.substr(16));
      }
      break;
    case Db::kModels:
      return name + HexBytes(key);
    case Db::kAgents:
    case Db::kMeta:
      return name + std::string(key);
    default:
      break;
  }
  return name + HexBytes(key);
}

std::string EncodeAgentMeta(const AgentMeta& meta) {
  nlohmann::json j = {{"created_ms", meta.created_ms},
                      {"last_used_ms", meta.last_used_ms},
                      {"turns", meta.turns},
                      {"system_prompt_hash", meta.system_prompt_hash},
                      {"extras", meta.extras}};
  return SealRecord(RecordType::kAgent, j.dump());
}

Result<AgentMeta> DecodeAgentMeta(std::string_view id, std::string_view value) {
  const std::string where = "agents " + std::string(id);
  ASSIGN_OR_RETURN(OpenedRecord rec, OpenRecord(RecordType::kAgent, value, where));
  nlohmann::json j = nlohmann::json::parse(rec.payload, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j["created_ms"].is_number_integer() ||
      !j["last_used_ms"].is_number_integer() || !j["turns"].is_number_unsigned() ||
      !j["system_prompt_hash"].is_string() || !j["extras"].is_object()) {
    return Corruption(where + ": malformed agent meta");
  }
  AgentMeta m;
  m.id = std::string(id);
  m.created_ms = j["created_ms"].get<int64_t>();
  m.last_used_ms = j["last_used_ms"].get<int64_t>();
  m.turns = static_cast<uint32_t>(j["turns"].get<uint64_t>());
  m.system_prompt_hash = j["system_prompt_hash"].get<std::string>();
  m.extras = std::move(j["extras"]);
  return m;
}

std::string EncodeChainEntry(const cache::BlockHash& hash, std::span<const int32_t> tokens) {
  std::string p;
  p.reserve(20 + 4 * tokens.size());
  char h[16];
  EncodeBlockHash(hash, h);
  p.append(h, 16);
  PutU32(&p, static_cast<uint32_t>(tokens.size()));
  for (int32_t t : tokens) PutU32(&p, static_cast<uint32_t>(t));
  return SealRecord(RecordType::kChainEntry, p);
}

Result<ChainEntry> DecodeChainEntry(std::string_view value, std::string_view where) {
  ASSIGN_OR_RETURN(OpenedRecord rec, OpenRecord(RecordType::kChainEntry, value, where));
  const std::string_view p = rec.payload;
  if (p.size() < 20) return Corruption(std::string(where) + ": chain entry too short");
  const uint32_t n = GetU32(p.data() + 16);
  if ((p.size() - 20) / 4 != n || (p.size() - 20) % 4 != 0) {
    return Corruption(std::string(where) + ": chain entry token count mismatch");
  }
  ChainEntry e;
  e.hash = DecodeBlockHash(p.data());
  e.tokens.resize(n);
  for (uint32_t i = 0; i < n; ++i)
    e.tokens[i] = static_cast<int32_t>(GetU32(p.data() + 20 + 4 * i));
  return e;
}

std::string EncodeKvMeta(const KvMeta& meta) {
  std::string p;
  PutU64(&p, meta.last_access_ms);
  PutU32(&p, meta.refcount);
  PutU32(&p, meta.stored_bytes);
  return SealRecord(RecordType::kKvMeta, p);
}

Result<KvMeta> DecodeKvMeta(std::string_view value, std::string_view where) {
  ASSIGN_OR_RETURN(OpenedRecord rec, OpenRecord(RecordType::kKvMeta, value, where));
  if (rec.payload.size() != 16) return Corruption(std::string(where) + ": KV meta size");
  KvMeta m;
  m.last_access_ms = GetU64(rec.payload.data());
  m.refcount = GetU32(rec.payload.data() + 8);
  m.stored_bytes = GetU32(rec.payload.data() + 12);
  return m;
}

Result<std::string> DecodeJsonRecord(int type, std::string_view value, std::string_view where) {
  ASSIGN_OR_RETURN(OpenedRecord rec, OpenRecord(static_cast<RecordType>(type), value, where));
  if (!nlohmann::json::accept(rec.payload)) {
    return Corruption(std::string(where) + ": payload is not JSON");
  }
  return std::string(rec.payload);
}

}  // namespace agentkv::store
