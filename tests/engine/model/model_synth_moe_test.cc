// `agentkv model synth --arch gpt_oss|qwen3_moe`: the checkpoint loads as the
// architecture it names (config in the transformers 5 convention, tensors
// of the weight spec), and a tiny one runs through the engine on the CPU
// backend: prefill and decode, the same whether the prompt is prefilled in
// one step or in chunks.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>

#include <sys/wait.h>

#include "engine/backend/backend_factory.h"
#include "engine/engine.h"
#include "engine/model/model_config.h"
#include "engine/model/model_synth.h"
#include "engine/model/safetensors.h"
#include "engine/model/weight_spec.h"
#include "util/bf16.h"

namespace agentkv::model {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using json = nlohmann::json;

const fs::path kTokenizers = fs::path(AGENTKV_DATA_DIR) / "tokenizers";

class ModelSynthMoeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(kTokenizers / "qwen3" / "tokenizer.json"))
      GTEST_SKIP() << "tokenizer qwen3 not set up (scripts/setup.sh)";
    dir_ = fs::path(::testing::TempDir()) /
           ("model_synth_moe_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    if (!dir_.empty()) fs::remove_all(dir_);
  }

  // Tiny: 4 layers, hidden 32, 6 experts; GPT-OSS's window 8 so that a
  // prompt of 30 tokens slides past it.
  SynthOptions Tiny(const std::string& arch) {
    SynthOptions o;
    o.arch = arch;
    o.tokenizer_dir = kTokenizers / "qwen3";
    o.out_dir = dir_ / arch;
    o.layers = 4;
    o.hidden = 32;
    o.heads = 4;
    o.kv_heads = 2;
    o.head_dim = 16;
    o.intermediate = 24;
    o.experts = 6;
    o.max_position = 4096;
    o.seed = 5;
    o.lm_head_std = 0.5;  // peaked logits: greedy picks are not near ties
    if (arch == "gpt_oss") o.sliding_window = 8;
    if (arch == "qwen3_moe") o.moe_intermediate = 12;
    return o;
  }

  fs::path dir_;
};

TEST_F(ModelSynthMoeTest, GptOssConfigAndWeights) {
  SynthOptions o = Tiny("gpt_oss");
  Status st = SynthesizeModel(o);
  ASSERT_TRUE(st.ok()) << st.ToString();
  std::ifstream in(o.out_dir / "config.json");
  const json j = json::parse(in);
  // The transformers 5 convention.
  EXPECT_TRUE(j.contains("rope_parameters"));
  EXPECT_FALSE(j.contains("rope_scaling"));
  EXPECT_FALSE(j.contains("rope_theta"));
  EXPECT_EQ(j["dtype"], "bfloat16");
  EXPECT_EQ(j["num_local_experts"], 6);
  auto c = ModelConfig::Load(o.out_dir);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->arch, Architecture::kGptOss);
  EXPECT_EQ(c->moe.num_experts, 6);
  EXPECT_EQ(c->moe.experts_per_token, 4);
  EXPECT_EQ(c->moe.expert_intermediate, 24);
  EXPECT_TRUE(c->attention_sinks);
  EXPECT_TRUE(c->o_proj_bias);
  EXPECT_FALSE(c->tie_word_embeddings);
  EXPECT_EQ(c->rope.type, "yarn");
  EXPECT_FLOAT_EQ(c->rope.theta, 150000.f);
  EXPECT_FLOAT_EQ(c->rope.factor, 32.f);
  EXPECT_FALSE(c->rope.truncate);
  for (int l = 0; l < 4; ++l) {
    EXPECT_EQ(c->layer_kinds[l],
              l % 2 == 0 ? cache::AttentionKind::kSliding : cache::AttentionKind::kFull);
    EXPECT_EQ(c->layer_windows[l], l % 2 == 0 ? 8 : 0);
  }
  auto w = Safetensors::Open(o.out_dir);
  ASSERT_TRUE(w.ok());
  Status v = ValidateWeights(*c, *w, TensorDtype::kBF16);
  EXPECT_TRUE(v.ok()) << v.ToString();
  EXPECT_EQ(w->Names().size(), ExpectedWeights(*c).size());
  EXPECT_TRUE(w->Get("model.layers.3.mlp.experts.gate_up_proj", {6, 32, 48}).ok());
  EXPECT_TRUE(w->Get("model.layers.3.self_attn.sinks", {4}).ok());
}

