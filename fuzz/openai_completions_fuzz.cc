// Fuzzes POST /v1/completions: the request body, parsed into a turn through
// ApiService (guards, depth limit, routing, the protocol adapter, agent
// identification, template rendering, tokenizing). Any 5xx or sanitizer
// report is a finding.
#include <cstddef>
#include <cstdint>
#include <string>

#include "api_fuzz_service.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  agentkv::fuzz::FuzzPost("/v1/completions",
                          std::string(reinterpret_cast<const char*>(data), size));
  return 0;
}
