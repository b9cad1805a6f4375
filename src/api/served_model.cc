#include "api/served_model.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>

#include "engine/grammar/think_grammar.h"
#include "engine/model/model_files.h"
#include "store/store_kv_tier.h"
#include "util/memory_size.h"
#include "util/unique_seed.h"

namespace agentkv::api {

using nlohmann::json;
using nlohmann::ordered_json;

Result<std::unique_ptr<ServedModel>> ServedModel::Load(const ServedModelOptions& options) {
  std::unique_ptr<ServedModel> m(new ServedModel());
  std::filesystem::path dir(options.model_dir);
  m->name_ = std::filesystem::weakly_canonical(dir).filename().string();
  if (m->name_.empty()) m->name_ = options.model_dir;
  ASSIGN_OR_RETURN(m->tokenizer_, text::Tokenizer::Load(dir / "tokenizer.json"));
  auto tmpl = text::chat::ChatTemplate::LoadFromModelDir(options.model_dir);
  if (tmpl.ok()) m->template_.emplace(std::move(tmpl).value());
  ASSIGN_OR_RETURN(auto backend, backend::CreateBackend(dir, options.backend));
  m->model_type_ = backend->config().model_type;
  m->max_waiting_ = options.max_waiting;
  engine::EngineOptions eo;
  eo.scheduler.max_batch = options.max_batch;
  eo.scheduler.max_step_tokens = options.max_step_tokens;
  eo.kv_memory_bytes = options.kv_memory_bytes;
  eo.kv_memory_fraction = options.kv_memory_fraction;
  eo.host_kv_memory_bytes = options.host_kv_memory_bytes;
  eo.split_restores = options.split_restores;
  eo.calibrate_prefill = options.calibrate_prefill;
  eo.speculative = options.speculative;
  ASSIGN_OR_RETURN(model::ModelFiles files, model::ModelFiles::Locate(dir));
  ASSIGN_OR_RETURN(m->fingerprint_, files.Fingerprint());
  if (options.store != nullptr && options.persist_kv) {
    ASSIGN_OR_RETURN(
        auto tier, store::StoreKvTier::Create(options.store, m->fingerprint_, backend->kv_format(),
                                              eo.block_size, backend->kv_element_size(), m->name_));
    m->kv_tier_ = std::move(tier);
    eo.kv_tier = m->kv_tier_;
  }
  ASSIGN_OR_RETURN(m->engine_, engine::Engine::Create(std::move(backend), m->tokenizer_.get(), eo));
  return m;
}

uint64_t DefaultHostKvMemoryBytes(uint64_t mem_available_bytes) {
  const uint64_t quarter = mem_available_bytes / 4;
  if (quarter < (256ull << 20)) return 0;
  return std::min<uint64_t>(quarter, 32ull << 30);
}

Result<uint64_t> ParseHostKvMemory(const std::string& text, uint64_t mem_available_bytes) {
  ASSIGN_OR_RETURN(const MemorySize size, ParseMemorySize(text, "--host-kv-memory"));
  if (size.is_zero) return uint64_t{0};
  if (size.fraction > 0) {
    return static_cast<uint64_t>(size.fraction * static_cast<double>(mem_available_bytes));
  }
  return size.bytes;
}

text::output::OutputParserOptions ServedModel::ParserOptions(
    const std::shared_ptr<const ServedModel>& model, bool tools, std::string_view prompt_text) {
  const bool starts_in_reasoning =
      !prompt_text.empty() && grammar::ThinkStartOf(prompt_text) == grammar::ThinkStart::kOpen;
  text::output::OutputParserOptions o = text::output::OutputParserOptions::ForModelType(
      model->model_type(), tools, starts_in_reasoning);
  o.tokenizer = std::shared_ptr<const text::Tokenizer>(model, model->tokenizer_.get());
  // Call ids must not repeat across replies: a conversation carries every
  // earlier turn's calls, and clients match tool results to calls by id.
  o.tools.id_seed = UniqueSeed();
  return o;
}

Result<std::vector<int32_t>> ServedModel::EncodeChat(const ordered_json& messages,
                                                     const ordered_json& tools,
                                                     const ordered_json& extra,
                                                     bool add_generation_prompt,
                                                     std::string* text_out) const {
  if (!template_) return InvalidArgument("model " + name_ + " has no chat template");
  text::chat::ChatTemplate::Input in;
  in.messages = messages;
  if (tools.is_array() && !tools.empty()) in.tools = tools;
  in.add_generation_prompt = add_generation_prompt;
  if (extra.is_object()) in.extra = extra;
  ASSIGN_OR_RETURN(std::string text, template_->Render(in));
  std::vector<int32_t> ids = tokenizer_->Encode(text, /*add_special_tokens=*/false);
  if (text_out != nullptr) *text_out = std::move(text);
  return ids;
}

Result<engine::Priority> ServedModel::RequestPriority(const HttpRequest& req, const json& body) {
  std::string name = req.Header("x-priority");
  if (name.empty() && body.is_object() && body.contains("priority")) {
    const json& p = body["priority"];
    if (!p.is_string()) return InvalidArgument("'priority' must be a string: high, normal or low");
    name = p.get<std::string>();
  }
  if (name.empty()) return engine::Priority::kNormal;
  ASSIGN_OR_RETURN(engine::Priority p, engine::ParsePriority(name));
  // A tenant not allowed high priority is served at normal at most.
  if (p == engine::Priority::kHigh && !req.high_priority_allowed) return engine::Priority::kNormal;
  return p;
}

std::shared_ptr<const grammar::TokenVocabulary> ServedModel::grammar_vocab() const {
  std::call_once(grammar_vocab_once_, [&] {
    grammar_vocab_ = grammar::TokenVocabulary::Build(*tokenizer_, engine_->config().vocab_size);
  });
  return grammar_vocab_;
}

Result<engine::EngineRequest> ServedModel::MakeRequest(std::vector<int32_t> prompt,
                                                       engine::SamplingParams params,
                                                       engine::Priority priority) const {
  const int64_t n = static_cast<int64_t>(prompt.size());
  if (n == 0) return InvalidArgument("the prompt is empty");
  if (n >= max_context()) {
    return InvalidArgument("the prompt is " + std::to_string(n) +
                           " tokens; the model's context is " + std::to_string(max_context()));
  }
  const int64_t capacity = engine_->sequence_capacity();
  if (n >= capacity) {
    return InvalidArgument("the prompt is " + std::to_string(n) +
                           " tokens; the KV pool holds at most " + std::to_string(capacity) +
                           " tokens for one request (raise --kv-memory)");
  }
  const auto left = static_cast<int32_t>(capacity - n);
  if (!params.max_tokens || *params.max_tokens > left) params.max_tokens = left;
  RETURN_IF_ERROR(params.Validate());
  if (max_waiting_ > 0 && engine_->Stats().waiting >= max_waiting_) {
    return ResourceExhausted("the server is overloaded (" + std::to_string(max_waiting_) +
                             " requests waiting); retry later");
  }
  engine::EngineRequest r;
  r.prompt = std::move(prompt);
  r.params = std::move(params);
  r.priority = priority;
  return r;
}

Result<engine::RequestHandle> ServedModel::Submit(std::vector<int32_t> prompt,
                                                  engine::SamplingParams params,
                                                  engine::Priority priority) const {
  ASSIGN_OR_RETURN(engine::EngineRequest r,
                   MakeRequest(std::move(prompt), std::move(params), priority));
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
  // Converted through double: a value past float's range is out of every
  // field's range, and converting it to float directly is undefined.
  const double v = body[key].get<double>();
  if (!(std::fabs(v) <= static_cast<double>(std::numeric_limits<float>::max()))) {
    return InvalidArgument(std::string("'") + key + "' is out of range");
  }
  *out = static_cast<float>(v);
  return Status::Ok();
}

}  // namespace