TEST_F(ModelSynthMoeTest, Qwen3MoeConfigAndWeights) {
  SynthOptions o = Tiny("qwen3_moe");
  ASSERT_TRUE(SynthesizeModel(o).ok());
  std::ifstream in(o.out_dir / "config.json");
  const json j = json::parse(in);
  EXPECT_EQ(j["num_local_experts"], 6);
  EXPECT_FALSE(j.contains("num_experts"));
  EXPECT_EQ(j["rope_parameters"]["rope_type"], "default");
  auto c = ModelConfig::Load(o.out_dir);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->arch, Architecture::kQwen3Moe);
  EXPECT_EQ(c->moe.num_experts, 6);
  EXPECT_EQ(c->moe.experts_per_token, 2);
  EXPECT_EQ(c->moe.expert_intermediate, 12);
  EXPECT_TRUE(c->moe.norm_topk_prob);
  EXPECT_TRUE(c->qk_norm);
  EXPECT_FLOAT_EQ(c->rope.theta, 1e6f);
  auto w = Safetensors::Open(o.out_dir);
  ASSERT_TRUE(w.ok());
  Status v = ValidateWeights(*c, *w, TensorDtype::kBF16);
  EXPECT_TRUE(v.ok()) << v.ToString();
  EXPECT_TRUE(w->Get("model.layers.0.mlp.experts.5.down_proj.weight", {32, 12}).ok());
  EXPECT_TRUE(w->Get("model.layers.0.mlp.gate.weight", {6, 32}).ok());
}

TEST_F(ModelSynthMoeTest, OptionErrors) {
  SynthOptions o = Tiny("gpt_oss");
  o.experts_per_token = 7;  // more than the 6 experts
  EXPECT_THAT(SynthesizeModel(o).ToString(), HasSubstr("--experts-per-token"));
  o = Tiny("gpt_oss");
  o.moe_intermediate = 8;
  EXPECT_THAT(SynthesizeModel(o).ToString(), HasSubstr("--moe-intermediate"));
  o = Tiny("qwen3_moe");
  o.sliding_window = 64;
  EXPECT_THAT(SynthesizeModel(o).ToString(), HasSubstr("--sliding-window"));
  o = Tiny("qwen3_moe");
  o.experts = -1;
  EXPECT_THAT(SynthesizeModel(o).ToString(), HasSubstr("--experts"));
  o = Tiny("qwen3");
  o.moe_intermediate = 0;
  o.experts = 4;  // a dense architecture has no experts
  EXPECT_THAT(SynthesizeModel(o).ToString(), HasSubstr("gpt_oss and qwen3_moe only"));
}

// The eos bias of a synthesized model survives GPT-OSS's biases and fused
// expert projections: the eos logit is raised at every position.
TEST_F(ModelSynthMoeTest, GptOssEosBiasReachesTheLogits) {
  SynthOptions o = Tiny("gpt_oss");
  o.eos_bias = 8.0;
  ASSERT_TRUE(SynthesizeModel(o).ok());
  auto c = ModelConfig::Load(o.out_dir);
  ASSERT_TRUE(c.ok());
  auto w = Safetensors::Open(o.out_dir);
  ASSERT_TRUE(w.ok());
  // The feature column of every down projection and bias is zero.
  auto t = w->Get("model.layers.1.mlp.experts.down_proj", {6, 24, 32});
  ASSERT_TRUE(t.ok());
  const auto* p = static_cast<const uint16_t*>(t->data);
  for (int64_t i = 31; i < 6 * 24 * 32; i += 32) ASSERT_EQ(p[i] & 0x7fff, 0) << i;
  auto b = w->Get("model.layers.1.self_attn.o_proj.bias", {32});
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(static_cast<const uint16_t*>(b->data)[31] & 0x7fff, 0);
}

int RunCli(const std::string& args) {
  std::string cmd = std::string(AGENTKV_BINARY) + " " + args + " >/dev/null 2>&1";
  int rc = std::system(cmd.c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

std::string ReadAll(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), {});
}

