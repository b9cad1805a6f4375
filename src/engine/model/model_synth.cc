#include "engine/model/model_synth.h"

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "engine/model/model_config.h"
#include "engine/model/safetensors_writer.h"
#include "engine/model/weight_spec.h"
#include "util/bf16.h"
#include "util/hash.h"

namespace agentkv::model {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using ojson = nlohmann::ordered_json;

constexpr uint64_t kGamma = 0x9e3779b97f4a7c15ull;

uint64_t Mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Output n of a splitmix64 stream started at `s`; random access is what lets
// chunks be generated in any order and in parallel.
inline uint64_t StreamAt(uint64_t s, uint64_t n) { return Mix(s + (n + 1) * kGamma); }

void Store(TensorDtype dtype, double v, uint8_t* out, uint64_t i) {
  switch (dtype) {
    case TensorDtype::kBF16: {
      uint16_t h = F32ToBf16(static_cast<float>(v));
      out[2 * i] = static_cast<uint8_t>(h);
      out[2 * i + 1] = static_cast<uint8_t>(h >> 8);
      break;
    }
    case TensorDtype::kF16: {
      uint16_t h = F32ToF16(static_cast<float>(v));
      out[2 * i] = static_cast<uint8_t>(h);
      out[2 * i + 1] = static_cast<uint8_t>(h >> 8);
      break;
    }
    case TensorDtype::kF32: {
      uint32_t u = std::bit_cast<uint32_t>(static_cast<float>(v));
      for (int b = 0; b < 4; ++b) out[4 * i + b] = static_cast<uint8_t>(u >> (8 * b));
      break;
    }
    case TensorDtype::kU8:
    case TensorDtype::kF8E4M3:
      break;  // not a synth dtype: quantized tensors go through model_synth_quant
  }
}

Result<json> ReadJson(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) return NotFound(p.string() + ": cannot open");
  std::stringstream ss;
  ss << in.rdbuf();
  try {
    return json::parse(ss.str());
  } catch (const json::exception& e) {
    return InvalidArgument(p.string() + ": not valid JSON: " + e.what());
  }
}

Status WriteText(const fs::path& p, const std::string& text) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  if (!out) return IoError(p.string() + ": write failed");
  return Status::Ok();
}

// Token content -> id, from tokenizer.json's added_tokens and model vocab.
struct TokenTable {
  std::map<std::string, int> ids;
  std::set<std::string> special;  // added tokens marked special
  int vocab_size = 0;
};

Result<TokenTable> ReadTokens(const fs::path& tokenizer_json) {
  std::ifstream in(tokenizer_json, std::ios::binary);
  if (!in) return NotFound(tokenizer_json.string() + ": cannot open");
  std::stringstream ss;
  ss << in.rdbuf();
  json tj;
  try {
    // The merges list is most of a BPE tokenizer.json and not needed here.
    tj = json::parse(ss.str(), [](int depth, json::parse_event_t event, json& parsed) {
      return !(depth == 2 && event == json::parse_event_t::key && parsed == "merges");
    });
  } catch (const json::exception& e) {
    return InvalidArgument(tokenizer_json.string() + ": not valid JSON: " + e.what());
  }
  TokenTable t;
  int max_id = -1;
  try {
    if (tj.contains("model") && tj["model"].contains("vocab")) {
      const json& v = tj["model"]["vocab"];
      if (v.is_object()) {
        for (auto it = v.begin(); it != v.end(); ++it) {
          int id = it.value().get<int>();
          t.ids.emplace(it.key(), id);
          max_id = std::max(max_id, id);
        }
      } else if (v.is_array()) {  // Unigram: [[piece, score], ...]
        for (size_t i = 0; i < v.size(); ++i) {
          if (v[i].is_array() && !v[i].empty() && v[i][0].is_string())
            t.ids.emplace(v[i][0].get<std::string>(), static_cast<int>(i));
        }
        max_id = std::max(max_id, static_cast<int>(v.size()) - 1);
      }
    }
    if (tj.contains("added_tokens") && tj["added_tokens"].is_array()) {
      for (const auto& a : tj["added_tokens"]) {
        int id = a.at("id").get<int>();
        std::string content = a.at("content").get<std::string>();
        t.ids[content] = id;
        if (a.value("special", false)) t.special.insert(content);
        max_id = std::max(max_id, id);
      }
    }
  } catch (const json::exception& e) {
    return InvalidArgument(tokenizer_json.string() + ": unexpected structure: " + e.what());
  }
  if (max_id < 0) return InvalidArgument(tokenizer_json.string() + ": no tokens in model.vocab");
  t.vocab_size = max_id + 1;
  return t;
}

