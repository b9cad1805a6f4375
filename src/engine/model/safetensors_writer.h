// SafetensorsWriter: streams tensors into a .safetensors file without holding
// them in memory. Declare every tensor (Add), then Begin() writes the header
// (8-byte little-endian length, JSON, space padding to an 8-byte boundary,
// __metadata__ {"format": "pt"}), then Append() the tensors' bytes in
// declaration order, in chunks of any size, then Finish(). The file is written
// under `<path>.tmp` and renamed into place by Finish(), so a reader never sees
// a half-written file under the final name.
//
// Thread-compatible: one thread at a time.
#pragma once

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "engine/model/safetensors_file.h"
#include "util/status.h"

namespace agentkv::model {

class SafetensorsWriter {
 public:
  // A whole tensor in memory, for WriteFile().
  struct Tensor {
    std::string name;
    TensorDtype dtype = TensorDtype::kF32;
    std::vector<int64_t> shape;
    std::string bytes;  // numel * dtype size bytes, little-endian
  };

  explicit SafetensorsWriter(std::filesystem::path path);
  ~SafetensorsWriter();  // an unfinished file's temporary is removed
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  // InvalidArgument on a duplicate or empty name, a negative dimension, or a
  // call after Begin().
  Status Add(const std::string& name, TensorDtype dtype, const std::vector<int64_t>& shape);
  Status Begin(const std::map<std::string, std::string>& metadata = {{"format", "pt"}});
  // InvalidArgument if more bytes arrive than the declared tensors hold.
  Status Append(const void* data, size_t size);
  // InvalidArgument if fewer bytes arrived than declared.
  Status Finish();

  uint64_t data_bytes() const { return data_bytes_; }
  uint64_t bytes_written() const { return written_; }

  // Writes `tensors` (in order) to `path`.
  static Status WriteFile(const std::filesystem::path& path, const std::vector<Tensor>& tensors);

 private:
  struct Decl {
    std::string name;
    TensorDtype dtype;
    std::vector<int64_t> shape;
  };

  std::filesystem::path path_;
  std::filesystem::path tmp_;
  std::vector<Decl> decls_;
  std::FILE* out_ = nullptr;
  bool finished_ = false;
  uint64_t data_bytes_ = 0;
  uint64_t written_ = 0;
};

}  // namespace agentkv::model
