// Byte-level pieces of JSON text for grammar builders: one string
// character, a run of UTF-8, sets of characters as their JSON encoding, and
// integer ranges as digit strings. Each adds nodes and edges reading its text
// from node `from` to node `to`. Not thread-safe (the builder is not).
#pragma once

#include <bitset>
#include <cstdint>

#include "engine/grammar/grammar.h"

namespace agentkv::grammar {

// One character inside a JSON string: a raw character (bytes >= 0x20 but
// '"' and '\\', valid UTF-8), or an escape (\" \\ \/ \b \f \n \r \t, \uXXXX
// without surrogates, so that every escape is one character).
void EmitJsonStringChar(GrammarBuilder& b, int32_t from, int32_t to);
// One valid multi-byte UTF-8 sequence (any non-ASCII code point).
void EmitUtf8NonAscii(GrammarBuilder& b, int32_t from, int32_t to);
// One character from `ascii` (code points 0..127), written as a JSON string
// writes it ('"', '\\' and control characters escaped), or, with
// `non_ascii`, any non-ASCII character.
void EmitJsonCharSet(GrammarBuilder& b, const std::bitset<128>& ascii, bool non_ascii, int32_t from,
                     int32_t to);
// A non-negative integer in [lo, hi] written in decimal without leading
// zeros. Requires 0 <= lo <= hi.
void EmitUintRange(GrammarBuilder& b, uint64_t lo, uint64_t hi, int32_t from, int32_t to);
// Zero or more [0-9] (a loop), or exactly `n` digits when n >= 0.
void EmitDigits(GrammarBuilder& b, int32_t n, int32_t from, int32_t to);

}  // namespace agentkv::grammar
