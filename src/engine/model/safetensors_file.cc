#include "engine/model/safetensors_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>

namespace agentkv::model {
namespace {

// Element sizes of every dtype the format defines, so that files holding
// tensors we do not compute with are still checked for consistency.
int ElementBytes(const std::string& dtype) {
  static const std::map<std::string, int> kSizes = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E4M3", 1}, {"F8_E5M2", 1},
      {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},
      {"U32", 4},  {"F32", 4}, {"I64", 8}, {"U64", 8},     {"F64", 8}};
  auto it = kSizes.find(dtype);
  return it == kSizes.end() ? 0 : it->second;
}

// Headers of real checkpoints are a few hundred KiB; this bounds what a
// damaged length field can make us parse.
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

}  // namespace

size_t TensorDtypeSize(TensorDtype d) {
  switch (d) {
    case TensorDtype::kBF16:
      return 2;
    case TensorDtype::kF16:
      return 2;
    case TensorDtype::kF32:
      return 4;
    case TensorDtype::kU8:
    case TensorDtype::kF8E4M3:
      return 1;
  }
  return 4;
}

bool IsFloatDtype(TensorDtype d) {
  return d == TensorDtype::kBF16 || d == TensorDtype::kF16 || d == TensorDtype::kF32;
}

std::string_view TensorDtypeName(TensorDtype d) {
  switch (d) {
    case TensorDtype::kBF16:
      return "BF16";
    case TensorDtype::kF16:
      return "F16";
    case TensorDtype::kF32:
      return "F32";
    case TensorDtype::kU8:
      return "U8";
    case TensorDtype::kF8E4M3:
      return "F8_E4M3";
  }
  return "F32";
}

std::string_view TensorDtypeTorchName(TensorDtype d) {
  switch (d) {
    case TensorDtype::kBF16:
      return "bfloat16";
    case TensorDtype::kF16:
      return "float16";
    case TensorDtype::kF32:
      return "float32";
    case TensorDtype::kU8:
      return "uint8";
    case TensorDtype::kF8E4M3:
      return "float8_e4m3fn";
  }
  return "float32";
}

Result<TensorDtype> ParseTensorDtype(std::string_view name) {
  if (name == "BF16") return TensorDtype::kBF16;
  if (name == "F16") return TensorDtype::kF16;
  if (name == "F32") return TensorDtype::kF32;
  if (name == "U8") return TensorDtype::kU8;
  if (name == "F8_E4M3") return TensorDtype::kF8E4M3;
  return InvalidArgument("unsupported tensor dtype " + std::string(name) +
                         " (supported: BF16, F16, F32, U8, F8_E4M3)");
}

int64_t NumElements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

SafetensorsFile::~SafetensorsFile() {
  if (map_ != nullptr) munmap(const_cast<uint8_t*>(map_), size_);
}

std::string_view SafetensorsFile::header_text() const {
  return {reinterpret_cast<const char*>(map_) + 8, data_offset_ - 8};
}

