#include "api/api_key.h"

#include <openssl/crypto.h>
#include <openssl/sha.h>

#include <cctype>

namespace agentkv::api {

bool KeysEqual(std::string_view given, std::string_view expected) {
  unsigned char a[SHA256_DIGEST_LENGTH], b[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(given.data()), given.size(), a);
  SHA256(reinterpret_cast<const unsigned char*>(expected.data()), expected.size(), b);
  return CRYPTO_memcmp(a, b, sizeof(a)) == 0;
}

std::string_view PresentedKey(std::string_view x_api_key, std::string_view authorization) {
  if (!x_api_key.empty()) return x_api_key;
  constexpr std::string_view kBearer = "bearer ";
  if (authorization.size() <= kBearer.size()) return {};
  for (size_t i = 0; i < kBearer.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(authorization[i])) != kBearer[i]) return {};
  }
  return authorization.substr(kBearer.size());
}

}  // namespace agentkv::api
