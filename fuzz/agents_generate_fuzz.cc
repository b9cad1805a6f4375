// Fuzzes POST /v1/agents/{id}/generate through ApiService. The input is the
// agent id, a newline, then the request body, so ids (length, bytes,
// escapes) are fuzzed along with the body. Any 5xx or sanitizer report is a
// finding.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "api_fuzz_service.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view in(reinterpret_cast<const char*>(data), size);
  const size_t nl = in.find('\n');
  std::string_view id = nl == std::string_view::npos ? std::string_view("fuzz") : in.substr(0, nl);
  std::string_view body = nl == std::string_view::npos ? in : in.substr(nl + 1);
  agentkv::fuzz::FuzzPost("/v1/agents/" + std::string(id) + "/generate", std::string(body));
  return 0;
}
