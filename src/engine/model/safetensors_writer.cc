#include "engine/model/safetensors_writer.h"

#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>

namespace agentkv::model {

SafetensorsWriter::SafetensorsWriter(std::filesystem::path path)
    : path_(std::move(path)), tmp_(path_.string() + ".tmp") {}

SafetensorsWriter::~SafetensorsWriter() {
  if (out_ != nullptr) {
    std::fclose(out_);
    std::error_code ec;
    std::filesystem::remove(tmp_, ec);
  }
}

Status SafetensorsWriter::Add(const std::string& name, TensorDtype dtype,
                              const std::vector<int64_t>& shape) {
  if (out_ != nullptr || finished_)
    return InvalidArgument(path_.string() + ": tensor " + name + " added after Begin()");
  if (name.empty() || name == "__metadata__")
    return InvalidArgument(path_.string() + ": bad tensor name '" + name + "'");
  for (const auto& d : decls_)
    if (d.name == name) return InvalidArgument(path_.string() + ": duplicate tensor " + name);
  for (int64_t d : shape)
    if (d < 0)
      return InvalidArgument(path_.string() + ": tensor " + name + " has negative dimension");
  decls_.push_back({name, dtype, shape});
  return Status::Ok();
}

Status SafetensorsWriter::Begin(const std::map<std::string, std::string>& metadata) {
  if (out_ != nullptr || finished_) return InvalidArgument(path_.string() + ": Begin() twice");
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& d : decls_) {
    uint64_t n = static_cast<uint64_t>(NumElements(d.shape)) * TensorDtypeSize(d.dtype);
    header[d.name] = {{"dtype", std::string(TensorDtypeName(d.dtype))},
                      {"shape", d.shape},
                      {"data_offsets", {offset, offset + n}}};
    offset += n;
  }
  data_bytes_ = offset;
  std::string text = header.dump();
  // The data section must start 8-byte aligned; the format allows trailing
  // spaces in the header for that.
  while ((8 + text.size()) % 8 != 0) text.push_back(' ');

  out_ = std::fopen(tmp_.c_str(), "wb");
  if (out_ == nullptr) return IoError(tmp_.string() + ": cannot create: " + std::strerror(errno));
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(text.size() >> (8 * i));
  if (std::fwrite(len, 1, 8, out_) != 8 ||
      std::fwrite(text.data(), 1, text.size(), out_) != text.size())
    return IoError(tmp_.string() + ": write failed: " + std::strerror(errno));
  return Status::Ok();
}

Status SafetensorsWriter::Append(const void* data, size_t size) {
  if (out_ == nullptr) return InvalidArgument(path_.string() + ": Append() before Begin()");
  if (written_ + size > data_bytes_)
    return InvalidArgument(path_.string() + ": more tensor data than declared (" +
                           std::to_string(written_ + size) + " > " + std::to_string(data_bytes_) +
                           " bytes)");
  if (size != 0 && std::fwrite(data, 1, size, out_) != size)
    return IoError(tmp_.string() + ": write failed: " + std::strerror(errno));
  written_ += size;
  return Status::Ok();
}

Status SafetensorsWriter::Finish() {
  if (out_ == nullptr) return InvalidArgument(path_.string() + ": Finish() before Begin()");
  if (written_ != data_bytes_)
    return InvalidArgument(path_.string() + ": only " + std::to_string(written_) + " of " +
                           std::to_string(data_bytes_) + " declared tensor bytes written");
  int rc = std::fclose(out_);
  out_ = nullptr;
  if (rc != 0) {
    std::error_code ec;
    std::filesystem::remove(tmp_, ec);
    return IoError(tmp_.string() + ": close failed: " + std::strerror(errno));
  }
  std::error_code ec;
  std::filesystem::rename(tmp_, path_, ec);
  if (ec) return IoError(path_.string() + ": rename failed: " + ec.message());
  finished_ = true;
  return Status::Ok();
}

Status SafetensorsWriter::WriteFile(const std::filesystem::path& path,
                                    const std::vector<Tensor>& tensors) {
  SafetensorsWriter w(path);
  for (const auto& t : tensors) RETURN_IF_ERROR(w.Add(t.name, t.dtype, t.shape));
  RETURN_IF_ERROR(w.Begin());
  for (const auto& t : tensors) {
    uint64_t want = static_cast<uint64_t>(NumElements(t.shape)) * TensorDtypeSize(t.dtype);
    if (t.bytes.size() != want)
      return InvalidArgument(path.string() + ": tensor " + t.name + " has " +
                             std::to_string(t.bytes.size()) + " bytes, shape needs " +
                             std::to_string(want));
    RETURN_IF_ERROR(w.Append(t.bytes.data(), t.bytes.size()));
  }
  return w.Finish();
}

}  // namespace agentkv::model
