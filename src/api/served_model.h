// ServedModel: what the protocol adapters need of the model being served:
// its name, tokenizer, chat template and engine, loaded together from a
// checkpoint directory. Also the request-level helpers every adapter shares
// (rendering a chat, submitting with a priority, mapping engine errors).
//
// Thread-safety: after Load, every member is read-only except the engine,
// whose public methods are thread-safe; share one ServedModel freely. The
// ServedModel owns its tokenizer and engine.
#pragma once

#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "api/http_types.h"
#include "engine/backend/backend_factory.h"
#include "engine/engine.h"
#include "engine/grammar/token_vocabulary.h"
#include "engine/text/chat/chat_template.h"
#include "engine/text/output/output_parser.h"
#include "engine/text/tokenizer.h"
#include "store/agent_store.h"

namespace agentkv::api {

struct ServedModelOptions {
  std::string model_dir;
  backend::BackendOptions backend;
  int max_batch = 64;
  int max_step_tokens = 0;  // tokens of one engine step; 0: the backend's default
  // A model swap or a shutdown lets running requests finish for this many
  // seconds, then cuts them off (their KV so far is saved first; clients
  // see the request cancelled). < 0: no limit.
  double drain_seconds = 30;
  // KV pool: this many bytes if > 0, else this share of the memory free
  // after loading (0: the backend's default; see engine/kv_pool_sizing.h).
  uint64_t kv_memory_bytes = 0;
  double kv_memory_fraction = 0;
  // Host-memory KV tier (EngineOptions::host_kv_memory_bytes); 0: none.
  // `serve` fills it from --host-kv-memory or DefaultHostKvMemoryBytes.
  uint64_t host_kv_memory_bytes = 0;
  // Restore or recompute (EngineOptions::split_restores, calibrate_prefill).
  bool split_restores = true;
  bool calibrate_prefill = false;
  // Speculative decoding from the context (EngineOptions::speculative);
  // `serve` fills it from --speculative.
  engine::SpeculativeOptions speculative;
  // Requests waiting in the engine past which new ones are refused
  // (ResourceExhausted: 429 / 529). 0: no limit.
  int max_waiting = 512;
  // The persistent store (--store), or null. Not owned: it outlives the
  // model (hot-swap serves several models from one store). KV is persisted
  // and restored under this model's fingerprint and KV format.
  store::AgentStore* store = nullptr;
  // false: history only; the engine keeps no KV tier (benchmarks compare).
  bool persist_kv = true;
};

class ServedModel {
 public:
  static Result<std::unique_ptr<ServedModel>> Load(const ServedModelOptions& options);

  const std::string& name() const { return name_; }
  const std::string& model_type() const { return model_type_; }
  const text::Tokenizer& tokenizer() const { return *tokenizer_; }
  engine::Engine& engine() const { return *engine_; }
  // The model's fingerprint (ModelFiles::Fingerprint, 32 hex digits).
  const std::string& fingerprint() const { return fingerprint_; }
  // The KV tier the engine persists to, or null without a store.
  cache::KvTier* kv_tier() const { return kv_tier_.get(); }
  int32_t max_context() const { return engine_->max_context(); }
  // The tokenizer's tokens arranged for grammar masks (constrained
  // decoding), built on first use (a fraction of a second) and then shared.
  std::shared_ptr<const grammar::TokenVocabulary> grammar_vocab() const;

  // Renders `messages` (OpenAI shape) with `tools` (OpenAI function schemas
  // or null) and the generation prompt (unless `add_generation_prompt` is
  // false), and tokenizes the result. `extra`: more template variables (e.g.
  // {"enable_thinking": false}). `text`, if not null, receives the rendered
  // text (reply reuse compares it with the agent's previous tokens).
  Result<std::vector<int32_t>> EncodeChat(
      const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
      const nlohmann::ordered_json& extra = nlohmann::ordered_json::object(),
      bool add_generation_prompt = true, std::string* text = nullptr) const;

