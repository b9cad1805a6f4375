// Host memory the kernel says is available for new allocations (the
// MemAvailable line of /proc/meminfo): what memory defaults are sized from on
// the CPU (the KV pool) and for pinned host buffers (the host KV tier).
//
// Thread-safety: pure functions, callable from any thread.
#pragma once

#include <cstdint>
#include <string_view>

#include "util/status.h"

namespace agentkv {

// MemAvailable of /proc/meminfo text, in bytes. NotFound when the line is
// missing, InvalidArgument when it does not parse.
Result<uint64_t> ParseMemAvailable(std::string_view meminfo);

// MemAvailable of this machine, in bytes (reads /proc/meminfo).
Result<uint64_t> AvailableHostMemoryBytes();

}  // namespace agentkv
