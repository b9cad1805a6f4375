#include "engine/reply_splice.h"

#include <algorithm>

#include "engine/text/tokenizer_unicode.h"

namespace agentkv::engine {

namespace {

// Whether `bytes` ends inside a UTF-8 sequence that the next bytes could
// still complete: a decoder streaming them waits, where one at the end of
// the text would emit U+FFFD.
bool EndsInsideSequence(std::string_view bytes) {
  const size_t n = bytes.size();
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const auto b = static_cast<unsigned char>(bytes[n - back]);
    if ((b & 0xC0) == 0x80) continue;  // a continuation byte: look further back
    size_t len = 0;
    unsigned char lower = 0x80, upper = 0xBF;
    if (b >= 0xC2 && b <= 0xDF) {
      len = 2;
    } else if (b >= 0xE0 && b <= 0xEF) {
      len = 3;
      if (b == 0xE0) lower = 0xA0;
      if (b == 0xED) upper = 0x9F;
    } else if (b >= 0xF0 && b <= 0xF4) {
      len = 4;
      if (b == 0xF0) lower = 0x90;
      if (b == 0xF4) upper = 0x8F;
    }
    if (len <= back) return false;  // ASCII, invalid, or a complete sequence
    // The bytes after the lead must be valid continuations so far.
    for (size_t k = 1; k < back; ++k) {
      const auto c = static_cast<unsigned char>(bytes[n - back + k]);
      if (c < (k == 1 ? lower : 0x80) || c > (k == 1 ? upper : 0xBF)) return false;
    }
    return true;
  }
  return false;
}

// Where the leading ids of `ids` that continue `text` end: (ids, byte
// offset) pairs, ascending, starting with (0, 0). Ids are compared as the
// server sent them: their bytes decoded to UTF-8 with each invalid sequence
// replaced by U+FFFD (SanitizeUtf8, as the stream detokenizer does), so a
// reply whose sampled bytes were not valid UTF-8 agrees with the text the
// client got and sends back. A run of ids ending inside a character has no
// boundary of its own: the run is compared once it is complete. Stops at an
// id whose bytes are unknown, empty (nothing to anchor it to the text) or
// do not continue the text, and once `stop_at` bytes are covered.
std::vector<std::pair<size_t, size_t>> AgreeingOffsets(std::span<const int32_t> ids,
                                                       const TokenBytesFn& token_bytes,
                                                       std::string_view text, size_t stop_at) {
  std::vector<std::pair<size_t, size_t>> at{{0, 0}};
  size_t covered = 0;
  std::string pending;  // bytes of the ids since the last boundary
  for (size_t n = 0; n < ids.size() && covered < stop_at; ++n) {
    std::optional<std::string> b = token_bytes(ids[n]);
    if (!b || b->empty()) break;
    pending += *b;
    if (EndsInsideSequence(pending)) {
      if (pending.size() > 16) break;  // no character is that long
      continue;
    }
    const std::string sent = text::tokenizer_unicode::IsValidUtf8(pending)
                                 ? pending
                                 : text::tokenizer_unicode::SanitizeUtf8(pending);
    if (text.substr(covered, sent.size()) != sent) break;
    covered += sent.size();
    at.push_back({n + 1, covered});
    pending.clear();
  }
  return at;
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
  const std::vector<std::pair<size_t, size_t>> prev_at =
      AgreeingOffsets(previous, token_bytes, text, text.size());
  auto by_offset = [](const std::pair<size_t, size_t>& p, size_t x) { return p.second < x; };
  // Bytes the previous ids may cover.
  size_t limit = prev_at.back().second;
  if (limit > 0) {
    const NormalLayout norm = LayOut(text_ids, token_bytes, is_added, text, limit);
    limit = std::min(limit, norm.known_until);
    // Every added token of the text must be the same id in the previous
    // ids. (The converse follows: an added id of the previous ids whose
    // bytes agree with the text lies on or across an added token that
    // Encode split out of the text, and that one is checked here.)
    for (const auto& [at, id] : norm.added) {
      if (at >= limit) break;
      auto it = std::lower_bound(prev_at.begin(), prev_at.end(), at, by_offset);
      // An id of its own, boundaries on both sides, the same as the text's.
      if (it == prev_at.end() || it->second != at || it + 1 == prev_at.end() ||
          (it + 1)->first != it->first + 1 || previous[it->first] != id) {
        limit = at;
        break;
      }
    }
    // The longest reusable prefix ending where the rest can be tokenized:
    // the text's end, a boundary of the normal tokenization, or a character
    // boundary to encode from.
    ptrdiff_t j = std::upper_bound(prev_at.begin(), prev_at.end(), limit,
                                   [](size_t x, const auto& p) { return x < p.second; }) -
                  prev_at.begin() - 1;
    for (; j > 0; --j) {
      const auto [r, at] = prev_at[static_cast<size_t>(j)];
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
      out.reused_tokens = r;
      out.reused_bytes = at;
      out.ids.assign(previous.begin(), previous.begin() + static_cast<ptrdiff_t>(r));
      out.ids.insert(out.ids.end(), tail.begin(), tail.end());
      return out;
    }
  }
  out.ids.assign(text_ids.begin(), text_ids.end());
  return out;
}

}  // namespace agentkv::engine