namespace {

// An integer field in [lo, hi]; a number with an integral value counts
// (clients write 100.0). Read in the type it was parsed as, and range
// checked before any conversion: converting 1e300 or 2^64 - 1 to a
// narrower integer is undefined or wraps into something else.
Status GetIntInRange(const json& body, const char* key, int64_t lo, int64_t hi,
                     std::optional<int64_t>* out) {
  if (!body.contains(key) || body[key].is_null()) return Status::Ok();
  const json& v = body[key];
  if (!v.is_number_integer() &&
      !(v.is_number_float() && v.get<double>() == std::floor(v.get<double>()))) {
    return InvalidArgument(std::string("'") + key + "' must be an integer");
  }
  auto out_of_range = [&] {
    return InvalidArgument(std::string("'") + key + "' is out of range (" + std::to_string(lo) +
                           " to " + std::to_string(hi) + ")");
  };
  int64_t x = 0;
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(hi)) return out_of_range();
    x = static_cast<int64_t>(u);
  } else if (v.is_number_integer()) {
    x = v.get<int64_t>();
  } else {
    const double d = v.get<double>();
    // [-2^63, 2^63) converts exactly; anything else is out of every range.
    if (!(d >= -9223372036854775808.0 && d < 9223372036854775808.0)) return out_of_range();
    x = static_cast<int64_t>(d);
  }
  if (x < lo && lo == 0) return InvalidArgument(std::string("'") + key + "' must not be negative");
  if (x < lo || x > hi) return out_of_range();
  *out = x;
  return Status::Ok();
}

}  // namespace

