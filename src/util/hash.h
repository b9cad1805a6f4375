// xxHash wrappers: XXH3 64/128-bit one-shot hashes and a streaming 128-bit
// hasher. Hashes are stable across machines and library versions (XXH3 has a
// frozen output since xxHash 0.8), so they may be persisted.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace agentkv {

struct Hash128 {
  uint64_t low = 0;
  uint64_t high = 0;

  // 32 lowercase hex digits, high half first: the same text `xxhsum -H2`
  // prints.
  std::string Hex() const;
  bool operator==(const Hash128&) const = default;
};

uint64_t Xxh3_64(const void* data, size_t size, uint64_t seed = 0);
inline uint64_t Xxh3_64(std::string_view s, uint64_t seed = 0) {
  return Xxh3_64(s.data(), s.size(), seed);
}
Hash128 Xxh3_128(const void* data, size_t size, uint64_t seed = 0);
inline Hash128 Xxh3_128(std::string_view s, uint64_t seed = 0) {
  return Xxh3_128(s.data(), s.size(), seed);
}

// 16 lowercase hex digits, as `xxhsum -H3` prints an XXH3_64 value.
std::string Hex64(uint64_t h);

// Streaming XXH3-128: Digest() of the concatenated Update()s equals
// Xxh3_128() of the whole input. Not thread-safe; movable, not copyable.
class Xxh3Hasher128 {
 public:
  explicit Xxh3Hasher128(uint64_t seed = 0);
  ~Xxh3Hasher128();
  Xxh3Hasher128(Xxh3Hasher128&&) noexcept;
  Xxh3Hasher128& operator=(Xxh3Hasher128&&) noexcept;

  void Update(const void* data, size_t size);
  void Update(std::string_view s) { Update(s.data(), s.size()); }
  // Hashes the value's bytes in little-endian order (machine independent).
  void UpdateU64(uint64_t v);
  Hash128 Digest() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace agentkv