// A special token in tokenizer_config.json: a string, {"content": ...} or null.
std::string SpecialContent(const json& cfg, const char* key) {
  auto it = cfg.find(key);
  if (it == cfg.end()) return "";
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string())
    return (*it)["content"].get<std::string>();
  return "";
}

struct ArchInfo {
  const char* arch_name;
  const char* model_type;
  double rope_theta;
  double rms_norm_eps;
  bool tie;
};

Result<ArchInfo> InfoFor(const std::string& arch) {
  if (arch == "llama") return ArchInfo{"LlamaForCausalLM", "llama", 500000.0, 1e-5, true};
  if (arch == "qwen2") return ArchInfo{"Qwen2ForCausalLM", "qwen2", 1000000.0, 1e-6, true};
  if (arch == "qwen3") return ArchInfo{"Qwen3ForCausalLM", "qwen3", 1000000.0, 1e-6, true};
  if (arch == "mistral") return ArchInfo{"MistralForCausalLM", "mistral", 1000000.0, 1e-5, false};
  if (arch == "gemma3") return ArchInfo{"Gemma3ForCausalLM", "gemma3_text", 1000000.0, 1e-6, true};
  if (arch == "gpt_oss") return ArchInfo{"GptOssForCausalLM", "gpt_oss", 150000.0, 1e-5, false};
  if (arch == "qwen3_moe")
    return ArchInfo{"Qwen3MoeForCausalLM", "qwen3_moe", 1000000.0, 1e-6, false};
  return InvalidArgument("--arch: unknown architecture \"" + arch +
                         "\" (one of llama, qwen2, qwen3, mistral, gemma3, gpt_oss, qwen3_moe)");
}

bool IsMoeArch(const std::string& arch) { return arch == "gpt_oss" || arch == "qwen3_moe"; }

