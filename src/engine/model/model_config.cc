#include "engine/model/model_config.h"

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace agentkv::model {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

// Reads typed fields of one JSON object; every error names the source file
// and the field's dotted path.
class Reader {
 public:
  Reader(const json& obj, std::string src, std::string prefix = "")
      : obj_(obj), src_(std::move(src)), prefix_(std::move(prefix)) {}

  bool Has(const char* key) const {
    auto it = obj_.find(key);
    return it != obj_.end() && !it->is_null();
  }
  const json* Find(const char* key) const {
    auto it = obj_.find(key);
    return it == obj_.end() || it->is_null() ? nullptr : &*it;
  }
  std::string Path(const char* key) const { return prefix_ + key; }
  Status Error(const char* key, const std::string& what) const {
    return InvalidArgument(src_ + ": field " + Path(key) + " " + what);
  }

  // Leaves *out untouched when the field is absent or null, unless required.
  Status Int(const char* key, int* out, bool required = false) const {
    const json* v = Find(key);
    if (v == nullptr) return required ? Missing(key) : Status::Ok();
    if (v->is_number_integer()) {
      int64_t i = v->get<int64_t>();
      if (i < INT32_MIN || i > INT32_MAX) return Error(key, "is out of range: " + v->dump());
      *out = static_cast<int>(i);
      return Status::Ok();
    }
    if (v->is_number_float()) {
      double d = v->get<double>();
      if (d == std::floor(d) && std::fabs(d) < 2e9) {
        *out = static_cast<int>(d);
        return Status::Ok();
      }
    }
    return Error(key, "must be an integer, got " + v->dump());
  }
  Status Float(const char* key, float* out, bool required = false) const {
    const json* v = Find(key);
    if (v == nullptr) return required ? Missing(key) : Status::Ok();
    if (!v->is_number()) return Error(key, "must be a number, got " + v->dump());
    *out = v->get<float>();
    return Status::Ok();
  }
  Status Bool(const char* key, bool* out) const {
    const json* v = Find(key);
    if (v == nullptr) return Status::Ok();
    if (!v->is_boolean()) return Error(key, "must be true or false, got " + v->dump());
    *out = v->get<bool>();
    return Status::Ok();
  }
  Status String(const char* key, std::string* out, bool required = false) const {
    const json* v = Find(key);
    if (v == nullptr) return required ? Missing(key) : Status::Ok();
    if (!v->is_string()) return Error(key, "must be a string, got " + v->dump());
    *out = v->get<std::string>();
    return Status::Ok();
  }
  // An int or a list of ints, appended to *out (duplicates skipped).
  Status IntList(const char* key, std::vector<int32_t>* out) const {
    const json* v = Find(key);
    if (v == nullptr) return Status::Ok();
    auto add = [&](const json& e) -> Status {
      if (!e.is_number_integer()) return Error(key, "must be an integer or a list of integers");
      int32_t id = e.get<int32_t>();
      for (int32_t x : *out)
        if (x == id) return Status::Ok();
      out->push_back(id);
      return Status::Ok();
    };
    if (v->is_array()) {
      for (const auto& e : *v) RETURN_IF_ERROR(add(e));
      return Status::Ok();
    }
    return add(*v);
  }

 private:
  Status Missing(const char* key) const {
    return InvalidArgument(src_ + ": missing required field " + Path(key));
  }

  const json& obj_;
  std::string src_;
  std::string prefix_;
};

// One rope object: a transformers-5 rope_parameters entry or a classic
// rope_scaling. rope_theta is read when present (only rope_parameters has it).
Status ParseRope(const json& o, const std::string& src, const std::string& path, RopeSpec* r) {
  if (!o.is_object()) return InvalidArgument(src + ": field " + path + " must be an object");
  Reader rd(o, src, path + ".");
  RETURN_IF_ERROR(rd.Float("rope_theta", &r->theta));
  std::string type = "default";
  // Older configs spell it "type"; "rope_type" wins when both are present.
  RETURN_IF_ERROR(rd.String("type", &type));
  RETURN_IF_ERROR(rd.String("rope_type", &type));
  if (type == "default") {
    r->type = "default";
  } else if (type == "linear") {
    r->type = "linear";
    RETURN_IF_ERROR(rd.Float("factor", &r->factor, /*required=*/true));
  } else if (type == "llama3") {
    r->type = "llama3";
    RETURN_IF_ERROR(rd.Float("factor", &r->factor, true));
    RETURN_IF_ERROR(rd.Float("low_freq_factor", &r->low_freq_factor, true));
    RETURN_IF_ERROR(rd.Float("high_freq_factor", &r->high_freq_factor, true));
    RETURN_IF_ERROR(rd.Int("original_max_position_embeddings", &r->original_max_position, true));
  } else if (type == "yarn") {
    r->type = "yarn";
    // Absent factor / original context: filled in by ParseRopeAll from
    // max_position_embeddings, as transformers does (0 marks them unset).
    r->factor = 0.0f;
    r->original_max_position = 0;
    RETURN_IF_ERROR(rd.Float("factor", &r->factor));
    RETURN_IF_ERROR(rd.Int("original_max_position_embeddings", &r->original_max_position));
    RETURN_IF_ERROR(rd.Float("beta_fast", &r->beta_fast));
    RETURN_IF_ERROR(rd.Float("beta_slow", &r->beta_slow));
    RETURN_IF_ERROR(rd.Bool("truncate", &r->truncate));
    RETURN_IF_ERROR(rd.Float("attention_factor", &r->attention_factor));
    RETURN_IF_ERROR(rd.Float("mscale", &r->mscale));
    RETURN_IF_ERROR(rd.Float("mscale_all_dim", &r->mscale_all_dim));
    if (r->attention_factor < 0)
      return InvalidArgument(src + ": field " + path + ".attention_factor must be >= 0");
    if (r->original_max_position < 0)
      return InvalidArgument(src + ": field " + path +
                             ".original_max_position_embeddings must be > 0");
    return Status::Ok();
  } else {
    return Unimplemented(src + ": field " + path + ".rope_type: unsupported rope type \"" + type +
                         "\" (supported: default, linear, llama3, yarn)");
  }
  if (r->factor <= 0) return InvalidArgument(src + ": field " + path + ".factor must be > 0");
  return Status::Ok();
}

Result<Architecture> ArchFromName(const std::string& name) {
  if (name == "LlamaForCausalLM") return Architecture::kLlama;
  if (name == "Qwen2ForCausalLM") return Architecture::kQwen2;
  if (name == "Qwen3ForCausalLM") return Architecture::kQwen3;
  if (name == "MistralForCausalLM") return Architecture::kMistral;
  if (name == "Gemma3ForCausalLM") return Architecture::kGemma3;
  if (name == "GptOssForCausalLM") return Architecture::kGptOss;
  if (name == "Qwen3MoeForCausalLM") return Architecture::kQwen3Moe;
  return InvalidArgument("unsupported architecture " + name);
}

std::string ArchFromModelType(const std::string& model_type) {
  if (model_type == "llama") return "LlamaForCausalLM";
  if (model_type == "qwen2") return "Qwen2ForCausalLM";
  if (model_type == "qwen3") return "Qwen3ForCausalLM";
  if (model_type == "mistral") return "MistralForCausalLM";
  if (model_type == "gemma3_text") return "Gemma3ForCausalLM";
  if (model_type == "gpt_oss") return "GptOssForCausalLM";
  if (model_type == "qwen3_moe") return "Qwen3MoeForCausalLM";
  return "";
}

Status ParseLayerKinds(const Reader& rd, const std::string& src, ModelConfig* c) {
  const int n = c->num_layers;
  c->layer_kinds.assign(n, cache::AttentionKind::kFull);
  c->layer_windows.assign(n, 0);
  int window = 0;
  std::vector<bool> sliding(n, false);

  if (const json* lt = rd.Find("layer_types")) {
    if (!lt->is_array() || static_cast<int>(lt->size()) != n)
      return rd.Error("layer_types", "must be a list of " + std::to_string(n) + " strings");
    for (int i = 0; i < n; ++i) {
      const json& e = (*lt)[i];
      if (e == "sliding_attention") {
        sliding[i] = true;
      } else if (e != "full_attention") {
        return rd.Error("layer_types", "has unsupported entry " + e.dump());
      }
    }
  } else {
    switch (c->arch) {
      case Architecture::kLlama:
        break;
      case Architecture::kMistral:
        if (rd.Has("sliding_window")) sliding.assign(n, true);
        break;
      case Architecture::kGptOss:  // GptOssConfig's default: even layers slide
        for (int i = 0; i < n; ++i) sliding[i] = i % 2 == 0;
        break;
      case Architecture::kQwen2:
      case Architecture::kQwen3:
      case Architecture::kQwen3Moe: {
        bool use = false;
        RETURN_IF_ERROR(rd.Bool("use_sliding_window", &use));
        if (use) {
          int max_window_layers = 0;
          RETURN_IF_ERROR(rd.Int("max_window_layers", &max_window_layers));
          for (int i = max_window_layers; i < n; ++i) sliding[i] = true;
        }
        break;
      }
      case Architecture::kGemma3: {
        int pattern = 6;
        RETURN_IF_ERROR(rd.Int("sliding_window_pattern", &pattern));
        if (pattern <= 0) return rd.Error("sliding_window_pattern", "must be > 0");
        for (int i = 0; i < n; ++i) sliding[i] = (i + 1) % pattern != 0;
        break;
      }
    }
  }
  bool any = false;
  for (bool s : sliding) any = any || s;
  if (!any) return Status::Ok();
  if (c->arch == Architecture::kGemma3) window = 4096;  // Gemma3TextConfig's default
  if (c->arch == Architecture::kGptOss) window = 128;   // GptOssConfig's default
  RETURN_IF_ERROR(rd.Int("sliding_window", &window));
  if (window <= 0)
    return InvalidArgument(src + ": field sliding_window must be a positive integer when " +
                           "layers use sliding-window attention");
  for (int i = 0; i < n; ++i) {
    if (!sliding[i]) continue;
    c->layer_kinds[i] = cache::AttentionKind::kSliding;
    c->layer_windows[i] = window;
  }
  return Status::Ok();
}

Status ParseRopeAll(const Reader& rd, const std::string& src, ModelConfig* c) {
  const bool gemma = c->arch == Architecture::kGemma3;
  c->rope = RopeSpec();
  c->rope_local = RopeSpec();
  if (gemma) c->rope.theta = 1000000.0f;  // Gemma3TextConfig's default
  if (c->arch == Architecture::kGptOss && !rd.Has("rope_scaling") && !rd.Has("rope_parameters")) {
    // GptOssConfig's defaults (every released config spells them out).
    c->rope.theta = 150000.0f;
    c->rope.type = "yarn";
    c->rope.factor = 32.0f;
    c->rope.original_max_position = 4096;
    c->rope.truncate = false;
  }
  RETURN_IF_ERROR(rd.Float("rope_theta", &c->rope.theta));
  if (const json* rs = rd.Find("rope_scaling")) {
    RETURN_IF_ERROR(ParseRope(*rs, src, "rope_scaling", &c->rope));
  }
  if (gemma) RETURN_IF_ERROR(rd.Float("rope_local_base_freq", &c->rope_local.theta));

  if (const json* rp = rd.Find("rope_parameters")) {
    if (!rp->is_object()) return rd.Error("rope_parameters", "must be an object");
    // transformers 5 keys Gemma 3's parameters by layer type.
    bool per_type = rp->contains("full_attention") || rp->contains("sliding_attention");
    if (per_type) {
      if (auto it = rp->find("full_attention"); it != rp->end())
        RETURN_IF_ERROR(ParseRope(*it, src, "rope_parameters.full_attention", &c->rope));
      if (auto it = rp->find("sliding_attention"); it != rp->end())
        RETURN_IF_ERROR(ParseRope(*it, src, "rope_parameters.sliding_attention",
                                  gemma ? &c->rope_local : &c->rope));
    } else {
      RETURN_IF_ERROR(ParseRope(*rp, src, "rope_parameters", &c->rope));
    }
  }
  for (RopeSpec* r : {&c->rope, &c->rope_local}) {
    if (r->type != "yarn") continue;
    // transformers: the original context defaults to max_position_embeddings,
    // and the factor to the ratio of the two.
    if (r->original_max_position == 0) r->original_max_position = c->max_position_embeddings;
    if (r->factor == 0.0f)
      r->factor = static_cast<float>(c->max_position_embeddings) /
                  static_cast<float>(r->original_max_position);
    if (r->factor <= 0) return InvalidArgument(src + ": rope factor must be > 0");
  }
  if (!gemma) c->rope_local = c->rope;
  if (c->rope.theta <= 0 || c->rope_local.theta <= 0)
    return InvalidArgument(src + ": field rope_theta must be > 0");
  return Status::Ok();
}

// The experts of GPT-OSS and Qwen3-MoE. Both spellings of the expert count
// load: num_local_experts (GPT-OSS, and what transformers 5 writes for
// Qwen3-MoE) and num_experts (the released Qwen3-MoE configs).
Status ParseMoe(const Reader& rd, ModelConfig* c) {
  MoeSpec& m = c->moe;
  m = MoeSpec();
  const bool oss = c->arch == Architecture::kGptOss;
  int local = 0, experts = 0;
  RETURN_IF_ERROR(rd.Int("num_local_experts", &local));
  RETURN_IF_ERROR(rd.Int("num_experts", &experts));
  if (local > 0 && experts > 0 && local != experts)
    return rd.Error("num_experts", "(" + std::to_string(experts) +
                                       ") disagrees with num_local_experts (" +
                                       std::to_string(local) + ")");
  m.num_experts = local > 0 ? local : experts;
  if (!rd.Has("num_local_experts") && !rd.Has("num_experts"))
    return rd.Error("num_local_experts", "(or num_experts) is required for a mixture of experts");
  if (m.num_experts <= 0) return rd.Error("num_local_experts", "must be > 0");
  m.experts_per_token = oss ? 4 : 8;  // the configs' defaults
  if (oss) RETURN_IF_ERROR(rd.Int("experts_per_token", &m.experts_per_token));
  RETURN_IF_ERROR(rd.Int("num_experts_per_tok", &m.experts_per_token));
  if (m.experts_per_token <= 0 || m.experts_per_token > m.num_experts)
    return rd.Error("num_experts_per_tok", "must be between 1 and the number of experts (" +
                                               std::to_string(m.num_experts) + ")");
  if (oss) {
    m.expert_intermediate = c->intermediate_size;
    m.routing = MoeRouting::kTopKThenSoftmax;
    m.router_bias = true;
    m.expert_bias = true;
    m.swiglu_limit = 7.0f;
    RETURN_IF_ERROR(rd.Float("swiglu_limit", &m.swiglu_limit));
    if (m.swiglu_limit <= 0) return rd.Error("swiglu_limit", "must be > 0");
    return Status::Ok();
  }
  m.routing = MoeRouting::kSoftmaxThenTopK;
  RETURN_IF_ERROR(rd.Int("moe_intermediate_size", &m.expert_intermediate, /*required=*/true));
  if (m.expert_intermediate <= 0) return rd.Error("moe_intermediate_size", "must be > 0");
  RETURN_IF_ERROR(rd.Bool("norm_topk_prob", &m.norm_topk_prob));
  RETURN_IF_ERROR(rd.Int("decoder_sparse_step", &m.decoder_sparse_step));
  if (m.decoder_sparse_step <= 0) return rd.Error("decoder_sparse_step", "must be > 0");
  if (const nlohmann::json* v = rd.Find("mlp_only_layers")) {
    if (!v->is_array()) return rd.Error("mlp_only_layers", "must be a list of layer indices");
    for (const auto& e : *v) {
      if (!e.is_number_integer() || e.get<int64_t>() < 0 || e.get<int64_t>() >= c->num_layers)
        return rd.Error("mlp_only_layers", "has an entry that is not a layer index: " + e.dump());
      m.mlp_only_layers.push_back(e.get<int>());
    }
  }
  return Status::Ok();
}

Result<std::string> ReadFile(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) return IoError(p.string() + ": cannot read");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

Result<ModelConfig> ModelConfig::FromJsonText(const std::string& text,
                                              const std::string& source_name) {
  const std::string& src = source_name;
  json root;
  try {
    root = json::parse(text);
  } catch (const json::exception& e) {
    return InvalidArgument(src + ": not valid JSON: " + e.what());
  }
  if (!root.is_object()) return InvalidArgument(src + ": not a JSON object");
  Reader rd(root, src);
  ModelConfig c;
  RETURN_IF_ERROR(rd.String("model_type", &c.model_type));
  if (const json* a = rd.Find("architectures")) {
    if (!a->is_array() || a->empty() || !(*a)[0].is_string())
      return rd.Error("architectures", "must be a non-empty list of strings");
    c.arch_name = (*a)[0].get<std::string>();
  } else {
    c.arch_name = ArchFromModelType(c.model_type);
    if (c.arch_name.empty())
      return InvalidArgument(src + ": missing required field architectures (model_type \"" +
                             c.model_type + "\" is not one agentkv knows)");
  }
  auto arch = ArchFromName(c.arch_name);
  if (!arch.ok())
    return InvalidArgument(src + ": field architectures: unsupported architecture " + c.arch_name +
                           " (supported: LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, "
                           "MistralForCausalLM, Gemma3ForCausalLM, GptOssForCausalLM, "
                           "Qwen3MoeForCausalLM)");
  c.arch = *arch;
  const bool gemma = c.arch == Architecture::kGemma3;
  ASSIGN_OR_RETURN(c.quant, ParseQuantConfig(root, src));

  if (!rd.Has("torch_dtype")) RETURN_IF_ERROR(rd.String("dtype", &c.torch_dtype));
  RETURN_IF_ERROR(rd.String("torch_dtype", &c.torch_dtype));
  RETURN_IF_ERROR(rd.Int("vocab_size", &c.vocab_size, true));
  RETURN_IF_ERROR(rd.Int("hidden_size", &c.hidden_size, true));
  RETURN_IF_ERROR(rd.Int("intermediate_size", &c.intermediate_size, true));
  RETURN_IF_ERROR(rd.Int("num_hidden_layers", &c.num_layers, true));
  RETURN_IF_ERROR(rd.Int("num_attention_heads", &c.num_heads, true));
  RETURN_IF_ERROR(rd.Int("max_position_embeddings", &c.max_position_embeddings, true));
  struct Positive {
    const char* key;
    int value;
  };
  for (Positive p : {Positive{"vocab_size", c.vocab_size},
                     {"hidden_size", c.hidden_size},
                     {"intermediate_size", c.intermediate_size},
                     {"num_hidden_layers", c.num_layers},
                     {"num_attention_heads", c.num_heads},
                     {"max_position_embeddings", c.max_position_embeddings}})
    if (p.value <= 0) return rd.Error(p.key, "must be > 0");

  c.num_kv_heads = c.num_heads;
  RETURN_IF_ERROR(rd.Int("num_key_value_heads", &c.num_kv_heads));
  if (c.num_kv_heads <= 0 || c.num_heads % c.num_kv_heads != 0)
    return rd.Error("num_key_value_heads", "must be > 0 and divide num_attention_heads (" +
                                               std::to_string(c.num_heads) + ")");
  if (rd.Has("head_dim")) {
    RETURN_IF_ERROR(rd.Int("head_dim", &c.head_dim));
    if (c.head_dim <= 0) return rd.Error("head_dim", "must be > 0");
  } else {
    if (c.hidden_size % c.num_heads != 0)
      return InvalidArgument(src + ": missing field head_dim and hidden_size is not a multiple " +
                             "of num_attention_heads");
    c.head_dim = c.hidden_size / c.num_heads;
  }
  RETURN_IF_ERROR(rd.Float("rms_norm_eps", &c.rms_norm_eps));

  std::string act = gemma ? "gelu_pytorch_tanh" : "silu";
  RETURN_IF_ERROR(rd.String("hidden_act", &act));
  if (gemma) RETURN_IF_ERROR(rd.String("hidden_activation", &act));
  if (act == "silu" || act == "swish") {
    c.activation = Activation::kSilu;
  } else if (act == "gelu_pytorch_tanh" || act == "gelu_tanh" || act == "gelu_new") {
    c.activation = Activation::kGeluTanh;
  } else {
    return InvalidArgument(src + ": field " + (gemma ? "hidden_activation" : "hidden_act") +
                           ": unsupported activation \"" + act + "\"");
  }

  c.tie_word_embeddings = gemma;
  RETURN_IF_ERROR(rd.Bool("tie_word_embeddings", &c.tie_word_embeddings));
  const bool oss = c.arch == Architecture::kGptOss;
  c.attention_bias = oss;  // GptOssConfig's default
  RETURN_IF_ERROR(rd.Bool("attention_bias", &c.attention_bias));
  if (c.arch == Architecture::kQwen2) c.attention_bias = true;
  // Qwen2 biases q/k/v only; GPT-OSS and Qwen3-MoE give o_proj the same bias
  // setting as q/k/v.
  c.o_proj_bias = (oss || c.arch == Architecture::kQwen3Moe) && c.attention_bias;
  c.attention_sinks = oss;
  c.qk_norm = c.arch == Architecture::kQwen3 || c.arch == Architecture::kQwen3Moe || gemma;
  if (oss || c.arch == Architecture::kQwen3Moe) RETURN_IF_ERROR(ParseMoe(rd, &c));

  RETURN_IF_ERROR(ParseLayerKinds(rd, src, &c));
  RETURN_IF_ERROR(ParseRopeAll(rd, src, &c));

  if (gemma) {
    c.gemma_norm = true;
    c.sandwich_norm = true;
    c.embed_scale = std::sqrt(static_cast<float>(c.hidden_size));
    float qpas = 256.0f;  // Gemma3TextConfig's default
    RETURN_IF_ERROR(rd.Float("query_pre_attn_scalar", &qpas));
    if (qpas <= 0) return rd.Error("query_pre_attn_scalar", "must be > 0");
    c.query_scale = 1.0f / std::sqrt(qpas);
    RETURN_IF_ERROR(rd.Float("final_logit_softcapping", &c.final_logit_softcap));
    RETURN_IF_ERROR(rd.Float("attn_logit_softcapping", &c.attn_logit_softcap));
  }

  RETURN_IF_ERROR(rd.Int("bos_token_id", &c.bos_token_id));
  RETURN_IF_ERROR(rd.IntList("eos_token_id", &c.eos_token_ids));
  return c;
}

Result<ModelConfig> ModelConfig::Load(const fs::path& dir) {
  const fs::path cfg_path = dir / "config.json";
  std::error_code ec;
  if (!fs::exists(cfg_path, ec)) return NotFound(cfg_path.string() + ": not found");
  ASSIGN_OR_RETURN(std::string text, ReadFile(cfg_path));
  ASSIGN_OR_RETURN(ModelConfig c, FromJsonText(text, cfg_path.string()));

  const fs::path gen_path = dir / "generation_config.json";
  if (fs::exists(gen_path, ec)) {
    ASSIGN_OR_RETURN(std::string gtext, ReadFile(gen_path));
    json g;
    try {
      g = json::parse(gtext);
    } catch (const json::exception& e) {
      return InvalidArgument(gen_path.string() + ": not valid JSON: " + e.what());
    }
    if (!g.is_object()) return InvalidArgument(gen_path.string() + ": not a JSON object");
    Reader rd(g, gen_path.string());
    RETURN_IF_ERROR(rd.IntList("eos_token_id", &c.eos_token_ids));
    if (c.bos_token_id < 0) RETURN_IF_ERROR(rd.Int("bos_token_id", &c.bos_token_id));
  }
  return c;
}

float ModelConfig::AttentionScale() const {
  if (query_scale != 0.0f) return query_scale;
  return 1.0f / std::sqrt(static_cast<float>(head_dim));
}

bool ModelConfig::IsMoeLayer(int layer) const {
  if (moe.num_experts <= 0) return false;
  for (int l : moe.mlp_only_layers)
    if (l == layer) return false;
  return (layer + 1) % moe.decoder_sparse_step == 0;
}

cache::ModelCacheSpec ModelConfig::CacheSpec(cache::KvDtype kv_dtype) const {
  cache::ModelCacheSpec s;
  s.num_layers = num_layers;
  s.num_kv_heads = num_kv_heads;
  s.head_dim = head_dim;
  s.kv_dtype = kv_dtype;
  s.layer_kinds = layer_kinds;
  s.layer_windows = layer_windows;
  s.BuildGroups();
  return s;
}

}  // namespace agentkv::model
