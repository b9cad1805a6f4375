// API key comparison that takes the same time whatever the keys share: both
// sides are hashed (SHA-256) and the digests compared with OpenSSL's
// constant-time memcmp, so neither a common prefix nor the key's length
// shows in the response time.
//
// Thread-safety: pure functions.
#pragma once

#include <string_view>

namespace agentkv::api {

bool KeysEqual(std::string_view given, std::string_view expected);

// The key a request presents: `x-api-key`, else `Authorization: Bearer K`
// (scheme case-insensitive). Empty when neither is there.
std::string_view PresentedKey(std::string_view x_api_key, std::string_view authorization);

}  // namespace agentkv::api
