// Shared helpers for the store tests: scratch directories, KV-like data and
// chain writes built from token ids.
#pragma once

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "cache/block_hash.h"
#include "store/agent_store.h"
#include "util/bf16.h"

namespace agentkv::store::testing {

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "agentkv_store_XXXXXX").string();
    path_ = ::mkdtemp(tmpl.data());
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string sub(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

inline ModelFingerprint Fp(char c) { return *ModelFingerprint::FromHex(std::string(32, c)); }

// fp32 values with KV-like structure: per-channel scale and offset plus
// noise, so neighbouring tokens resemble each other the way K/V rows do.
inline std::vector<float> KvLikeFloats(size_t n, uint32_t seed, int channels = 64) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> noise(0.f, 1.f);
  std::vector<float> scale(channels), offset(channels);
  for (int c = 0; c < channels; ++c) {
    scale[c] = 0.05f + 2.f * std::abs(noise(rng));
    offset[c] = 0.5f * noise(rng);
  }
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = offset[i % channels] + scale[i % channels] * noise(rng);
  return v;
}

inline std::string Fp32Bytes(const std::vector<float>& v) {
  std::string s(v.size() * 4, '\0');
  std::memcpy(s.data(), v.data(), s.size());
  return s;
}

inline std::string Bf16Bytes(const std::vector<float>& v) {
  std::string s(v.size() * 2, '\0');
  for (size_t i = 0; i < v.size(); ++i) {
    const uint16_t b = F32ToBf16(v[i]);
    std::memcpy(s.data() + 2 * i, &b, 2);
  }
  return s;
}

// Block i of `tokens` with KV bytes derived from (seed, i).
inline KvChainWrite MakeChainWrite(const std::string& agent, const ModelFingerprint& fp,
                                   const std::vector<int32_t>& tokens, int block_size,
                                   size_t block_bytes, uint32_t first_block = 0,
                                   uint32_t seed = 1) {
  KvChainWrite w;
  w.agent_id = agent;
  w.fp = fp;
  w.first_index = first_block;
  w.element_size = 2;
  const auto hashes = cache::HashFullBlocks(tokens, block_size);
  for (size_t i = first_block; i < hashes.size(); ++i) {
    KvBlockWrite b;
    b.hash = hashes[i];
    b.tokens.assign(tokens.begin() + i * block_size, tokens.begin() + (i + 1) * block_size);
    b.data = Bf16Bytes(KvLikeFloats(block_bytes / 2, seed * 7919 + static_cast<uint32_t>(i)));
    w.blocks.push_back(std::move(b));
  }
  return w;
}

inline std::vector<int32_t> Tokens(size_t n, int32_t start = 0) {
  std::vector<int32_t> t(n);
  for (size_t i = 0; i < n; ++i) t[i] = start + static_cast<int32_t>(i * 7 % 50000);
  return t;
}

}  // namespace agentkv::store::testing
