// TokenVocabulary: the tokenizer's tokens as bytes, arranged for computing
// grammar masks; built once per tokenizer and shared by every grammar.
//
// Tokens are the bytes Tokenizer::TokenBytes gives (byte-level BPE and
// byte-fallback bytes raw, added tokens verbatim); special tokens, holes and
// empty tokens are left out (a grammar never allows them). The trie is kept
// in preorder: node i's subtree is [i, subtree_end[i]), so a walk skips a
// dead prefix's whole subtree in one step.
//
// "Plain" tokens are those made only of characters a JSON string takes
// unescaped (bytes >= 0x20 except '"' and '\\', in complete, valid UTF-8
// sequences); plain_chars[id] is their character count (-1 for others). A
// second trie holds only the other tokens.
//
// Thread-safety: immutable after Build; share freely.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/text/tokenizer.h"

namespace agentkv::grammar {

class TokenVocabulary {
 public:
  struct Trie {
    // Per node, preorder; node 0 is the root (no byte).
    std::vector<uint8_t> byte;
    std::vector<int32_t> depth;
    std::vector<int32_t> subtree_end;
    // Tokens ending at node i: token_ids[token_begin[i] .. token_begin[i+1]).
    std::vector<int32_t> token_begin;
    std::vector<int32_t> token_ids;
    int32_t max_depth = 0;
  };

  // `vocab_size`: the mask length (the model's vocabulary, which may exceed
  // the tokenizer's); ids at or past it are left out.
  static std::shared_ptr<const TokenVocabulary> Build(const text::Tokenizer& tok,
                                                      int32_t vocab_size);
  // From explicit token bytes (index = id; empty = left out). For tests.
  static std::shared_ptr<const TokenVocabulary> FromTokens(const std::vector<std::string>& tokens);

  int32_t vocab_size() const { return vocab_size_; }
  const Trie& all() const { return all_; }
  const Trie& non_plain() const { return non_plain_; }
  const std::vector<int32_t>& plain_chars() const { return plain_chars_; }
  // Plain token ids sorted by character count, ascending.
  const std::vector<int32_t>& plain_by_chars() const { return plain_by_chars_; }
  // Bitset (vocab_size bits) of every plain token.
  const std::vector<uint64_t>& plain_mask() const { return plain_mask_; }
  const std::string& bytes(int32_t id) const { return bytes_[static_cast<size_t>(id)]; }
  bool has(int32_t id) const {
    return id >= 0 && id < vocab_size_ && !bytes_[static_cast<size_t>(id)].empty();
  }

 private:
  void Init(std::vector<std::string> tokens, int32_t vocab_size);
  static Trie BuildTrie(const std::vector<std::string>& tokens, const std::vector<int32_t>& ids);

  int32_t vocab_size_ = 0;
  std::vector<std::string> bytes_;
  Trie all_, non_plain_;
  std::vector<int32_t> plain_chars_;
  std::vector<int32_t> plain_by_chars_;
  std::vector<uint64_t> plain_mask_;
};

// Characters of `s` if it is plain (see above), else -1. Pure.
int32_t PlainJsonChars(const std::string& s);

}  // namespace agentkv::grammar
