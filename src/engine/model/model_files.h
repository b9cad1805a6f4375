// ModelFiles: where the parts of a Hugging Face checkpoint directory are, and
// the model fingerprint that tags every persisted KV record.
//
// The fingerprint is the XXH3-128 (32 hex digits) of, in order, each part
// length-prefixed:
//   - a format tag ("agentkv-fingerprint-v1");
//   - config.json canonicalised (parsed and re-serialised with sorted keys and
//     no whitespace), so formatting changes do not matter but any value does;
//   - the XXH3-128 of tokenizer.json's bytes;
//   - for each weight file, in name order: its file name, its size in bytes,
//     and the XXH3-128 of its safetensors header (8-byte length + JSON) followed
//     by the first and the last 1 MiB of its data section.
// The weights part is an identity, not a checksum of every byte: it reads at
// most ~2 MiB per file (fast for multi-GB checkpoints) and still changes when
// a file is re-generated with another seed, shape, dtype or layout.
// generation_config.json and tokenizer_config.json are left out: they change
// neither the KV a token sequence produces nor the token ids of a text.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "util/status.h"

namespace agentkv::model {

struct ModelFiles {
  std::filesystem::path dir;
  std::filesystem::path config;                // config.json
  std::filesystem::path tokenizer;             // tokenizer.json
  std::filesystem::path tokenizer_config;      // tokenizer_config.json; empty if absent
  std::filesystem::path generation_config;     // generation_config.json; empty if absent
  std::filesystem::path weight_index;          // model.safetensors.index.json; empty if none
  std::vector<std::filesystem::path> weights;  // the .safetensors files, sorted

  // NotFound naming the missing file when dir has no config.json, no
  // tokenizer.json, no weights, or an index naming a file that is not there.
  static Result<ModelFiles> Locate(const std::filesystem::path& dir);

  // See the file comment. Reads the files again on every call.
  Result<std::string> Fingerprint() const;
};

}  // namespace agentkv::model
