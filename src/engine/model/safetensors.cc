#include "engine/model/safetensors.h"

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

namespace agentkv::model {
namespace fs = std::filesystem;

Status Safetensors::AddFile(const fs::path& p) {
  ASSIGN_OR_RETURN(auto file, SafetensorsFile::Open(p));
  for (const auto& [name, entry] : file->entries()) {
    auto [it, inserted] = where_.emplace(name, file.get());
    if (!inserted)
      return Corruption("tensor " + name + " is in both " + it->second->path().string() + " and " +
                        p.string());
  }
  files_.push_back(std::move(file));
  return Status::Ok();
}

Result<Safetensors> Safetensors::Open(const fs::path& path) {
  Safetensors st;
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    fs::path index = path / "model.safetensors.index.json";
    if (fs::exists(index, ec)) return Open(index);
    std::vector<fs::path> shards;
    for (const auto& de : fs::directory_iterator(path, ec))
      if (de.path().extension() == ".safetensors") shards.push_back(de.path());
    if (ec) return IoError(path.string() + ": cannot list directory: " + ec.message());
    if (shards.empty()) return NotFound(path.string() + ": no *.safetensors files");
    std::sort(shards.begin(), shards.end());
    for (const auto& s : shards) RETURN_IF_ERROR(st.AddFile(s));
    return st;
  }
  if (path.extension() != ".json") {
    RETURN_IF_ERROR(st.AddFile(path));
    return st;
  }

  // A shard index: {"metadata": {...}, "weight_map": {"tensor": "file", ...}}.
  const std::string iname = path.string();
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound(iname + ": cannot open");
  std::stringstream ss;
  ss << in.rdbuf();
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(ss.str());
  } catch (const nlohmann::json::exception& ex) {
    return Corruption(iname + ": not valid JSON: " + ex.what());
  }
  if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
    return Corruption(iname + ": missing field weight_map (object)");
  std::set<std::string> shard_names;
  for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
    if (!it.value().is_string())
      return Corruption(iname + ": weight_map." + it.key() + " is not a string");
    std::string shard = it.value().get<std::string>();
    if (shard.find('/') != std::string::npos || shard == "..")
      return Corruption(iname + ": weight_map." + it.key() + " names a file outside the " +
                        "checkpoint: " + shard);
    shard_names.insert(shard);
  }
  for (const auto& s : shard_names) RETURN_IF_ERROR(st.AddFile(path.parent_path() / s));
  for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
    fs::path want = path.parent_path() / it.value().get<std::string>();
    auto w = st.where_.find(it.key());
    if (w == st.where_.end() || w->second->path() != want)
      return Corruption(iname + ": tensor " + it.key() + " is listed in " + want.string() +
                        " but that file does not hold it");
  }
  return st;
}

std::vector<std::string> Safetensors::Names() const {
  std::vector<std::string> names;
  names.reserve(where_.size());
  for (const auto& [n, f] : where_) names.push_back(n);
  return names;
}

fs::path Safetensors::FileOf(const std::string& name) const {
  auto it = where_.find(name);
  return it == where_.end() ? fs::path() : it->second->path();
}

Result<TensorView> Safetensors::Get(const std::string& name) const {
  auto it = where_.find(name);
  if (it == where_.end()) {
    std::string files;
    for (const auto& f : files_) files += (files.empty() ? "" : ", ") + f->path().string();
    return NotFound("tensor " + name + " not found in " + files);
  }
  return it->second->Get(name);
}

Result<TensorView> Safetensors::Get(const std::string& name,
                                    const std::vector<int64_t>& expected_shape) const {
  ASSIGN_OR_RETURN(TensorView v, Get(name));
  if (v.shape != expected_shape)
    return InvalidArgument(FileOf(name).string() + ": tensor " + name + " has shape " +
                           ShapeString(v.shape) + ", expected " + ShapeString(expected_shape));
  return v;
}

}  // namespace agentkv::model
