// JSON nesting depth of a request body, measured on the raw bytes before
// anything parses, copies or prints it.
//
// Why before parsing: nlohmann's parser is iterative, but dump(), copies and
// the template engine's conversion of a value recurse once per level, so a
// 200 KB body nested 100,000 deep overflows an io thread's stack. Refusing
// such bodies up front bounds every later recursion by the limit.
//
// Thread-safety: pure function.
#pragma once

#include <string_view>

namespace agentkv::api {

// The deepest nesting of arrays and objects in `text` (0 for a scalar, 1 for
// "[]" or "{}"), counting brackets outside strings (escapes honoured). Stops
// scanning as soon as the depth passes `stop_above` and returns that depth.
// Works on malformed text too (the parser reports those errors later).
int JsonNestingDepth(std::string_view text, int stop_above);

}  // namespace agentkv::api
