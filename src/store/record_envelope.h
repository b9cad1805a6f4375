// The envelope around every value the store writes (docs/store-format.md):
// magic, record type, format version, payload length and an XXH3-64
// checksum seeded with those header bytes. Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "util/status.h"

namespace agentkv::store {

enum class RecordType : uint8_t {
  kAgent = 1,
  kTurn = 2,
  kChainEntry = 3,
  kKvBlock = 4,
  kKvMeta = 5,
  kModel = 6,
  kStoreMeta = 7,
};

inline constexpr size_t kEnvelopeSize = 16;

// The newest version of `type` this build writes (and the newest it reads).
uint8_t CurrentVersion(RecordType type);

// Appends the envelope header for `payload` to `out`, then the payload.
void SealRecord(RecordType type, std::string_view payload, std::string* out);
std::string SealRecord(RecordType type, std::string_view payload);

// Header for a payload the caller appends itself; `checksum` covers the
// payload only in combination with the header (see the format doc).
std::string EnvelopeHeader(RecordType type, std::string_view payload);

struct OpenedRecord {
  uint8_t version = 0;
  std::string_view payload;  // points into the value
};

// Checks length, magic, type, version and checksum. `where` names the
// record (sub-database and key) in the Corruption message.
Result<OpenedRecord> OpenRecord(RecordType expected, std::string_view value,
                                std::string_view where);

}  // namespace agentkv::store
