#include "util/hash.h"

#include <xxhash.h>

#include <cstdio>

namespace agentkv {

std::string Hash128::Hex() const {
  char buf[33];
  std::snprintf(buf, sizeof(buf), "%016llx%016llx", static_cast<unsigned long long>(high),
                static_cast<unsigned long long>(low));
  return buf;
}

std::string Hex64(uint64_t h) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

uint64_t Xxh3_64(const void* data, size_t size, uint64_t seed) {
  return XXH3_64bits_withSeed(data, size, seed);
}

Hash128 Xxh3_128(const void* data, size_t size, uint64_t seed) {
  XXH128_hash_t h = XXH3_128bits_withSeed(data, size, seed);
  return {h.low64, h.high64};
}

struct Xxh3Hasher128::State {
  XXH3_state_t* s = nullptr;
  ~State() { XXH3_freeState(s); }
};

Xxh3Hasher128::Xxh3Hasher128(uint64_t seed) : state_(std::make_unique<State>()) {
  state_->s = XXH3_createState();
  XXH3_128bits_reset_withSeed(state_->s, seed);
}
Xxh3Hasher128::~Xxh3Hasher128() = default;
Xxh3Hasher128::Xxh3Hasher128(Xxh3Hasher128&&) noexcept = default;
Xxh3Hasher128& Xxh3Hasher128::operator=(Xxh3Hasher128&&) noexcept = default;

void Xxh3Hasher128::Update(const void* data, size_t size) {
  XXH3_128bits_update(state_->s, data, size);
}

void Xxh3Hasher128::UpdateU64(uint64_t v) {
  unsigned char b[8];
  for (int i = 0; i < 8; ++i) b[i] = static_cast<unsigned char>(v >> (8 * i));
  Update(b, 8);
}

Hash128 Xxh3Hasher128::Digest() const {
  XXH128_hash_t h = XXH3_128bits_digest(state_->s);
  return {h.low64, h.high64};
}

}  // namespace agentkv
