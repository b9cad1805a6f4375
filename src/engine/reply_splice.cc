#include "engine/reply_splice.h"

#include <algorithm>

namespace agentkv {

namespace {

// Byte offsets after each leading id of `ids` that continues `text` whole:
// offsets[0] == 0, offsets[i] is where id i-1 ends. Stops at the first id
// whose bytes are unknown, empty (nothing to anchor it to the text) or do
// not continue the text, and once `stop_at` bytes are covered.
std::vector<size_t> AgreeingOffsets(std::span<const int32_t> ids, const TokenBytesFn& token_bytes,
                                    std::string_view text, size_t stop_at) {
  std::vector<size_t> offsets{0};
  size_t covered = 0;
  for (size_t n = 0; n < ids.size() && covered < stop_at; ++n) {
    std::optional<std::string> b = token_bytes(ids[n]);
    if (!b || b->empty() || text.substr(covered, b->size()) != *b) break;
    covered += b->size();
    offsets.push_back(covered);
  }
  return offsets;
}

// Where the normal tokenization's ids sit in the text, up to `stop_at`.
// Ordinary ids reproduce their text unless the normalizer rewrote it (NFC);
// Encode splits added tokens out of the raw text before normalizing, so an
// added id always sits where its text is: after a rewritten stretch the walk
// finds its place again at the next added id.
struct NormalLayout {
  std::vector<std::pair<size_t, size_t>> boundaries;  // (ids before, byte offset), ascending
  std::vector<std::pair<size_t, int32_t>> added;      // (byte offset, id) of added tokens
  size_t known_until = 0;                             // bytes whose added tokens are all listed
};

NormalLayout LayOut(std::span<const int32_t> ids, const TokenBytesFn& token_bytes,
                    const IsAddedFn& is_added, std::string_view text, size_t stop_at) {
  NormalLayout l;
  l.boundaries.push_back({0, 0});
  size_t n = 0, at = 0;
  while (n < ids.size() && at < stop_at) {
    std::optional<std::string> b = token_bytes(ids[n]);
    if (b && !b->empty() && text.substr(at, b->size()) == *b) {
      if (is_added(ids[n])) l.added.push_back({at, ids[n]});
      at += b->size();
      l.boundaries.push_back({++n, at});
      continue;
    }
    // A rewritten stretch: resume at the next added id, where its text is.
    size_t next = n;
    while (next < ids.size() && !is_added(ids[next])) ++next;
    if (next == ids.size()) {  // no added token in the rest of the text
      l.known_until = text.size();
      return l;
    }
    b = token_bytes(ids[next]);
    const size_t found = b && !b->empty() ? text.find(*b, at) : std::string_view::npos;
    if (found == std::string_view::npos) {
      l.known_until = at;
      return l;
    }
    n = next;
    at = found;
    l.boundaries.push_back({n, at});
  }
  l.known_until = n == ids.size() ? text.size() : at;
  return l;
}

bool IsUtf8Continuation(char c) { return (static_cast<unsigned char>(c) & 0xC0) == 0x80; }

}  // namespace

ReplySplice SpliceReplyTokens(std::span<const int32_t> previous, const TokenBytesFn& token_bytes,
                              const IsAddedFn& is_added, std::string_view text,
                              std::span<const int32_t> text_ids, const EncodeTextFn& encode) {
  ReplySplice out;
  const std::vector<size_t> prev_at = AgreeingOffsets(previous, token_bytes, text, text.size());
  // Bytes the previous ids may cover.
  size_t limit = prev_at.back();
  if (limit > 0) {
    const NormalLayout norm = LayOut(text_ids, token_bytes, is_added, text, limit);
    limit = std::min(limit, norm.known_until);
    // Every added token of the text must be the same id in the previous
    // ids. (The converse follows: an added id of the previous ids whose
    // bytes agree with the text lies on or across an added token that
    // Encode split out of the text, and that one is checked here.)
    for (const auto& [at, id] : norm.added) {
      if (at >= limit) break;
      auto it = std::lower_bound(prev_at.begin(), prev_at.end(), at);
      const size_t i = static_cast<size_t>(it - prev_at.begin());
      if (it == prev_at.end() || *it != at || i + 1 >= prev_at.size() || previous[i] != id) {
        limit = at;
        break;
      }
    }
    // The longest reusable prefix ending where the rest can be tokenized:
    // the text's end, a boundary of the normal tokenization, or a character
    // boundary to encode from.
    ptrdiff_t r = std::upper_bound(prev_at.begin(), prev_at.end(), limit) - prev_at.begin() - 1;
    for (; r > 0; --r) {
      const size_t at = prev_at[r];
      std::vector<int32_t> tail;
      if (at < text.size()) {
        auto j = std::lower_bound(norm.boundaries.begin(), norm.boundaries.end(), at,
                                  [](const auto& b, size_t x) { return b.second < x; });
        if (j != norm.boundaries.end() && j->second == at) {
          tail.assign(text_ids.begin() + static_cast<ptrdiff_t>(j->first), text_ids.end());
        } else if (!IsUtf8Continuation(text[at])) {
          tail = encode(text.substr(at));
        } else {
          continue;  // the text's rest would start inside a character
        }
      }
      out.reused_tokens = static_cast<size_t>(r);
      out.reused_bytes = at;
      out.ids.assign(previous.begin(), previous.begin() + r);
      out.ids.insert(out.ids.end(), tail.begin(), tail.end());
      return out;
    }
  }
  out.ids.assign(text_ids.begin(), text_ids.end());
  return out;
}

}  // namespace agentkv
