#include "store/record_envelope.h"

#include <cstring>

#include "util/hash.h"

namespace agentkv::store {
namespace {

uint64_t LoadU64(const char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}
void StoreU64(char* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<char>(v >> (8 * i));
}

void WriteHeader(RecordType type, std::string_view payload, char* h) {
  h[0] = 'A';
  h[1] = 'K';
  h[2] = static_cast<char>(type);
  h[3] = static_cast<char>(CurrentVersion(type));
  const uint32_t n = static_cast<uint32_t>(payload.size());
  for (int i = 0; i < 4; ++i) h[4 + i] = static_cast<char>(n >> (8 * i));
  StoreU64(h + 8, Xxh3_64(payload.data(), payload.size(), LoadU64(h)));
}

}  // namespace

uint8_t CurrentVersion(RecordType) { return 1; }

std::string EnvelopeHeader(RecordType type, std::string_view payload) {
  std::string h(kEnvelopeSize, '\0');
  WriteHeader(type, payload, h.data());
  return h;
}

void SealRecord(RecordType type, std::string_view payload, std::string* out) {
  const size_t at = out->size();
  out->resize(at + kEnvelopeSize);
  WriteHeader(type, payload, out->data() + at);
  out->append(payload);
}

std::string SealRecord(RecordType type, std::string_view payload) {
  std::string out;
  out.reserve(kEnvelopeSize + payload.size());
  SealRecord(type, payload, &out);
  return out;
}

Result<OpenedRecord> OpenRecord(RecordType expected, std::string_view value,
                                std::string_view where) {
  auto bad = [&](const std::string& why) { return Corruption(std::string(where) + ": " + why); };
  if (value.size() < kEnvelopeSize) {
    return bad("record is " + std::to_string(value.size()) + " bytes, shorter than its header");
  }
  const char* h = value.data();
  if (h[0] != 'A' || h[1] != 'K') return bad("bad magic");
  if (static_cast<uint8_t>(h[2]) != static_cast<uint8_t>(expected)) {
    return bad("record type " + std::to_string(static_cast<uint8_t>(h[2])) + ", expected " +
               std::to_string(static_cast<int>(expected)));
  }
  const uint8_t version = static_cast<uint8_t>(h[3]);
  if (version == 0 || version > CurrentVersion(expected)) {
    return bad("unknown record version " + std::to_string(version));
  }
  uint32_t n = 0;
  for (int i = 3; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(h[4 + i]);
  if (value.size() - kEnvelopeSize != n) {
    return bad("payload is " + std::to_string(value.size() - kEnvelopeSize) +
               " bytes, header says " + std::to_string(n));
  }
  std::string_view payload = value.substr(kEnvelopeSize);
  if (Xxh3_64(payload.data(), payload.size(), LoadU64(h)) != LoadU64(h + 8)) {
    return bad("checksum mismatch");
  }
  return OpenedRecord{version, payload};
}

}  // namespace agentkv::store
