#include "engine/grammar/token_vocabulary.h"

#include <algorithm>
#include <numeric>

namespace agentkv::grammar {

int32_t PlainJsonChars(const std::string& s) {
  int32_t chars = 0;
  size_t i = 0;
  const size_t n = s.size();
  while (i < n) {
    const auto b = static_cast<uint8_t>(s[i]);
    if (b < 0x80) {
      if (b < 0x20 || b == '"' || b == '\\') return -1;
      ++i;
    } else {
      // RFC 3629: the second byte's range depends on the first.
      uint8_t lo = 0x80, hi = 0xBF;
      size_t len;
      if (b >= 0xC2 && b <= 0xDF) {
        len = 2;
      } else if (b >= 0xE0 && b <= 0xEF) {
        len = 3;
        if (b == 0xE0) lo = 0xA0;
        if (b == 0xED) hi = 0x9F;
      } else if (b >= 0xF0 && b <= 0xF4) {
        len = 4;
        if (b == 0xF0) lo = 0x90;
        if (b == 0xF4) hi = 0x8F;
      } else {
        return -1;
      }
      if (i + len > n) return -1;
      const auto b1 = static_cast<uint8_t>(s[i + 1]);
      if (b1 < lo || b1 > hi) return -1;
      for (size_t k = 2; k < len; ++k) {
        const auto c = static_cast<uint8_t>(s[i + k]);
        if (c < 0x80 || c > 0xBF) return -1;
      }
      i += len;
    }
    ++chars;
  }
  return chars;
}

TokenVocabulary::Trie TokenVocabulary::BuildTrie(const std::vector<std::string>& tokens,
                                                 const std::vector<int32_t>& ids_in) {
  std::vector<int32_t> ids = ids_in;
  std::sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) {
    const std::string& x = tokens[static_cast<size_t>(a)];
    const std::string& y = tokens[static_cast<size_t>(b)];
    return x != y ? x < y : a < b;
  });
  Trie t;
  // Preorder construction from the sorted list: a path stack of open nodes.
  t.byte.push_back(0);
  t.depth.push_back(0);
  t.subtree_end.push_back(0);
  std::vector<std::vector<int32_t>> ends(1);
  std::vector<int32_t> path{0};  // node at each depth of the current token
  std::string prev;
  for (int32_t id : ids) {
    const std::string& s = tokens[static_cast<size_t>(id)];
    size_t common = 0;
    while (common < s.size() && common < prev.size() && s[common] == prev[common]) ++common;
    // Close nodes deeper than the common prefix.
    while (path.size() > common + 1) {
      t.subtree_end[static_cast<size_t>(path.back())] = static_cast<int32_t>(t.byte.size());
      path.pop_back();
    }
    for (size_t d = common; d < s.size(); ++d) {
      t.byte.push_back(static_cast<uint8_t>(s[d]));
      t.depth.push_back(static_cast<int32_t>(d + 1));
      t.subtree_end.push_back(0);
      ends.emplace_back();
      path.push_back(static_cast<int32_t>(t.byte.size() - 1));
    }
    ends[static_cast<size_t>(path.back())].push_back(id);
    t.max_depth = std::max(t.max_depth, static_cast<int32_t>(s.size()));
    prev = s;
  }
  while (!path.empty()) {
    t.subtree_end[static_cast<size_t>(path.back())] = static_cast<int32_t>(t.byte.size());
    path.pop_back();
  }
  t.token_begin.reserve(ends.size() + 1);
  for (const auto& e : ends) {
    t.token_begin.push_back(static_cast<int32_t>(t.token_ids.size()));
    t.token_ids.insert(t.token_ids.end(), e.begin(), e.end());
  }
  t.token_begin.push_back(static_cast<int32_t>(t.token_ids.size()));
  return t;
}

void TokenVocabulary::Init(std::vector<std::string> tokens, int32_t vocab_size) {
  vocab_size_ = vocab_size;
  tokens.resize(static_cast<size_t>(vocab_size));
  bytes_ = std::move(tokens);
  plain_chars_.assign(static_cast<size_t>(vocab_size), -1);
  plain_mask_.assign((static_cast<size_t>(vocab_size) + 63) / 64, 0);
  std::vector<int32_t> all, non_plain;
  for (int32_t id = 0; id < vocab_size; ++id) {
    const std::string& s = bytes_[static_cast<size_t>(id)];
    if (s.empty()) continue;
    all.push_back(id);
    const int32_t c = PlainJsonChars(s);
    plain_chars_[static_cast<size_t>(id)] = c;
    if (c < 0) {
      non_plain.push_back(id);
    } else {
      plain_by_chars_.push_back(id);
      plain_mask_[static_cast<size_t>(id) / 64] |= uint64_t{1} << (id % 64);
    }
  }
  std::stable_sort(plain_by_chars_.begin(), plain_by_chars_.end(), [&](int32_t a, int32_t b) {
    return plain_chars_[static_cast<size_t>(a)] < plain_chars_[static_cast<size_t>(b)];
  });
  all_ = BuildTrie(bytes_, all);
  non_plain_ = BuildTrie(bytes_, non_plain);
}

std::shared_ptr<const TokenVocabulary> TokenVocabulary::Build(const text::Tokenizer& tok,
                                                              int32_t vocab_size) {
  std::vector<std::string> tokens(static_cast<size_t>(vocab_size));
  const int32_t n = std::min(vocab_size, tok.vocab_size());
  for (int32_t id = 0; id < n; ++id) {
    if (tok.IsSpecial(id)) continue;
    if (auto b = tok.TokenBytes(id)) tokens[static_cast<size_t>(id)] = std::move(*b);
  }
  auto v = std::make_shared<TokenVocabulary>();
  v->Init(std::move(tokens), vocab_size);
  return v;
}

std::shared_ptr<const TokenVocabulary> TokenVocabulary::FromTokens(
    const std::vector<std::string>& tokens) {
  auto v = std::make_shared<TokenVocabulary>();
  v->Init(tokens, static_cast<int32_t>(tokens.size()));
  return v;
}

}  // namespace agentkv::grammar
