#include "engine/text/stream_detokenizer.h"

#include <string_view>

#include "engine/text/tokenizer.h"

namespace agentkv::text {

namespace {

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";

// Length of the tail of `text` that later tokens could still change.
size_t HeldBack(std::string_view text, bool clean_up) {
  size_t end = text.size();
  // Trailing U+FFFD may be an incomplete sequence that the next bytes
  // complete.
  while (end >= kReplacement.size() && text.substr(0, end).ends_with(kReplacement))
    end -= kReplacement.size();
  if (clean_up) {
    // Proper prefixes of clean_up_tokenization's patterns (" .", " n't",
    // " 've", ...): the next token could complete them and drop the space.
    static constexpr std::string_view kPrefixes[] = {" n'", " 'v", " 'r", " '", " n", " "};
    std::string_view head = text.substr(0, end);
    for (std::string_view p : kPrefixes) {
      if (head.ends_with(p)) {
        end -= p.size();
        break;
      }
    }
  }
  return text.size() - end;
}

}  // namespace

StreamDetokenizer::StreamDetokenizer(const Tokenizer& tokenizer, bool skip_special_tokens)
    : tok_(tokenizer), skip_special_(skip_special_tokens) {}

std::string StreamDetokenizer::Push(int32_t id) {
  window_.push_back(id);
  std::string text = tok_.DecodeFragment(window_, skip_special_, window_at_start_);
  size_t held = HeldBack(text, tok_.cleans_up_tokenization_spaces());
  size_t stable = text.size() - held;
  std::string piece;
  if (stable > emitted_) piece = text.substr(emitted_, stable - emitted_);
  if (stable > emitted_) emitted_ = stable;
  if (held == 0) {
    // Everything so far is final: decoding can restart after it, since no
    // later token can change text before this point.
    // The decoder's "first token" is the first one that survives
    // skip_special_tokens, so the next window starts the sequence only if
    // nothing has reached the decoder yet.
    for (int32_t w : window_) {
      if (!(skip_special_ && tok_.IsSpecial(w)) && !tok_.IdToToken(w).empty())
        window_at_start_ = false;
    }
    window_.clear();
    emitted_ = 0;
  }
  return piece;
}

std::string StreamDetokenizer::Flush() {
  std::string piece;
  if (!window_.empty()) {
    std::string text = tok_.DecodeFragment(window_, skip_special_, window_at_start_);
    if (text.size() > emitted_) piece = text.substr(emitted_);
    for (int32_t w : window_) {
      if (!(skip_special_ && tok_.IsSpecial(w)) && !tok_.IdToToken(w).empty())
        window_at_start_ = false;
    }
  }
  window_.clear();
  emitted_ = 0;
  return piece;
}

}  // namespace agentkv::text
