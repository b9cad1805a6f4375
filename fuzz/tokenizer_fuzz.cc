// Fuzzes the shipped tokenizers (data/tokenizers/*): the first byte picks
// the tokenizer and the mode.
//  - encode: Encode the rest as text (with and without special tokens),
//    Decode the ids back; for Llama 3.1 (byte-level BPE, no normalizer) the
//    ids' TokenBytes must concatenate to valid UTF-8 input exactly (the
//    contract in engine/text/tokenizer.h).
//  - decode: the rest as little-endian int32 ids (any value: ids outside the
//    vocabulary are skipped), decoded whole, as fragments and per token;
//    Decode(ids) must equal DecodeFragment(ids, .., true).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <utf8proc.h>

#include "engine/text/tokenizer.h"

namespace {

struct Named {
  std::string name;
  std::unique_ptr<agentkv::text::Tokenizer> tokenizer;
};

const std::vector<Named>& Tokenizers() {
  static const std::vector<Named> all = [] {
    std::vector<Named> t;
    for (const char* name : {"qwen3", "llama3_1", "gemma3", "deepseek_v3", "gptoss"}) {
      const std::string path =
          std::string(AGENTKV_DATA_DIR) + "/tokenizers/" + name + "/tokenizer.json";
      auto loaded = agentkv::text::Tokenizer::Load(path);
      if (!loaded.ok()) {
        std::fprintf(stderr, "fuzz: %s: %s\n", path.c_str(), loaded.status().ToString().c_str());
        std::abort();
      }
      t.push_back({name, std::move(loaded).value()});
    }
    return t;
  }();
  return all;
}

// Request text reaches the tokenizer only as valid UTF-8 (the JSON parser
// checks it), so the exactness contract is checked for that only.
bool ValidUtf8(std::string_view s) {
  const auto* p = reinterpret_cast<const utf8proc_uint8_t*>(s.data());
  utf8proc_ssize_t left = static_cast<utf8proc_ssize_t>(s.size());
  while (left > 0) {
    utf8proc_int32_t c;
    const utf8proc_ssize_t n = utf8proc_iterate(p, left, &c);
    if (n <= 0) return false;
    p += n;
    left -= n;
  }
  return true;
}

void Fail(const char* what, const std::string& name) {
  std::fprintf(stderr, "fuzz: %s (%s)\n", what, name.c_str());
  std::abort();
}

}  // namespace

// Loads before fuzzing starts, so the first input is not a slow unit.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  Tokenizers();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const auto& all = Tokenizers();
  const Named& t = all[(data[0] >> 1) % all.size()];
  const bool decode_mode = data[0] & 1;
  std::string_view rest(reinterpret_cast<const char*>(data + 1), size - 1);
  if (!decode_mode) {
    const std::vector<int32_t> ids = t.tokenizer->Encode(rest, false);
    (void)t.tokenizer->Encode(rest, true);
    (void)t.tokenizer->Decode(ids, false);
    (void)t.tokenizer->Decode(ids, true);
    if (t.name == "llama3_1" && ValidUtf8(rest)) {
      std::string bytes;
      for (int32_t id : ids) {
        auto b = t.tokenizer->TokenBytes(id);
        if (!b) Fail("Encode returned an id without bytes", t.name);
        bytes += *b;
      }
      if (bytes != rest) Fail("TokenBytes of Encode's ids differ from the text", t.name);
    }
    return 0;
  }
  std::vector<int32_t> ids(rest.size() / 4);
  if (!ids.empty()) std::memcpy(ids.data(), rest.data(), ids.size() * 4);
  for (bool skip : {false, true}) {
    const std::string whole = t.tokenizer->Decode(ids, skip);
    if (whole != t.tokenizer->DecodeFragment(ids, skip, true)) {
      Fail("Decode differs from DecodeFragment(.., true)", t.name);
    }
    (void)t.tokenizer->DecodeFragment(ids, skip, false);
  }
  for (int32_t id : ids) {
    (void)t.tokenizer->TokenBytes(id);
    (void)t.tokenizer->IdToToken(id);
  }
  return 0;
}