// The mixture-of-experts configs, keyed as transformers 5 writes them
// (rope_parameters with rope_theta inside, dtype, num_local_experts;
// GPT-OSS's experts_per_token as its released config also has it).
Result<ojson> BuildMoeConfig(const SynthOptions& o, const ArchInfo& info, int vocab, int bos,
                             const std::vector<int>& eos) {
  const bool oss = o.arch == "gpt_oss";
  const int head_dim = o.head_dim > 0 ? o.head_dim : o.hidden / o.heads;
  const int experts = o.experts > 0 ? o.experts : 8;
  const int per_token = o.experts_per_token > 0 ? o.experts_per_token : (oss ? 4 : 2);
  if (per_token > experts)
    return InvalidArgument("--experts-per-token (" + std::to_string(per_token) +
                           ") must not exceed --experts (" + std::to_string(experts) + ")");
  if (oss && o.moe_intermediate > 0)
    return InvalidArgument("--moe-intermediate: gpt_oss's experts use --intermediate");
  json c;  // sorted keys, as transformers writes config.json
  c["architectures"] = {info.arch_name};
  c["model_type"] = info.model_type;
  c["vocab_size"] = vocab;
  c["hidden_size"] = o.hidden;
  c["num_hidden_layers"] = o.layers;
  c["num_attention_heads"] = o.heads;
  c["num_key_value_heads"] = o.kv_heads;
  c["head_dim"] = head_dim;
  c["max_position_embeddings"] = o.max_position;
  c["rms_norm_eps"] = info.rms_norm_eps;
  c["hidden_act"] = "silu";
  c["attention_dropout"] = 0.0;
  c["initializer_range"] = 0.02;
  c["tie_word_embeddings"] = o.tie.value_or(info.tie);
  c["dtype"] = std::string(TensorDtypeTorchName(o.dtype));
  c["use_cache"] = true;
  c["num_local_experts"] = experts;
  c["num_experts_per_tok"] = per_token;
  c["output_router_logits"] = false;
  c["bos_token_id"] = bos >= 0 ? json(bos) : json(nullptr);
  c["eos_token_id"] = eos.size() == 1 ? json(eos[0]) : json(eos);
  c["pad_token_id"] = nullptr;
  const double theta = o.rope_theta > 0 ? o.rope_theta : info.rope_theta;
  if (oss) {
    const int window = o.sliding_window > 0 ? o.sliding_window : 128;
    c["intermediate_size"] = o.intermediate > 0 ? o.intermediate : o.hidden;
    c["experts_per_token"] = per_token;
    c["attention_bias"] = true;
    c["sliding_window"] = window;
    std::vector<std::string> types;
    for (int i = 0; i < o.layers; ++i)
      types.push_back(i % 2 == 0 ? "sliding_attention" : "full_attention");
    c["layer_types"] = types;
    c["swiglu_limit"] = 7.0;
    c["router_aux_loss_coef"] = 0.9;
    c["initial_context_length"] = 4096;
    c["rope_parameters"] = {{"rope_type", "yarn"},
                            {"rope_theta", theta},
                            {"factor", 32.0},
                            {"beta_fast", 32.0},
                            {"beta_slow", 1.0},
                            {"truncate", false},
                            {"original_max_position_embeddings", 4096}};
  } else {
    if (o.sliding_window > 0)
      return InvalidArgument("--sliding-window: qwen3_moe is synthesized without sliding windows");
    c["intermediate_size"] = o.intermediate > 0 ? o.intermediate : 3 * o.hidden;
    c["moe_intermediate_size"] = o.moe_intermediate > 0 ? o.moe_intermediate : o.hidden;
    c["norm_topk_prob"] = true;
    c["decoder_sparse_step"] = 1;
    c["mlp_only_layers"] = json::array();
    c["attention_bias"] = false;
    c["use_sliding_window"] = false;
    c["sliding_window"] = nullptr;
    c["max_window_layers"] = o.layers;
    c["router_aux_loss_coef"] = 0.001;
    c["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", theta}};
  }
  return ojson::parse(c.dump());
}

