// UniqueSeed: 64-bit values that differ between calls and between
// processes, for identifiers clients must not see repeat (tool-call ids):
// a random base drawn once per process, plus a counter, mixed so that
// consecutive values share no visible digits. Not for cryptography.
//
// Thread-safe.
#pragma once

#include <cstdint>

namespace agentkv {

uint64_t UniqueSeed();

}  // namespace agentkv