Result<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::filesystem::path& path) {
  const std::string fname = path.string();
  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = path;
  int fd = ::open(fname.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int e = errno;
    std::string msg = fname + ": cannot open: " + std::strerror(e);
    return e == ENOENT ? NotFound(msg) : IoError(msg);
  }
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    return IoError(fname + ": fstat: " + std::strerror(e));
  }
  f->size_ = static_cast<uint64_t>(st.st_size);
  if (f->size_ < 8) {
    ::close(fd);
    return Corruption(fname + ": truncated safetensors file (" + std::to_string(f->size_) +
                      " bytes, no header length)");
  }
  void* m = mmap(nullptr, f->size_, PROT_READ, MAP_SHARED, fd, 0);
  int e = errno;
  ::close(fd);
  if (m == MAP_FAILED) return IoError(fname + ": mmap: " + std::strerror(e));
  f->map_ = static_cast<const uint8_t*>(m);

  uint64_t hlen = 0;
  for (int i = 7; i >= 0; --i) hlen = (hlen << 8) | f->map_[i];
  if (hlen > kMaxHeaderBytes || hlen > f->size_ - 8) {
    return Corruption(fname + ": bad safetensors header length " + std::to_string(hlen) +
                      " (file is " + std::to_string(f->size_) + " bytes; truncated or not a " +
                      "safetensors file)");
  }
  f->data_offset_ = 8 + hlen;
  const uint64_t data_size = f->size_ - f->data_offset_;

  nlohmann::json header;
  try {
    header = nlohmann::json::parse(f->header_text());
  } catch (const nlohmann::json::exception& ex) {
    return Corruption(fname + ": safetensors header is not valid JSON: " + ex.what());
  }
  if (!header.is_object()) return Corruption(fname + ": safetensors header is not a JSON object");

  struct Span {
    uint64_t begin, end;
    const std::string* name;
  };
  std::vector<Span> spans;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const nlohmann::json& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) return Corruption(fname + ": __metadata__ is not an object");
      for (auto m = v.begin(); m != v.end(); ++m)
        if (m.value().is_string()) f->metadata_[m.key()] = m.value().get<std::string>();
      continue;
    }
    const std::string where = fname + ": tensor " + name;
    if (!v.is_object()) return Corruption(where + ": header entry is not an object");
    Entry entry;
    auto dt = v.find("dtype");
    if (dt == v.end() || !dt->is_string()) return Corruption(where + ": missing dtype");
    entry.dtype = dt->get<std::string>();
    int esize = ElementBytes(entry.dtype);
    if (esize == 0) return Corruption(where + ": unknown dtype " + entry.dtype);
    auto sh = v.find("shape");
    if (sh == v.end() || !sh->is_array()) return Corruption(where + ": missing shape");
    // Overflow-safe element count: each dimension fits the file's bytes.
    uint64_t numel = 1;
    for (const auto& d : *sh) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0)
        return Corruption(where + ": bad shape " + sh->dump());
      uint64_t dim = d.get<uint64_t>();
      if (dim != 0 && numel > std::numeric_limits<uint64_t>::max() / 8 / dim)
        return Corruption(where + ": shape " + sh->dump() + " too large");
      numel *= dim;
      entry.shape.push_back(static_cast<int64_t>(dim));
    }
    auto off = v.find("data_offsets");
    if (off == v.end() || !off->is_array() || off->size() != 2 || !(*off)[0].is_number_unsigned() ||
        !(*off)[1].is_number_unsigned())
      return Corruption(where + ": missing or bad data_offsets");
    entry.begin = (*off)[0].get<uint64_t>();
    entry.end = (*off)[1].get<uint64_t>();
    if (entry.begin > entry.end)
      return Corruption(where + ": data_offsets [" + std::to_string(entry.begin) + ", " +
                        std::to_string(entry.end) + "] are reversed");
    if (entry.end - entry.begin != numel * esize)
      return Corruption(where + ": data_offsets span " + std::to_string(entry.end - entry.begin) +
                        " bytes but shape " + ShapeString(entry.shape) + " of " + entry.dtype +
                        " needs " + std::to_string(numel * esize));
    if (entry.end > data_size)
      return Corruption(where + ": data ends at byte " +
                        std::to_string(f->data_offset_ + entry.end) + " but the file has " +
                        std::to_string(f->size_) + " (truncated file)");
    auto [pos, inserted] = f->entries_.emplace(name, std::move(entry));
    if (!inserted) return Corruption(where + ": duplicate tensor name");
    spans.push_back({pos->second.begin, pos->second.end, &pos->first});
  }
  std::sort(spans.begin(), spans.end(),
            [](const Span& a, const Span& b) { return a.begin < b.begin; });
  const Span* furthest = nullptr;  // the non-empty span reaching furthest so far
  for (const Span& s : spans) {
    if (s.begin == s.end) continue;
    if (furthest != nullptr && s.begin < furthest->end)
      return Corruption(fname + ": tensor " + *s.name + " overlaps tensor " + *furthest->name);
    if (furthest == nullptr || s.end > furthest->end) furthest = &s;
  }
  return f;
}

Result<TensorView> SafetensorsFile::Get(const std::string& name) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) return NotFound(path_.string() + ": no tensor " + name);
  const Entry& e = it->second;
  auto dt = ParseTensorDtype(e.dtype);
  if (!dt.ok()) return dt.status().WithContext(path_.string() + ": tensor " + name);
  TensorView v;
  v.name = name;
  v.dtype = *dt;
  v.shape = e.shape;
  v.data = map_ + data_offset_ + e.begin;
  v.nbytes = e.end - e.begin;
  return v;
}

}  // namespace agentkv::model
