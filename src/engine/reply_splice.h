// SpliceReplyTokens: the prompt of an agent's next turn, reusing the token
// ids of its previous turn (that turn's prompt and the reply the engine
// generated) wherever the newly rendered prompt text agrees with them.
//
// Why: a client sends back the assistant message the server generated, the
// chat template renders it into text again and tokenizing that text can give
// other ids than the ones sampled (a sampled sequence is rarely the
// tokenizer's canonical one). The prefix cache is addressed by ids, so those
// other ids would miss from the reply onwards and the turn would recompute
// the reply and everything after it.
//
// The decision: walk the previous ids while their exact bytes
// (Tokenizer::TokenBytes, special tokens included), as the server sent them
// (decoded to UTF-8, an invalid sequence as U+FFFD: what a random or
// unlucky sample produces and the client sends back), continue the rendered
// text; the reused prefix ends after the last id that agreed whole, so it
// always ends on a token boundary and decodes to exactly the text's prefix. Added tokens
// (<|im_start|>, <think>: what the template writes as control markers) must line up id for id with
// the text's normal tokenization: ordinary ids that merely spell "<|im_end|>" never stand in for
// the marker, and reuse stops before such a place (where a normalizer rewrote text, e.g. NFC, the
// normal ids are placed again at the next added token, which Encode splits out of the raw text).
// The rest of the text comes from its normal tokenization: the tail of `text_ids` when those ids
// have a boundary at the same byte (always the case at a special token such as <|im_end|>, which
// ends every reply), else the rest of the text encoded on its own, from a UTF-8 character boundary.
// Where the render differs from what the agent held (a template that drops
// earlier turns' reasoning, a reply the client edited, a stop string cut off
// the reply), reuse stops at that divergence. Any id sequence is safe for
// the KV cache (it is keyed by ids); the point is that the prompt stands for
// exactly the rendered text.
//
// Pure: no state; call from any thread.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace agentkv::engine {

// The exact bytes of a token id, or nullopt when unknown.
using TokenBytesFn = std::function<std::optional<std::string>(int32_t)>;
// Whether an id is an added token (Tokenizer::IsAdded).
using IsAddedFn = std::function<bool(int32_t)>;
// The normal tokenization of a piece of text (no BOS / EOS added).
using EncodeTextFn = std::function<std::vector<int32_t>(std::string_view)>;

struct ReplySplice {
  std::vector<int32_t> ids;  // the prompt
  size_t reused_tokens = 0;  // leading ids taken from `previous`
  size_t reused_bytes = 0;   // bytes of the text they stand for
};

// `previous`: the agent's last known ids (prompt + generated, or a prefix
// of them, e.g. the stored chain after a restart; may be empty or longer
// than the text). `text`: the rendered prompt. `text_ids`: its normal
// tokenization (returned unchanged when nothing can be reused). `encode` is
// called at most once, only when `text_ids` has no token boundary where the
// reused prefix ends.
ReplySplice SpliceReplyTokens(std::span<const int32_t> previous, const TokenBytesFn& token_bytes,
                              const IsAddedFn& is_added, std::string_view text,
                              std::span<const int32_t> text_ids, const EncodeTextFn& encode);

}  // namespace agentkv::engine
