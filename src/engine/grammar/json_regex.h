// EmitJsonRegex: a JSON schema `pattern` as grammar nodes that read the
// body of a JSON string (between the quotes) whose text matches it.
//
// Supported regex subset (ECMA-262 syntax, as JSON Schema uses):
//   literal characters (any UTF-8), `.` (any character but a newline),
//   classes `[abc]`, `[a-z]`, `[^...]` with ASCII members and ranges,
//   escapes \d \w \s \D \W \S, \t \n \r \f \v, escaped metacharacters (\. \\ \[ ...),
//   \uXXXX for ASCII, groups `(...)` and `(?:...)`, alternation `|`,
//   quantifiers * + ? {n} {n,} {n,m} (lazy forms accepted: they match the
//   same strings), `^` only at the start and `$` only at the end.
// As JSON Schema says, a pattern without `^` (or `$`) is not anchored: any
// characters may come before (after) the match. Non-ASCII members inside a
// class other than a negated one, backreferences, lookarounds and other
// anchors are InvalidArgument naming "pattern".
// Bounds: the pattern is at most kMaxPatternBytes, every count at most
// kMaxRepeat; the grammar's node limit bounds the rest.
#pragma once

#include <cstdint>
#include <string_view>

#include "engine/grammar/grammar.h"
#include "util/status.h"

namespace agentkv::grammar {

inline constexpr size_t kMaxPatternBytes = 1024;
inline constexpr int32_t kMaxRepeat = 1000;

Status EmitJsonRegex(GrammarBuilder& b, std::string_view pattern, int32_t from, int32_t to);

}  // namespace agentkv::grammar
