// TextWithout: a grammar fragment for any text in which a marker does not
// occur (free text before a tool-call marker, reasoning before its closing
// tag).
//
// Thread-safety: as GrammarBuilder (not thread-safe).
#pragma once

#include <cstdint>
#include <string_view>

#include "engine/grammar/grammar.h"

namespace agentkv::grammar {

// Adds, from `from`, any text in which `marker` (non-empty) does not
// occur: a KMP automaton over bytes whose state is the length of the
// marker prefix just read; completing the marker has no edge. Every state
// may end the text (an epsilon edge to `to`). With `reasoning`, the
// automaton's nodes are reasoning nodes (GrammarNode::reasoning), so a
// matcher whose reasoning budget is spent leaves the text at once (only
// what follows `to` remains).
void TextWithout(GrammarBuilder& b, std::string_view marker, int32_t from, int32_t to,
                 bool reasoning = false);

}  // namespace agentkv::grammar