  // The output parser for `model`'s family (OutputParserOptions::ForModelType
  // with its model_type), given the tokenizer a format that reads token ids
  // needs (harmony); that tokenizer keeps `model` alive. `prompt_text`: the
  // rendered chat prompt; where it ends inside an opened <think> block
  // (grammar::ThinkStartOf), the reply starts in reasoning
  // (ReasoningParserOptions::starts_in_reasoning). Empty: not known.
  static text::output::OutputParserOptions ParserOptions(
      const std::shared_ptr<const ServedModel>& model, bool tools,
      std::string_view prompt_text = {});

  // Priority from the X-Priority header, else the body's "priority", else
  // NORMAL; HIGH becomes NORMAL for a tenant not allowed it
  // (req.high_priority_allowed). InvalidArgument for an unknown name.
  static Result<engine::Priority> RequestPriority(const HttpRequest& req,
                                                  const nlohmann::json& body);

  // The engine request for a prompt: InvalidArgument when the prompt is
  // empty or leaves no room in the context (max_tokens is clamped to the
  // room left), ResourceExhausted when too many requests are waiting
  // already.
  Result<engine::EngineRequest> MakeRequest(std::vector<int32_t> prompt,
                                            engine::SamplingParams params,
                                            engine::Priority priority) const;
  // MakeRequest, then Engine::Submit.
  Result<engine::RequestHandle> Submit(std::vector<int32_t> prompt, engine::SamplingParams params,
                                       engine::Priority priority) const;

 private:
  ServedModel() = default;

  std::string name_;
  std::string model_type_;
  std::unique_ptr<text::Tokenizer> tokenizer_;
  std::optional<text::chat::ChatTemplate> template_;
  std::string fingerprint_;
  std::shared_ptr<cache::KvTier> kv_tier_;
  std::unique_ptr<engine::Engine> engine_;
  int max_waiting_ = 0;
  mutable std::once_flag grammar_vocab_once_;
  mutable std::shared_ptr<const grammar::TokenVocabulary> grammar_vocab_;
};

// The host-memory KV tier's size when --host-kv-memory is not given, from
// the host's available memory (/proc/meminfo MemAvailable): a quarter of
// it, at most 32 GiB (pinning more slows startup and starves the page
// cache the store reads through), and none when that is under 256 MiB.
uint64_t DefaultHostKvMemoryBytes(uint64_t mem_available_bytes);
// --host-kv-memory: bytes with an optional K/M/G/T suffix, or a share of
// `mem_available_bytes` ("0.25"; util/memory_size.h); "0" turns the tier
// off. InvalidArgument for anything else.
Result<uint64_t> ParseHostKvMemory(const std::string& text, uint64_t mem_available_bytes);

// HTTP status for an engine / request Status (400 for bad input, 413, 429,
// 500 otherwise).
int HttpStatusFor(const Status& s);

// Reads the sampling fields both protocols share into `p`: temperature,
// top_p, top_k, min_p, seed, presence_penalty, frequency_penalty,
// repetition_penalty, ignore_eos (a vLLM extension), thinking_token_budget
// (vLLM's name: SamplingParams::reasoning_budget, >= 0), speculative (false:
// this request opts out of speculative decoding), and stop strings from
// `stop_key` (string or list).
// InvalidArgument naming the field when one has the wrong type or is out of
// its range (top_k: -1 to 2^31 - 1; seed: any 64-bit integer).
Status ParseSampling(const nlohmann::json& body, const char* stop_key, engine::SamplingParams* p);

// Reads an optional non-negative integer field (a number with an integral
// value counts); InvalidArgument on a wrong type, a negative value or one
// past int64 (1e300, 2^64 - 1), never a wrapped or saturated value.
Status GetOptionalInt(const nlohmann::json& body, const char* key, std::optional<int64_t>* out);

}  // namespace agentkv::api