// The command line's expert flags reach the library: the same checkpoint as
// Tiny() for both architectures, and bad combinations refused.
TEST_F(ModelSynthMoeTest, CliMatchesTheLibrary) {
  if (!fs::exists(AGENTKV_BINARY)) GTEST_SKIP() << "agentkv binary not built";
  for (const std::string arch : {"gpt_oss", "qwen3_moe"}) {
    SynthOptions o = Tiny(arch);
    ASSERT_TRUE(SynthesizeModel(o).ok());
    const fs::path out = dir_ / ("cli_" + arch);
    std::string flags = "model synth --arch " + arch + " --tokenizer " + o.tokenizer_dir.string() +
                        " --out " + out.string() +
                        " --layers 4 --hidden 32 --heads 4 --kv-heads 2 --head-dim 16"
                        " --intermediate 24 --experts 6 --max-position 4096 --seed 5"
                        " --lm-head-std 0.5";
    flags += arch == "gpt_oss" ? " --sliding-window 8" : " --moe-intermediate 12";
    ASSERT_EQ(RunCli(flags), 0) << flags;
    for (const char* f : {"model.safetensors", "config.json"})
      EXPECT_EQ(ReadAll(out / f), ReadAll(o.out_dir / f)) << arch << " " << f;
  }
  const std::string base = "model synth --tokenizer " + (kTokenizers / "qwen3").string() +
                           " --out " + (dir_ / "x").string() + " --layers 1 --hidden 32";
  EXPECT_NE(RunCli(base + " --arch gpt_oss --experts 2 --experts-per-token 3"), 0);
  EXPECT_NE(RunCli(base + " --arch qwen3 --experts 4"), 0);
  EXPECT_FALSE(fs::exists(dir_ / "x" / "config.json"));
}

// `--quant mxfp4`: the experts are stored as the released checkpoints store
// them ([out, in] blocks and scales, the spec's names), and they hold the
// bf16 model's draws: decoded and transposed back, they match the same
// seed's bf16 experts within MXFP4's rounding (a transposition or
// interleaving mistake would not).
TEST_F(ModelSynthMoeTest, GptOssMxfp4ExpertsHoldTheBf16Draws) {
  SynthOptions o = Tiny("gpt_oss");
  o.intermediate = 64;  // square down and half of gate_up: both are transposed
  o.hidden = 64;
  o.head_dim = 16;
  o.eos_bias = 4.0;
  o.out_dir = dir_ / "bf16";
  ASSERT_TRUE(SynthesizeModel(o).ok());
  o.quant = SynthQuant::kMxfp4;
  o.out_dir = dir_ / "mxfp4";
  Status s = SynthesizeModel(o);
  ASSERT_TRUE(s.ok()) << s.ToString();
  auto c = ModelConfig::Load(o.out_dir);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->quant.method, QuantMethod::kMxfp4);
  auto q = Safetensors::Open(o.out_dir);
  auto f = Safetensors::Open(dir_ / "bf16");
  ASSERT_TRUE(q.ok() && f.ok());
  Status v = ValidateWeights(*c, *q, TensorDtype::kBF16);
  EXPECT_TRUE(v.ok()) << v.ToString();
  EXPECT_EQ(q->Names().size(), ExpectedWeights(*c).size());
  EXPECT_FALSE(q->Has("model.layers.0.mlp.experts.gate_up_proj"));
  EXPECT_EQ(q->Get("model.layers.0.mlp.experts.gate_up_proj_bias")->dtype, TensorDtype::kBF16);
  constexpr float kLut[8] = {0, .5f, 1, 1.5f, 2, 3, 4, 6};
  auto decode = [&](uint8_t nibble, uint8_t scale) {
    const float m = kLut[nibble & 7] * std::ldexp(1.f, scale - 127);
    return nibble & 8 ? -m : m;
  };
  const int64_t E = 6, H = 64, I = 64;
  struct Matrix {
    std::string name;
    int64_t rows, in;
  };
  for (const Matrix& m : {Matrix{"gate_up_proj", 2 * I, H}, Matrix{"down_proj", H, I}}) {
    const std::string& name = m.name;
    const int64_t rows = m.rows, in = m.in;
    const std::string p = "model.layers.2.mlp.experts." + name;
    auto blocks = q->Get(p + "_blocks", {E, rows, in / 32, 16});
    auto scales = q->Get(p + "_scales", {E, rows, in / 32});
    auto ref = f->Get(p, {E, in, rows});
    ASSERT_TRUE(blocks.ok() && scales.ok() && ref.ok()) << p;
    const auto* b = static_cast<const uint8_t*>(blocks->data);
    const auto* sc = static_cast<const uint8_t*>(scales->data);
    const auto* r16 = static_cast<const uint16_t*>(ref->data);
    double num = 0, den = 0;
    for (int64_t e = 0; e < E; ++e)
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t i = 0; i < in; ++i) {
          const int64_t g = (e * rows + r) * (in / 32) + i / 32;
          const uint8_t byte = b[g * 16 + (i % 32) / 2];
          const float got = decode(i % 2 ? byte >> 4 : byte & 15, sc[g]);
          const float want = Bf16ToF32(r16[(e * in + i) * rows + r]);
          num += (got - want) * static_cast<double>(got - want);
          den += static_cast<double>(want) * want;
          // The eos bias's feature (hidden dimension H - 1) stays zero in
          // the down projections' output rows.
          if (name == "down_proj" && r == H - 1) {
            ASSERT_EQ(got, 0.f) << e << " " << i;
          }
        }
    EXPECT_LT(std::sqrt(num / den), 0.2) << name;  // e2m1: about 0.1 for Gaussian draws
  }
}

