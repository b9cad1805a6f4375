// ModelFingerprint: the 128-bit model identity every persisted KV record is
// tagged with. The caller computes it (config, tokenizer and weights
// identity) and hands it over as 32 hex digits; the store keeps 16 bytes.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include "util/status.h"

namespace agentkv::store {

struct ModelFingerprint {
  std::array<uint8_t, 16> bytes{};

  // Exactly 32 hex digits (either case); anything else is InvalidArgument.
  static Result<ModelFingerprint> FromHex(std::string_view hex);
  // 32 lowercase hex digits.
  std::string Hex() const;
  std::string_view AsKey() const {
    return {reinterpret_cast<const char*>(bytes.data()), bytes.size()};
  }
  bool operator==(const ModelFingerprint&) const = default;
};

}  // namespace agentkv::store