Status GetOptionalInt(const json& body, const char* key, std::optional<int64_t>* out) {
  return GetIntInRange(body, key, 0, std::numeric_limits<int64_t>::max(), out);
}

Status ParseSampling(const json& body, const char* stop_key, engine::SamplingParams* p) {
  RETURN_IF_ERROR(GetFloat(body, "temperature", &p->temperature));
  RETURN_IF_ERROR(GetFloat(body, "top_p", &p->top_p));
  RETURN_IF_ERROR(GetFloat(body, "min_p", &p->min_p));
  RETURN_IF_ERROR(GetFloat(body, "presence_penalty", &p->presence_penalty));
  RETURN_IF_ERROR(GetFloat(body, "frequency_penalty", &p->frequency_penalty));
  RETURN_IF_ERROR(GetFloat(body, "repetition_penalty", &p->repetition_penalty));
  std::optional<int64_t> top_k;
  RETURN_IF_ERROR(GetIntInRange(body, "top_k", -1, std::numeric_limits<int32_t>::max(), &top_k));
  if (top_k) p->top_k = static_cast<int32_t>(*top_k);
  if (body.contains("seed") && !body["seed"].is_null()) {
    // Any 64-bit pattern: a negative seed is taken modulo 2^64.
    const json& seed = body["seed"];
    if (seed.is_number_unsigned()) {
      p->seed = seed.get<uint64_t>();
    } else if (seed.is_number_integer()) {
      p->seed = static_cast<uint64_t>(seed.get<int64_t>());
    } else {
      return InvalidArgument("'seed' must be an integer");
    }
  }
  if (body.contains("ignore_eos") && !body["ignore_eos"].is_null()) {
    if (!body["ignore_eos"].is_boolean()) return InvalidArgument("'ignore_eos' must be a boolean");
    p->ignore_eos = body["ignore_eos"].get<bool>();
  }
  std::optional<int64_t> budget;
  RETURN_IF_ERROR(GetOptionalInt(body, "thinking_token_budget", &budget));
  if (budget) p->reasoning_budget = static_cast<int32_t>(std::min<int64_t>(*budget, INT32_MAX));
  if (body.contains("speculative") && !body["speculative"].is_null()) {
    if (!body["speculative"].is_boolean())
      return InvalidArgument("'speculative' must be a boolean");
    p->speculative = body["speculative"].get<bool>();
  }
  if (body.contains(stop_key) && !body[stop_key].is_null()) {
    const json& s = body[stop_key];
    if (s.is_string()) {
      if (!s.get<std::string>().empty()) p->stop.push_back(s.get<std::string>());
    } else if (s.is_array()) {
      // Bounded before anything is copied; duplicates count once.
      if (s.size() > engine::kMaxStopStrings) {
        return InvalidArgument(std::string("'") + stop_key + "' has " + std::to_string(s.size()) +
                               " entries; at most " + std::to_string(engine::kMaxStopStrings) +
                               " are allowed");
      }
      for (const json& e : s) {
        if (!e.is_string()) {
          return InvalidArgument(std::string("'") + stop_key +
                                 "' must be a string or a list of strings");
        }
        const std::string& v = e.get_ref<const std::string&>();
        if (!v.empty() && std::find(p->stop.begin(), p->stop.end(), v) == p->stop.end()) {
          p->stop.push_back(v);
        }
      }
    } else {
      return InvalidArgument(std::string("'") + stop_key +
                             "' must be a string or a list of strings");
    }
  }
  return Status::Ok();
}

}  // namespace agentkv::api
