#include "api/served_model.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "engine/model_files.h"
#include "store/store_kv_tier.h"

namespace agentkv::api {

using nlohmann::json;
using nlohmann::ordered_json;

Result<std::unique_ptr<ServedModel>> ServedModel::Load(const ServedModelOptions& options) {
  std::unique_ptr<ServedModel> m(new ServedModel());
  std::filesystem::path dir(options.model_dir);
  m->name_ = std::filesystem::weakly_canonical(dir).filename().string();
  if (m->name_.empty()) m->name_ = options.model_dir;
  ASSIGN_OR_RETURN(m->tokenizer_, Tokenizer::Load(dir / "tokenizer.json"));
  auto tmpl = ChatTemplate::LoadFromModelDir(options.model_dir);
  if (tmpl.ok()) m->template_.emplace(std::move(tmpl).value());
  ASSIGN_OR_RETURN(auto backend, CreateBackend(dir, options.backend));
  m->model_type_ = backend->config().model_type;
  m->max_waiting_ = options.max_waiting;
  EngineOptions eo;
  eo.scheduler.max_batch = options.max_batch;
  eo.scheduler.max_step_tokens = options.max_step_tokens;
  if (options.kv_memory_bytes > 0) eo.kv_memory_bytes = options.kv_memory_bytes;
  eo.host_kv_memory_bytes = options.host_kv_memory_bytes;
  ASSIGN_OR_RETURN(ModelFiles files, ModelFiles::Locate(dir));
  ASSIGN_OR_RETURN(m->fingerprint_, files.Fingerprint());
  if (options.store != nullptr && options.persist_kv) {
    ASSIGN_OR_RETURN(
        auto tier, store::StoreKvTier::Create(options.store, m->fingerprint_, backend->kv_format(),
                                              eo.block_size, backend->kv_element_size(), m->name_));
    m->kv_tier_ = std::move(tier);
    eo.kv_tier = m->kv_tier_;
  }
  ASSIGN_OR_RETURN(m->engine_, Engine::Create(std::move(backend), m->tokenizer_.get(), eo));
  return m;
}

uint64_t DefaultHostKvMemoryBytes(uint64_t mem_available_bytes) {
  const uint64_t quarter = mem_available_bytes / 4;
  if (quarter < (256ull << 20)) return 0;
  return std::min<uint64_t>(quarter, 32ull << 30);
}

Result<uint64_t> ParseHostKvMemory(const std::string& text, uint64_t mem_available_bytes) {
  const auto bad = [&] {
    return InvalidArgument("bad --host-kv-memory '" + text +
                           "': bytes (K/M/G suffix), a fraction below 1, or 0");
  };
  if (text.empty()) return bad();
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (end == text.c_str() || !(v >= 0)) return bad();
  const std::string suffix(end);
  if (v == 0 && suffix.empty()) return uint64_t{0};
  if (suffix.empty() && v < 1)
    return static_cast<uint64_t>(v * static_cast<double>(mem_available_bytes));
  double mult = 1;
  if (suffix == "K" || suffix == "k") {
    mult = 1024.0;
  } else if (suffix == "M" || suffix == "m") {
    mult = 1024.0 * 1024;
  } else if (suffix == "G" || suffix == "g") {
    mult = 1024.0 * 1024 * 1024;
  } else if (!suffix.empty()) {
    return bad();
  }
  if (v != static_cast<double>(static_cast<uint64_t>(v)) && suffix.empty()) return bad();
  return static_cast<uint64_t>(v * mult);
}

Result<uint64_t> ReadMemAvailableBytes() {
  std::ifstream in("/proc/meminfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("MemAvailable:", 0) != 0) continue;
    std::istringstream fields(line.substr(13));
    uint64_t kib = 0;
    if (fields >> kib) return kib * 1024;
  }
  return NotFound("no MemAvailable in /proc/meminfo");
}

Result<std::vector<int32_t>> ServedModel::EncodeChat(const ordered_json& messages,
                                                     const ordered_json& tools,
                                                     const ordered_json& extra,
                                                     bool add_generation_prompt) const {
  if (!template_) return InvalidArgument("model " + name_ + " has no chat template");
  ChatTemplate::Input in;
  in.messages = messages;
  if (tools.is_array() && !tools.empty()) in.tools = tools;
  in.add_generation_prompt = add_generation_prompt;
  if (extra.is_object()) in.extra = extra;
  ASSIGN_OR_RETURN(std::string text, template_->Render(in));
  return tokenizer_->Encode(text, /*add_special_tokens=*/false);
}

Result<Priority> ServedModel::RequestPriority(const HttpRequest& req, const json& body) {
  std::string name = req.Header("x-priority");
  if (name.empty() && body.is_object() && body.contains("priority")) {
    const json& p = body["priority"];
    if (!p.is_string()) return InvalidArgument("'priority' must be a string: high, normal or low");
    name = p.get<std::string>();
  }
  if (name.empty()) return Priority::kNormal;
  return ParsePriority(name);
}

Result<EngineRequest> ServedModel::MakeRequest(std::vector<int32_t> prompt, SamplingParams params,
                                               Priority priority) const {
  const int64_t n = static_cast<int64_t>(prompt.size());
  if (n == 0) return InvalidArgument("the prompt is empty");
  if (n >= max_context()) {
    return InvalidArgument("the prompt is " + std::to_string(n) +
                           " tokens; the model's context is " + std::to_string(max_context()));
  }
  const int32_t left = static_cast<int32_t>(max_context() - n);
  if (!params.max_tokens || *params.max_tokens > left) params.max_tokens = left;
  RETURN_IF_ERROR(params.Validate());
  if (max_waiting_ > 0 && engine_->Stats().waiting >= max_waiting_) {
    return ResourceExhausted("the server is overloaded (" + std::to_string(max_waiting_) +
                             " requests waiting); retry later");
  }
  EngineRequest r;
  r.prompt = std::move(prompt);
  r.params = std::move(params);
  r.priority = priority;
  return r;
}

Result<RequestHandle> ServedModel::Submit(std::vector<int32_t> prompt, SamplingParams params,
                                          Priority priority) const {
  ASSIGN_OR_RETURN(EngineRequest r, MakeRequest(std::move(prompt), std::move(params), priority));
  return engine_->Submit(std::move(r));
}

int HttpStatusFor(const Status& s) {
  switch (s.code()) {
    case StatusCode::kInvalidArgument:
    case StatusCode::kNotFound:
      return 400;
    case StatusCode::kResourceExhausted:
      return 429;
    case StatusCode::kCancelled:
      return 503;
    default:
      return 500;
  }
}

namespace {

Status GetFloat(const json& body, const char* key, float* out) {
  if (!body.contains(key) || body[key].is_null()) return Status::Ok();
  if (!body[key].is_number()) return InvalidArgument(std::string("'") + key + "' must be a number");
  *out = body[key].get<float>();
  return Status::Ok();
}

}  // namespace

Status GetOptionalInt(const json& body, const char* key, std::optional<int64_t>* out) {
  if (!body.contains(key) || body[key].is_null()) return Status::Ok();
  const json& v = body[key];
  if (!v.is_number_integer() &&
      !(v.is_number_float() && v.get<double>() == std::floor(v.get<double>()))) {
    return InvalidArgument(std::string("'") + key + "' must be an integer");
  }
  const int64_t x = v.get<int64_t>();
  if (x < 0) return InvalidArgument(std::string("'") + key + "' must not be negative");
  *out = x;
  return Status::Ok();
}

Status ParseSampling(const json& body, const char* stop_key, SamplingParams* p) {
  RETURN_IF_ERROR(GetFloat(body, "temperature", &p->temperature));
  RETURN_IF_ERROR(GetFloat(body, "top_p", &p->top_p));
  RETURN_IF_ERROR(GetFloat(body, "min_p", &p->min_p));
  RETURN_IF_ERROR(GetFloat(body, "presence_penalty", &p->presence_penalty));
  RETURN_IF_ERROR(GetFloat(body, "frequency_penalty", &p->frequency_penalty));
  RETURN_IF_ERROR(GetFloat(body, "repetition_penalty", &p->repetition_penalty));
  if (body.contains("top_k") && !body["top_k"].is_null()) {
    if (!body["top_k"].is_number_integer()) return InvalidArgument("'top_k' must be an integer");
    p->top_k = body["top_k"].get<int32_t>();
  }
  if (body.contains("seed") && !body["seed"].is_null()) {
    if (!body["seed"].is_number_integer()) return InvalidArgument("'seed' must be an integer");
    p->seed = static_cast<uint64_t>(body["seed"].get<int64_t>());
  }
  if (body.contains("ignore_eos") && !body["ignore_eos"].is_null()) {
    if (!body["ignore_eos"].is_boolean()) return InvalidArgument("'ignore_eos' must be a boolean");
    p->ignore_eos = body["ignore_eos"].get<bool>();
  }
  if (body.contains(stop_key) && !body[stop_key].is_null()) {
    const json& s = body[stop_key];
    if (s.is_string()) {
      if (!s.get<std::string>().empty()) p->stop.push_back(s.get<std::string>());
    } else if (s.is_array()) {
      for (const json& e : s) {
        if (!e.is_string()) {
          return InvalidArgument(std::string("'") + stop_key +
                                 "' must be a string or a list of strings");
        }
        if (!e.get<std::string>().empty()) p->stop.push_back(e.get<std::string>());
      }
    } else {
      return InvalidArgument(std::string("'") + stop_key +
                             "' must be a string or a list of strings");
    }
  }
  return Status::Ok();
}

}  // namespace agentkv::api
