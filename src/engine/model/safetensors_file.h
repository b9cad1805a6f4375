// SafetensorsFile: one memory-mapped .safetensors file, validated at Open():
// header length within the file, header JSON well formed, every tensor's
// data_offsets inside the data section, consistent with shape * dtype size,
// and not overlapping another tensor. A truncated or damaged file gives a
// Corruption status naming the file (and the tensor, where one is at fault).
//
// Thread-safety: immutable after Open(); any number of threads may call Get()
// and read the returned data concurrently. TensorView::data points into the
// mapping and stays valid as long as the SafetensorsFile lives.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "util/status.h"

namespace agentkv::model {

// The element types the engine reads: the float types it computes with, and
// the stored types of quantized weights (U8: MXFP4 blocks and scales;
// F8_E4M3: FP8 weights), which engine/model/quant_format.h decodes. Files may
// hold others (I64 buffers, F8_E5M2); those open fine but Get() on such a
// tensor fails.
enum class TensorDtype { kBF16, kF16, kF32, kU8, kF8E4M3 };

size_t TensorDtypeSize(TensorDtype d);
// Whether `d` is a float type the engine computes with (BF16, F16, F32).
bool IsFloatDtype(TensorDtype d);
// "BF16", "F16", "F32", "U8", "F8_E4M3": the safetensors spelling.
std::string_view TensorDtypeName(TensorDtype d);
// Accepts the safetensors spelling; anything else is InvalidArgument.
Result<TensorDtype> ParseTensorDtype(std::string_view name);
// "bfloat16", "float16", "float32", "uint8", "float8_e4m3fn": the torch
// spelling (config.json torch_dtype).
std::string_view TensorDtypeTorchName(TensorDtype d);

int64_t NumElements(const std::vector<int64_t>& shape);
std::string ShapeString(const std::vector<int64_t>& shape);  // "[2, 3]"

struct TensorView {
  std::string name;
  TensorDtype dtype = TensorDtype::kF32;
  std::vector<int64_t> shape;
  const void* data = nullptr;  // into the file mapping; may be unaligned for
                               // dtypes wider than 8 bytes (never for ours)
  size_t nbytes = 0;
  int64_t numel() const { return NumElements(shape); }
};

class SafetensorsFile {
 public:
  // What the header says about one tensor.
  struct Entry {
    std::string dtype;  // as written in the file, e.g. "BF16" or "I64"
    std::vector<int64_t> shape;
    uint64_t begin = 0;  // offsets into the data section
    uint64_t end = 0;
  };

  static Result<std::unique_ptr<SafetensorsFile>> Open(const std::filesystem::path& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::filesystem::path& path() const { return path_; }
  uint64_t file_size() const { return size_; }
  // The JSON header exactly as stored (including any trailing padding).
  std::string_view header_text() const;
  // Offset of the data section from the start of the file (8 + header length).
  uint64_t data_offset() const { return data_offset_; }
  const std::map<std::string, Entry>& entries() const { return entries_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  bool Has(const std::string& name) const { return entries_.count(name) != 0; }

  // NotFound naming the file if absent; InvalidArgument if its dtype is not
  // one of TensorDtype.
  Result<TensorView> Get(const std::string& name) const;

 private:
  SafetensorsFile() = default;

  std::filesystem::path path_;
  const uint8_t* map_ = nullptr;
  uint64_t size_ = 0;
  uint64_t data_offset_ = 0;
  std::map<std::string, Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace agentkv::model
