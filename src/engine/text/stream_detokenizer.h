// Incremental detokenization for streaming generation: Push token ids one at
// a time and get back the text that became final. Pieces never end inside a
// UTF-8 sequence (incomplete byte-level / byte-fallback bytes are held back),
// and the concatenation of every Push plus the final Flush equals
// tokenizer.Decode(all ids, skip_special_tokens) exactly, including
// SentencePiece leading-space handling and clean_up_tokenization_spaces
// (text that a later token could still rewrite, such as a trailing " " before
// a possible ".", is held back too).
//
// Cost: each Push decodes only the ids since the last point where all text
// was final, usually one or two.
//
// Thread-safety: one instance per sequence, used by one thread at a time.
// The tokenizer must outlive it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace agentkv::text {

class Tokenizer;

class StreamDetokenizer {
 public:
  // skip_special_tokens defaults to true: streamed completions do not show
  // EOS / chat-template markers.
  explicit StreamDetokenizer(const Tokenizer& tokenizer, bool skip_special_tokens = true);

  // Returns the text made final by `id` (often empty while bytes are
  // pending).
  std::string Push(int32_t id);
  // Returns everything still held back (e.g. at the end of generation) and
  // starts a fresh window; later Pushes continue the same sequence.
  std::string Flush();

 private:
  const Tokenizer& tok_;
  bool skip_special_;
  std::vector<int32_t> window_;  // ids since the last fully final point
  bool window_at_start_ = true;  // the window begins the sequence
  size_t emitted_ = 0;           // bytes of the window's text already returned
};

}  // namespace agentkv::text