Result<ojson> BuildConfig(const SynthOptions& o, const ArchInfo& info, int vocab, int bos,
                          const std::vector<int>& eos) {
  if (IsMoeArch(o.arch)) return BuildMoeConfig(o, info, vocab, bos, eos);
  const bool gemma = o.arch == "gemma3";
  const int head_dim = o.head_dim > 0 ? o.head_dim : o.hidden / o.heads;
  ojson c;
  c["architectures"] = {info.arch_name};
  c["model_type"] = info.model_type;
  c["vocab_size"] = vocab;
  c["hidden_size"] = o.hidden;
  c["intermediate_size"] = o.intermediate > 0 ? o.intermediate : 3 * o.hidden;
  c["num_hidden_layers"] = o.layers;
  c["num_attention_heads"] = o.heads;
  c["num_key_value_heads"] = o.kv_heads;
  c["head_dim"] = head_dim;
  c["max_position_embeddings"] = o.max_position;
  c["rms_norm_eps"] = info.rms_norm_eps;
  if (gemma) {
    c["hidden_activation"] = "gelu_pytorch_tanh";
  } else {
    c["hidden_act"] = "silu";
  }
  c["rope_theta"] = o.rope_theta > 0 ? o.rope_theta : info.rope_theta;
  c["rope_scaling"] = nullptr;
  c["attention_bias"] = o.arch == "qwen2";
  c["attention_dropout"] = 0.0;
  c["initializer_range"] = 0.02;
  c["tie_word_embeddings"] = o.tie.value_or(info.tie);
  c["torch_dtype"] = std::string(TensorDtypeTorchName(o.dtype));
  c["use_cache"] = true;
  if (bos >= 0) {
    c["bos_token_id"] = bos;
  } else {
    c["bos_token_id"] = nullptr;
  }
  if (eos.size() == 1) {
    c["eos_token_id"] = eos[0];
  } else {
    c["eos_token_id"] = eos;
  }

  const int window = o.sliding_window > 0 ? o.sliding_window : (gemma ? 512 : 0);
  if (o.arch == "llama" && window > 0)
    return InvalidArgument("--sliding-window: llama has no sliding-window attention");
  if (o.arch == "mistral") {
    c["sliding_window"] = window > 0 ? json(window) : json(nullptr);
  } else if (o.arch == "qwen2" || o.arch == "qwen3") {
    c["use_sliding_window"] = window > 0;
    c["sliding_window"] = window > 0 ? json(window) : json(nullptr);
    c["max_window_layers"] = window > 0 ? 0 : o.layers;
  } else if (gemma) {
    const int pattern = 6;
    c["sliding_window"] = window;
    c["sliding_window_pattern"] = pattern;
    std::vector<std::string> types;
    for (int i = 0; i < o.layers; ++i)
      types.push_back((i + 1) % pattern == 0 ? "full_attention" : "sliding_attention");
    c["layer_types"] = types;
    c["rope_local_base_freq"] = 10000.0;
    c["query_pre_attn_scalar"] = head_dim;
    c["final_logit_softcapping"] = nullptr;
    c["attn_logit_softcapping"] = nullptr;
  }
  return c;
}

Status CheckSizes(const SynthOptions& o) {
  struct Opt {
    const char* flag;
    int value;
  };
  for (Opt p : {Opt{"--layers", o.layers},
                {"--hidden", o.hidden},
                {"--heads", o.heads},
                {"--kv-heads", o.kv_heads},
                {"--max-position", o.max_position}})
    if (p.value <= 0) return InvalidArgument(std::string(p.flag) + " must be > 0");
  for (Opt p : {Opt{"--head-dim", o.head_dim},
                {"--intermediate", o.intermediate},
                {"--vocab", o.vocab},
                {"--sliding-window", o.sliding_window},
                {"--experts", o.experts},
                {"--experts-per-token", o.experts_per_token},
                {"--moe-intermediate", o.moe_intermediate}})
    if (p.value < 0) return InvalidArgument(std::string(p.flag) + " must be >= 0");
  if (!IsMoeArch(o.arch) && (o.experts > 0 || o.experts_per_token > 0 || o.moe_intermediate > 0))
    return InvalidArgument(
        "--experts, --experts-per-token and --moe-intermediate are for "
        "gpt_oss and qwen3_moe only");
  if (o.heads % o.kv_heads != 0) return InvalidArgument("--kv-heads must divide --heads");
  if (o.head_dim == 0 && o.hidden % o.heads != 0)
    return InvalidArgument("--hidden must be a multiple of --heads unless --head-dim is given");
  return Status::Ok();
}

