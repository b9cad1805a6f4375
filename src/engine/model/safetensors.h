// Safetensors: the weights of a checkpoint, from one .safetensors file, a
// sharded set listed by model.safetensors.index.json ("weight_map"), or every
// *.safetensors file in a directory. All files are memory-mapped and
// validated at Open() (see SafetensorsFile).
//
// Thread-safety: immutable after Open(); Get() may be called concurrently.
// TensorViews point into the mappings and stay valid while this object (or a
// moved-to copy of it) lives.
#pragma once

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/model/safetensors_file.h"
#include "util/status.h"

namespace agentkv::model {

class Safetensors {
 public:
  // `path` is a .safetensors file, a model.safetensors.index.json, or a
  // directory (index if present, else all *.safetensors files in it). A tensor
  // named in two files, or an index naming a tensor its shard lacks, is
  // Corruption.
  static Result<Safetensors> Open(const std::filesystem::path& path);

  Safetensors(Safetensors&&) noexcept = default;
  Safetensors& operator=(Safetensors&&) noexcept = default;

  bool Has(const std::string& name) const { return where_.count(name) != 0; }
  std::vector<std::string> Names() const;  // sorted
  // The file holding `name`; empty path if absent.
  std::filesystem::path FileOf(const std::string& name) const;

  Result<TensorView> Get(const std::string& name) const;
  // As Get(), and InvalidArgument naming the file and tensor unless the shape
  // equals `expected_shape`.
  Result<TensorView> Get(const std::string& name, const std::vector<int64_t>& expected_shape) const;

  const std::vector<std::unique_ptr<SafetensorsFile>>& files() const { return files_; }

 private:
  Safetensors() = default;
  Status AddFile(const std::filesystem::path& p);

  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const SafetensorsFile*> where_;
};

}  // namespace agentkv::model
