#include "store/fingerprint.h"

namespace agentkv::store {
namespace {

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

Result<ModelFingerprint> ModelFingerprint::FromHex(std::string_view hex) {
  if (hex.size() != 32) {
    return InvalidArgument("model fingerprint must be 32 hex digits, got " +
                           std::to_string(hex.size()) + " characters");
  }
  ModelFingerprint fp;
  for (size_t i = 0; i < 16; ++i) {
    const int a = HexValue(hex[2 * i]);
    const int b = HexValue(hex[2 * i + 1]);
    if (a < 0 || b < 0) return InvalidArgument("model fingerprint is not hex: " + std::string(hex));
    fp.bytes[i] = static_cast<uint8_t>(a * 16 + b);
  }
  return fp;
}

std::string ModelFingerprint::Hex() const {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out(32, '0');
  for (size_t i = 0; i < 16; ++i) {
    out[2 * i] = kDigits[bytes[i] >> 4];
    out[2 * i + 1] = kDigits[bytes[i] & 15];
  }
  return out;
}

}  // namespace agentkv::store