// The GPT-OSS tokenizer: its chat template comes along as
// chat_template.jinja, and generation stops on <|return|>, <|call|> and
// <|endoftext|>, whose ids come from the tokenizer.
TEST_F(ModelSynthMoeTest, GptOssTokenizerTemplateAndStopTokens) {
  const fs::path tok = kTokenizers / "gptoss";
  if (!fs::exists(tok / "tokenizer.json")) GTEST_SKIP() << "gptoss tokenizer not set up";
  SynthOptions o = Tiny("gpt_oss");
  o.tokenizer_dir = tok;
  ASSERT_TRUE(SynthesizeModel(o).ok());
  std::map<std::string, int> ids;
  {
    std::ifstream in(tok / "tokenizer.json");
    const json t = json::parse(in);
    for (const auto& a : t["added_tokens"]) ids[a["content"]] = a["id"];
  }
  std::ifstream in(o.out_dir / "generation_config.json");
  const json g = json::parse(in);
  EXPECT_EQ(g["eos_token_id"],
            json({ids.at("<|return|>"), ids.at("<|endoftext|>"), ids.at("<|call|>")}));
  auto c = ModelConfig::Load(o.out_dir);
  ASSERT_TRUE(c.ok());
  EXPECT_THAT(c->eos_token_ids, ::testing::UnorderedElementsAre(200002, 199999, 200012));
  if (fs::exists(tok / "chat_template.jinja")) {
    EXPECT_EQ(ReadAll(o.out_dir / "chat_template.jinja"), ReadAll(tok / "chat_template.jinja"));
  }
  // A tokenizer without a template leaves none behind (a stale one would win).
  o.tokenizer_dir = kTokenizers / "qwen3";
  ASSERT_TRUE(SynthesizeModel(o).ok());
  EXPECT_FALSE(fs::exists(o.out_dir / "chat_template.jinja"));
}

// Without --tokenizer, gpt_oss uses data/tokenizers/gptoss (from the
// checkout's root); other architectures must name one.
TEST_F(ModelSynthMoeTest, CliDefaultTokenizerForGptOss) {
  if (!fs::exists(AGENTKV_BINARY)) GTEST_SKIP() << "agentkv binary not built";
  if (!fs::exists(kTokenizers / "gptoss" / "tokenizer.json"))
    GTEST_SKIP() << "gptoss tokenizer not set up";
  const std::string cd = "cd " + std::string(AGENTKV_SOURCE_DIR) + " && ";
  const std::string out = (dir_ / "cli").string();
  const std::string sizes = " --layers 1 --hidden 32 --heads 2 --kv-heads 1 --experts 4";
  int rc = std::system((cd + AGENTKV_BINARY + " model synth --arch gpt_oss --out " + out + sizes +
                        " >/dev/null 2>&1")
                           .c_str());
  ASSERT_TRUE(WIFEXITED(rc) && WEXITSTATUS(rc) == 0);
  EXPECT_EQ(ReadAll(fs::path(out) / "tokenizer.json"),
            ReadAll(kTokenizers / "gptoss" / "tokenizer.json"));
  rc = std::system((cd + AGENTKV_BINARY + " model synth --arch qwen3 --out " + out +
                    "-q --layers 1 --hidden 32 >/dev/null 2>&1")
                       .c_str());
  EXPECT_TRUE(WIFEXITED(rc) && WEXITSTATUS(rc) == 2);
  EXPECT_FALSE(fs::exists(out + "-q/config.json"));
}

std::vector<int32_t> Prompt(int n) {
  std::mt19937 rng(17);
  std::vector<int32_t> v(n);
  for (auto& x : v) x = static_cast<int32_t>(rng() % 150000);
  return v;
}