// The constant feature of SynthOptions::eos_bias, on the elements
// [first, first + count) of weight `w` held in `out`.
void ApplyEosBias(const WeightSpec& w, const ModelConfig& mc, int eos, double bias,
                  TensorDtype dtype, uint64_t first, uint64_t count, void* out) {
  const auto ends_with = [&](std::string_view suffix) {
    return w.name.size() >= suffix.size() &&
           w.name.compare(w.name.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  const uint64_t feature = static_cast<uint64_t>(mc.hidden_size) - 1;
  auto* bytes = static_cast<uint8_t*>(out);
  // Whatever writes into the residual stream leaves the feature alone: in
  // GPT-OSS also o_proj's bias and the experts' down projections ([E, I, H],
  // the hidden dimension last) and their biases ([E, H]).
  if (ends_with("o_proj.bias") || ends_with("mlp.experts.down_proj") ||
      ends_with("mlp.experts.down_proj_bias")) {
    const auto h = static_cast<uint64_t>(mc.hidden_size);
    for (uint64_t e = first; e < first + count; ++e)
      if (e % h == feature) Store(dtype, 0.0, bytes, e - first);
    return;
  }
  if (w.shape.size() != 2) return;
  const auto cols = static_cast<uint64_t>(w.shape[1]);
  for (uint64_t e = first; e < first + count; ++e) {
    const uint64_t row = e / cols, col = e % cols;
    if (w.name == "model.embed_tokens.weight") {
      if (col == feature) Store(dtype, 1.0, bytes, e - first);
    } else if (w.name == "lm_head.weight") {
      if (col == feature)
        Store(dtype, row == static_cast<uint64_t>(eos) ? bias : 0.0, bytes, e - first);
    } else if (ends_with("o_proj.weight") || ends_with("down_proj.weight")) {
      if (row == feature) Store(dtype, 0.0, bytes, e - first);
    }
  }
}

}  // namespace

void SynthFill(uint64_t seed, const std::string& name, TensorDtype dtype, double mean,
               double stddev, uint64_t first, uint64_t count, void* out) {
  const uint64_t s = Mix(seed ^ Xxh3_64(name));
  uint8_t* bytes = static_cast<uint8_t*>(out);
  constexpr double kTwoPi = 6.283185307179586476925286766559;
  constexpr double k2Pow53 = 1.0 / 9007199254740992.0;
  // Elements 2p and 2p+1 are the cosine and sine halves of one Box-Muller
  // pair drawn from stream outputs 2p and 2p+1.
  const int64_t p_begin = static_cast<int64_t>(first / 2);
  const int64_t p_end = static_cast<int64_t>((first + count + 1) / 2);
#pragma omp parallel for schedule(static) if (count > (1u << 16))
  for (int64_t p = p_begin; p < p_end; ++p) {
    const uint64_t up = static_cast<uint64_t>(p);
    double u1 = static_cast<double>((StreamAt(s, 2 * up) >> 11) + 1) * k2Pow53;  // (0, 1]
    double u2 = static_cast<double>(StreamAt(s, 2 * up + 1) >> 11) * k2Pow53;    // [0, 1)
    double r = std::sqrt(-2.0 * std::log(u1)) * stddev;
    double a = kTwoPi * u2;
    uint64_t e0 = 2 * up, e1 = 2 * up + 1;
    if (e0 >= first && e0 < first + count) Store(dtype, mean + r * std::cos(a), bytes, e0 - first);
    if (e1 >= first && e1 < first + count) Store(dtype, mean + r * std::sin(a), bytes, e1 - first);
  }
}

Result<int> TokenizerVocabSize(const fs::path& tokenizer_json) {
  ASSIGN_OR_RETURN(TokenTable t, ReadTokens(tokenizer_json));
  return t.vocab_size;
}

Status SynthesizeModel(const SynthOptions& o, const SynthProgress& progress) {
  ASSIGN_OR_RETURN(ArchInfo info, InfoFor(o.arch));
  RETURN_IF_ERROR(CheckSizes(o));
  const fs::path tok_json = o.tokenizer_dir / "tokenizer.json";
  const fs::path tok_cfg = o.tokenizer_dir / "tokenizer_config.json";
  ASSIGN_OR_RETURN(TokenTable tokens, ReadTokens(tok_json));
  ASSIGN_OR_RETURN(json tcfg, ReadJson(tok_cfg));
  if (!tcfg.is_object()) return InvalidArgument(tok_cfg.string() + ": not a JSON object");

  int vocab = o.vocab > 0 ? o.vocab : tokens.vocab_size;
  if (vocab < tokens.vocab_size)
    return InvalidArgument("--vocab " + std::to_string(vocab) + " is smaller than the " +
                           "tokenizer's " + std::to_string(tokens.vocab_size) + " (" +
                           tok_json.string() + ")");

  auto id_of = [&](const std::string& content) {
    auto it = tokens.ids.find(content);
    return it == tokens.ids.end() ? -1 : it->second;
  };
  int bos = id_of(SpecialContent(tcfg, "bos_token"));
  std::vector<int> eos;
  if (int e = id_of(SpecialContent(tcfg, "eos_token")); e >= 0) eos.push_back(e);
  // Chat models stop on their end-of-turn token (the tokenizer's eos_token)
  // and also on the end-of-document token; list those the tokenizer has.
  // GPT-OSS (harmony) also ends a turn on a tool call, <|call|>.
  for (const char* extra :
       {"<|endoftext|>", "<|end_of_text|>", "<|eom_id|>", "<eos>", "<|call|>"}) {
    int e = tokens.special.count(extra) ? id_of(extra) : -1;
    if (e >= 0 && std::find(eos.begin(), eos.end(), e) == eos.end()) eos.push_back(e);
  }
  if (eos.empty())
    return InvalidArgument(tok_cfg.string() + ": no eos_token found in the tokenizer");

  if (o.eos_bias < 0) return InvalidArgument("--eos-bias must be >= 0");
  if (o.lm_head_std < 0) return InvalidArgument("--lm-head-std must be >= 0");
  const bool own_head = o.eos_bias > 0 || o.lm_head_std > 0;
  if (own_head && o.tie.value_or(false))
    return InvalidArgument("--eos-bias and --lm-head-std need an untied LM head (drop --tie)");
  SynthOptions eff = o;
  if (own_head) eff.tie = false;
  ASSIGN_OR_RETURN(ojson cfg, BuildConfig(eff, info, vocab, bos, eos));
  RETURN_IF_ERROR(CheckSynthQuant(o.quant, o.arch));
  if (o.quant != SynthQuant::kNone) cfg["quantization_config"] = SynthQuantConfig(o.quant);
  // Round-trip through our own loader so a synthesized model always loads.
  ASSIGN_OR_RETURN(ModelConfig mc, ModelConfig::FromJsonText(cfg.dump(), "synthesized config"));

  std::error_code ec;
  fs::create_directories(o.out_dir, ec);
  if (ec) return IoError(o.out_dir.string() + ": cannot create: " + ec.message());

  // The logical (unquantized) tensors; those `o.quant` stores quantized are
  // declared as their stored tensors below, and the result is checked
  // against the weight spec of the quantized config at the end.
  ModelConfig logical = mc;
  logical.quant = QuantConfig{};
  const std::vector<WeightSpec> specs = ExpectedWeights(logical);
  SafetensorsWriter writer(o.out_dir / "model.safetensors");
  // Quantized weights are stored [.., out, in]; GPT-OSS's bf16 experts are
  // [E, in, out], so theirs is the transpose.
  auto quant_shape = [](const WeightSpec& w, QuantFormat f) {
    std::vector<int64_t> s = w.shape;
    if (f == QuantFormat::kMxfp4 && s.size() == 3) std::swap(s[1], s[2]);
    return s;
  };
  for (const auto& w : specs) {
    QuantFormat qf;
    if (SynthQuantizes(o.quant, w, &qf)) {
      RETURN_IF_ERROR(DeclareQuantized(writer, w.name, quant_shape(w, qf), qf));
    } else {
      RETURN_IF_ERROR(writer.Add(w.name, o.dtype, w.shape));
    }
  }
  RETURN_IF_ERROR(writer.Begin());
  const uint64_t total = writer.data_bytes();
  const size_t esize = TensorDtypeSize(o.dtype);
  constexpr uint64_t kChunk = 4u << 20;  // elements per write
  std::vector<uint8_t> buf(std::min<uint64_t>(kChunk, 1u << 20) * esize);
  uint64_t done = 0;
  for (const auto& w : specs) {
    double mean = 0, stddev = 0.02;
    if (w.name == "lm_head.weight" && o.lm_head_std > 0) stddev = o.lm_head_std;
    if (w.role == WeightRole::kNorm) {
      mean = mc.gemma_norm ? 0.0 : 1.0;
      stddev = 0.1;
    }
    const uint64_t n = static_cast<uint64_t>(NumElements(w.shape));
    if (QuantFormat qf; SynthQuantizes(o.quant, w, &qf)) {
      const std::vector<int64_t> qs = quant_shape(w, qf);
      // (Not `qs != w.shape`: a square expert matrix is transposed too.)
      const bool transposed = qf == QuantFormat::kMxfp4 && w.shape.size() == 3;
      // Transposed ([E, in, out] drawn, [E, out, in] stored): one expert's
      // draws at a time, eos bias applied in the drawn layout.
      std::vector<float> drawn;
      int64_t drawn_expert = -1;
      SynthValues values = [&](uint64_t first, uint64_t count, float* out) {
        if (!transposed) {
          SynthFill(o.seed, w.name, TensorDtype::kF32, mean, stddev, first, count, out);
          if (o.eos_bias > 0)
            ApplyEosBias(w, mc, eos[0], o.eos_bias, TensorDtype::kF32, first, count, out);
          return;
        }
        const uint64_t rows = qs[1], cols = qs[2], per = rows * cols;
        for (uint64_t i = first; i < first + count; ++i) {
          const uint64_t e = i / per, row = i / cols % rows, col = i % cols;
          if (static_cast<int64_t>(e) != drawn_expert) {
            drawn.resize(per);
            SynthFill(o.seed, w.name, TensorDtype::kF32, mean, stddev, e * per, per, drawn.data());
            if (o.eos_bias > 0)
              ApplyEosBias(w, mc, eos[0], o.eos_bias, TensorDtype::kF32, e * per, per,
                           drawn.data());
            drawn_expert = static_cast<int64_t>(e);
          }
          // Element (e, row, col) of [E, out, in] is (e, col, row) of the draws.
          out[i - first] = drawn[col * rows + row];
        }
      };
      ASSIGN_OR_RETURN(uint64_t bytes, WriteQuantized(writer, qs, qf, values));
      done += bytes;
      if (progress) progress(done, total);
      continue;
    }
    for (uint64_t first = 0; first < n; first += kChunk) {
      uint64_t count = std::min(kChunk, n - first);
      if (buf.size() < count * esize) buf.resize(count * esize);
      SynthFill(o.seed, w.name, o.dtype, mean, stddev, first, count, buf.data());
      if (o.eos_bias > 0)
        ApplyEosBias(w, mc, eos[0], o.eos_bias, o.dtype, first, count, buf.data());
      RETURN_IF_ERROR(writer.Append(buf.data(), count * esize));
      done += count * esize;
      if (progress) progress(done, total);
    }
  }
  RETURN_IF_ERROR(writer.Finish());
  {
    ASSIGN_OR_RETURN(Safetensors written, Safetensors::Open(o.out_dir / "model.safetensors"));
    RETURN_IF_ERROR(ValidateWeights(mc, written, o.dtype));
  }

  ojson gen;
  if (bos >= 0) gen["bos_token_id"] = bos;
  gen["eos_token_id"] = eos;
  RETURN_IF_ERROR(WriteText(o.out_dir / "generation_config.json", gen.dump(2) + "\n"));
  std::vector<fs::path> copies = {tok_json, tok_cfg};
  // A template file beside the tokenizer (GPT-OSS's harmony template) is the
  // model's template; a checkpoint keeps it as chat_template.jinja.
  if (fs::exists(o.tokenizer_dir / "chat_template.jinja", ec))
    copies.push_back(o.tokenizer_dir / "chat_template.jinja");
  else
    fs::remove(o.out_dir / "chat_template.jinja", ec);  // a stale one would take precedence
  for (const fs::path& src : copies) {
    fs::copy_file(src, o.out_dir / src.filename(), fs::copy_options::overwrite_existing, ec);
    if (ec)
      return IoError(src.string() + ": cannot copy to " + o.out_dir.string() + ": " + ec.message());
  }
  // config.json last: a directory with a config.json is a complete checkpoint.
  return WriteText(o.out_dir / "config.json", cfg.dump(2) + "\n");
}

}  // namespace agentkv::model
