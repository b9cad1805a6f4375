// Fixed-width little-endian integers for the store's on-disk records
// (docs/store-format.md): every multi-byte field is little-endian, whatever
// the host.
#pragma once

#include <cstdint>
#include <string>

namespace agentkv::store {

inline void PutU32(char* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<char>(v >> (8 * i));
}
inline void PutU64(char* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<char>(v >> (8 * i));
}
inline void PutU32(std::string* s, uint32_t v) {
  char b[4];
  PutU32(b, v);
  s->append(b, 4);
}
inline void PutU64(std::string* s, uint64_t v) {
  char b[8];
  PutU64(b, v);
  s->append(b, 8);
}
inline uint32_t GetU32(const char* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}
inline uint64_t GetU64(const char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}

}  // namespace agentkv::store
