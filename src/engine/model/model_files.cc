#include "engine/model/model_files.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "util/hash.h"

namespace agentkv::model {
namespace {

namespace fs = std::filesystem;

constexpr uint64_t kEdgeBytes = 1u << 20;
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

Result<std::string> ReadAll(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) return IoError(p.string() + ": cannot read");
  std::stringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return IoError(p.string() + ": read failed");
  return ss.str();
}

void AddPart(Xxh3Hasher128& h, std::string_view part) {
  h.UpdateU64(part.size());
  h.Update(part);
}

Status PreadFully(int fd, void* buf, uint64_t size, uint64_t offset, const fs::path& p) {
  auto* out = static_cast<char*>(buf);
  while (size > 0) {
    ssize_t n = ::pread(fd, out, size, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return IoError(p.string() + ": read failed: " + std::strerror(errno));
    out += n;
    size -= static_cast<uint64_t>(n);
    offset += static_cast<uint64_t>(n);
  }
  return Status::Ok();
}

// Header plus the first and last kEdgeBytes of the data section. A damaged
// header length is clamped rather than rejected: the fingerprint identifies
// bytes, and the loader reports the corruption.
Result<Hash128> WeightFileIdentity(const fs::path& p, uint64_t* size_out) {
  int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return IoError(p.string() + ": cannot open: " + std::strerror(errno));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  off_t end = ::lseek(fd, 0, SEEK_END);
  if (end < 0) return IoError(p.string() + ": seek failed: " + std::strerror(errno));
  const uint64_t size = static_cast<uint64_t>(end);
  *size_out = size;
  Xxh3Hasher128 h;
  uint64_t header_end = std::min<uint64_t>(8, size);
  if (size >= 8) {
    unsigned char len[8];
    RETURN_IF_ERROR(PreadFully(fd, len, 8, 0, p));
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; --i) hlen = (hlen << 8) | len[i];
    header_end = 8 + std::min({hlen, size - 8, kMaxHeaderBytes});
  }
  std::string buf(header_end, '\0');
  RETURN_IF_ERROR(PreadFully(fd, buf.data(), header_end, 0, p));
  AddPart(h, buf);
  const uint64_t data = size - header_end;
  const uint64_t head = std::min(kEdgeBytes, data);
  buf.resize(head);
  RETURN_IF_ERROR(PreadFully(fd, buf.data(), head, header_end, p));
  AddPart(h, buf);
  const uint64_t tail = std::min(kEdgeBytes, data);
  buf.resize(tail);
  RETURN_IF_ERROR(PreadFully(fd, buf.data(), tail, size - tail, p));
  AddPart(h, buf);
  return h.Digest();
}

}  // namespace

Result<ModelFiles> ModelFiles::Locate(const fs::path& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return NotFound(dir.string() + ": not a directory");
  ModelFiles m;
  m.dir = dir;
  auto need = [&](const char* name, fs::path* out) -> Status {
    fs::path p = dir / name;
    if (!fs::is_regular_file(p, ec)) return NotFound(p.string() + ": not found");
    *out = p;
    return Status::Ok();
  };
  auto optional = [&](const char* name, fs::path* out) {
    fs::path p = dir / name;
    if (fs::is_regular_file(p, ec)) *out = p;
  };
  RETURN_IF_ERROR(need("config.json", &m.config));
  RETURN_IF_ERROR(need("tokenizer.json", &m.tokenizer));
  optional("tokenizer_config.json", &m.tokenizer_config);
  optional("generation_config.json", &m.generation_config);
  optional("model.safetensors.index.json", &m.weight_index);

  if (!m.weight_index.empty()) {
    ASSIGN_OR_RETURN(std::string text, ReadAll(m.weight_index));
    std::set<std::string> shards;
    try {
      const auto j = nlohmann::json::parse(text);
      for (const auto& [name, file] : j.at("weight_map").items())
        shards.insert(file.get<std::string>());
    } catch (const nlohmann::json::exception& e) {
      return Corruption(m.weight_index.string() + ": bad weight_map: " + e.what());
    }
    for (const auto& s : shards) {
      fs::path p = dir / s;
      if (!fs::is_regular_file(p, ec))
        return NotFound(p.string() + ": listed in " + m.weight_index.string() + " but not found");
      m.weights.push_back(p);
    }
  } else {
    for (const auto& de : fs::directory_iterator(dir, ec))
      if (de.path().extension() == ".safetensors" && de.is_regular_file())
        m.weights.push_back(de.path());
    if (ec) return IoError(dir.string() + ": cannot list: " + ec.message());
  }
  if (m.weights.empty()) return NotFound(dir.string() + ": no *.safetensors weight files");
  std::sort(m.weights.begin(), m.weights.end());
  return m;
}

Result<std::string> ModelFiles::Fingerprint() const {
  Xxh3Hasher128 h;
  AddPart(h, "agentkv-fingerprint-v1");
  ASSIGN_OR_RETURN(std::string cfg_text, ReadAll(config));
  std::string canonical;
  try {
    canonical = nlohmann::json::parse(cfg_text).dump();
  } catch (const nlohmann::json::exception& e) {
    return InvalidArgument(config.string() + ": not valid JSON: " + e.what());
  }
  AddPart(h, canonical);
  ASSIGN_OR_RETURN(std::string tok_text, ReadAll(tokenizer));
  AddPart(h, Xxh3_128(tok_text).Hex());
  for (const auto& w : weights) {
    uint64_t size = 0;
    ASSIGN_OR_RETURN(Hash128 id, WeightFileIdentity(w, &size));
    AddPart(h, w.filename().string());
    h.UpdateU64(size);
    AddPart(h, id.Hex());
  }
  return h.Digest().Hex();
}

}  // namespace agentkv::model
