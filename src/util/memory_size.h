// Memory sizes as flags give them: a byte count with an optional K/M/G/T
// suffix (powers of 1024: "256M", "40G", "1073741824"), or a share of what
// is available ("0.9": a number in (0, 1] without a suffix).
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "util/status.h"

namespace agentkv {

struct MemorySize {
  uint64_t bytes = 0;    // > 0 for a byte count
  double fraction = 0;   // in (0, 1] for a share
  bool is_zero = false;  // "0": off, where the flag allows it
};

// InvalidArgument naming `flag` for anything else (negative, unknown
// suffix, a share above 1, trailing text).
Result<MemorySize> ParseMemorySize(std::string_view text, std::string_view flag);

// "64.0 GiB", "512.0 MiB", "12 KiB", "100 B".
std::string FormatBytes(uint64_t bytes);

}  // namespace agentkv