// Logits after prefilling `prompt` in chunks of `chunk` on the backend.
std::vector<float> PrefillLogits(const fs::path& dir, const std::vector<int32_t>& prompt,
                                 int chunk) {
  backend::BackendOptions bo;
  bo.threads = 2;
  auto b = backend::CreateBackend(dir, bo);
  EXPECT_TRUE(b.ok()) << b.status().ToString();
  backend::Backend& be = **b;
  const cache::ModelCacheSpec& spec = be.cache_spec();
  backend::KvLayout layout;
  layout.block_size = 4;
  for (int g = 0; g < backend::kMaxCacheGroups; ++g) layout.blocks_per_group[g] = 64;
  EXPECT_TRUE(be.AllocateKv(layout).ok());
  std::vector<std::vector<int32_t>> tables(spec.groups.size());
  for (size_t g = 0; g < tables.size(); ++g)
    for (int i = 0; i < spec.BlocksFor(static_cast<int>(g), 4096, 4); ++i) tables[g].push_back(i);
  std::vector<float> logits(be.config().vocab_size);
  for (size_t pos = 0; pos < prompt.size(); pos += chunk) {
    const size_t n = std::min<size_t>(chunk, prompt.size() - pos);
    backend::SeqStep st;
    st.tokens = std::span(prompt).subspan(pos, n);
    st.start_pos = static_cast<int32_t>(pos);
    st.want_logits = pos + n == prompt.size();
    for (size_t g = 0; g < tables.size(); ++g) st.block_tables[g] = tables[g];
    Status s = be.Forward({&st, 1}, logits);
    EXPECT_TRUE(s.ok()) << s.ToString();
  }
  return logits;
}

// Greedy tokens through the engine, the prompt prefilled at most
// `step_tokens` at a time.
std::vector<int32_t> EngineGreedy(const fs::path& dir, const std::vector<int32_t>& prompt,
                                  int step_tokens, int max_tokens) {
  backend::BackendOptions bo;
  bo.threads = 2;
  auto b = backend::CreateBackend(dir, bo);
  EXPECT_TRUE(b.ok()) << b.status().ToString();
  engine::EngineOptions o;
  o.block_size = 4;
  o.scheduler.max_step_tokens = step_tokens;
  o.blocks_per_group.assign((*b)->cache_spec().groups.size(), 128);
  auto e = engine::Engine::Create(std::move(b).value(), nullptr, o);
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  engine::EngineRequest r;
  r.prompt = prompt;
  r.params.temperature = 0;
  r.params.ignore_eos = true;
  r.params.max_tokens = max_tokens;
  auto h = (*e)->Submit(std::move(r));
  EXPECT_TRUE(h.ok());
  std::vector<int32_t> out;
  while (true) {
    engine::RequestOutput ev = h->stream->Pop();
    if (ev.kind != engine::RequestOutput::Kind::kDelta) break;
    out.insert(out.end(), ev.tokens.begin(), ev.tokens.end());
  }
  return out;
}

double RelErr(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (a[i] - b[i]) * static_cast<double>(a[i] - b[i]);
    den += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(num / den);
}

class ModelSynthMoeRunTest : public ModelSynthMoeTest,
                             public ::testing::WithParamInterface<std::string> {};

TEST_P(ModelSynthMoeRunTest, PrefillAndDecodeThroughTheEngineChunkedOrWhole) {
  SynthOptions o = Tiny(GetParam());
  ASSERT_TRUE(SynthesizeModel(o).ok());
  const auto prompt = Prompt(30);
  const auto whole = PrefillLogits(o.out_dir, prompt, 1000);
  for (int chunk : {1, 7}) EXPECT_LT(RelErr(PrefillLogits(o.out_dir, prompt, chunk), whole), 1e-4);
  const auto a = EngineGreedy(o.out_dir, prompt, 64, 12);
  const auto b = EngineGreedy(o.out_dir, prompt, 5, 12);
  ASSERT_EQ(a.size(), 12u);
  EXPECT_EQ(a, b);
  // The first generated token is the whole prefill's argmax.
  EXPECT_EQ(a[0], std::max_element(whole.begin(), whole.end()) - whole.begin());
}

INSTANTIATE_TEST_SUITE_P(Archs, ModelSynthMoeRunTest, ::testing::Values("gpt_oss", "qwen3_moe"));

}  // namespace
}  // namespace agentkv::model
