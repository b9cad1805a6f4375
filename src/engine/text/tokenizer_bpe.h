// The BPE model of a tokenizer.json: vocabulary, merges by rank, byte
// fallback, unknown token. Merging follows transformers.js exactly: the
// lowest-ranked adjacent pair merges first, ties go to the leftmost pair, a
// merge's result need not be in the vocabulary, and a duplicated merge keeps
// its last rank.
//
// Thread-safety: immutable after Build; EncodeWord may run concurrently (its
// word cache is thread_local, keyed by model instance).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "util/status.h"

namespace agentkv::text {

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const;
};
using TokenMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

class BpeModel {
 public:
  struct AddedToken {
    std::string content;
    int32_t id;
  };
  // `model` is tokenizer.json's "model" object; added tokens join the
  // string->id map (overriding the vocabulary, as transformers.js does).
  static Result<std::unique_ptr<BpeModel>> Build(const nlohmann::json& model,
                                                 const std::vector<AddedToken>& added);

  // Appends the ids of one pre-token. `byte_level`: `word` is raw bytes to be
  // mapped through GPT-2's byte table; otherwise `word` is UTF-8 text whose
  // code points are the initial symbols.
  void EncodeWord(std::string_view word, bool byte_level, std::vector<int32_t>* out) const;

  // Collapses runs of the unknown id (fuse_unk), in place from `from` on.
  void FuseUnknown(std::vector<int32_t>* ids, size_t from) const;

  const TokenMap& token_to_id() const { return token_to_id_; }
  const std::vector<std::string>& id_to_token() const { return id_to_token_; }
  std::optional<int32_t> unk_id() const { return unk_id_; }

  ~BpeModel();

 private:
  BpeModel();
  struct MergeTable;

  int32_t SymbolOf(std::string_view s) const;  // -1 if not a known symbol
  int32_t InternSymbol(const std::string& s);
  void MergeSymbols(std::vector<int32_t>* syms, std::vector<uint32_t>* starts) const;
  void EmitSymbols(std::string_view word, bool byte_level, const std::vector<int32_t>& syms,
                   const std::vector<uint32_t>& starts, std::vector<int32_t>* out) const;
  void EncodeUncached(std::string_view word, bool byte_level, std::vector<int32_t>* out) const;

  TokenMap token_to_id_;
  std::vector<std::string> id_to_token_;
  // Strings that occur in merges but are not tokens; their symbol ids follow
  // the token ids.
  TokenMap extra_symbols_;
  std::vector<std::string> extra_strings_;
  int32_t num_ids_ = 0;
  std::unique_ptr<MergeTable> merges_;
  int32_t byte_symbol_[256];   // byte-level initial symbols
  int32_t ascii_symbol_[128];  // code point initial symbols, fast path
  std::unordered_map<char32_t, int32_t> code_point_symbol_;
  int32_t byte_fallback_id_[256];  // <0xNN> token ids, -1 if absent
  bool byte_fallback_ = false;
  bool ignore_merges_ = false;
  bool fuse_unk_ = false;
  std::optional<int32_t> unk_id_;
  uint64_t instance_id_;
};

}  // namespace agentkv::text
