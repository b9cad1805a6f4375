#include "engine/model/model_synth.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "engine/model/model_config.h"
#include "engine/model/model_files.h"
#include "engine/model/safetensors.h"
#include "engine/model/weight_spec.h"
#include "util/bf16.h"

namespace agentkv::model {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using json = nlohmann::json;

const fs::path kTokenizers = fs::path(AGENTKV_DATA_DIR) / "tokenizers";

std::string ReadAll(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), {});
}

// Content -> id of tokenizer.json's added tokens (the model vocabulary is
// skipped: it is most of the file and holds no special tokens here).
std::map<std::string, int> AddedTokens(const fs::path& tokenizer_json) {
  json tok = json::parse(ReadAll(tokenizer_json), [](int depth, json::parse_event_t e, json& v) {
    return !(depth == 1 && e == json::parse_event_t::key && v == "model");
  });
  std::map<std::string, int> ids;
  for (const auto& a : tok["added_tokens"]) ids[a["content"]] = a["id"];
  return ids;
}

struct Stats {
  double mean = 0, stddev = 0;
};

Stats Bf16Stats(const TensorView& t) {
  const auto* p = static_cast<const uint16_t*>(t.data);
  double s = 0, s2 = 0;
  int64_t n = t.numel();
  for (int64_t i = 0; i < n; ++i) {
    double v = Bf16ToF32(p[i]);
    s += v;
    s2 += v * v;
  }
  double m = s / n;
  return {m, std::sqrt(s2 / n - m * m)};
}

class ModelSynthTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) /
           ("model_synth_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  static void TearDownTestSuite() {
    if (!shared_.empty()) fs::remove_all(shared_.parent_path());
  }

  // One tiny qwen3 model (Tiny("qwen3") options), synthesized once per run:
  // the vocabulary alone makes every synthesis take a moment.
  static fs::path Shared() {
    if (shared_.empty()) {
      fs::path root =
          fs::path(::testing::TempDir()) / ("model_synth_shared_" + std::to_string(::getpid()));
      SynthOptions o = TinyOptions("qwen3", "qwen3", root / "qwen3");
      Status st = SynthesizeModel(o);
      EXPECT_TRUE(st.ok()) << st.ToString();
      shared_ = o.out_dir;
    }
    return shared_;
  }

  static SynthOptions TinyOptions(const std::string& arch, const std::string& tokenizer,
                                  const fs::path& out) {
    SynthOptions o;
    o.arch = arch;
    o.tokenizer_dir = kTokenizers / tokenizer;
    o.out_dir = out;
    o.layers = 2;
    o.hidden = 32;
    o.heads = 4;
    o.kv_heads = 2;
    o.head_dim = arch == "qwen3" ? 16 : 0;  // explicit, != hidden / heads
    o.intermediate = 48;
    o.max_position = 4096;
    o.seed = 3;
    return o;
  }

  SynthOptions Tiny(const std::string& arch, const std::string& tokenizer) {
    return TinyOptions(arch, tokenizer, dir_ / arch);
  }
  void RequireTokenizer(const std::string& name) {
    if (!fs::exists(kTokenizers / name / "tokenizer.json"))
      GTEST_SKIP() << "tokenizer " << name << " not set up (scripts/setup.sh)";
  }

  fs::path dir_;
  static fs::path shared_;
};

fs::path ModelSynthTest::shared_;

TEST_F(ModelSynthTest, Qwen3RoundTrip) {
  RequireTokenizer("qwen3");
  SynthOptions o = Tiny("qwen3", "qwen3");
  o.out_dir = Shared();

  auto c = ModelConfig::Load(o.out_dir);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->arch, Architecture::kQwen3);
  EXPECT_EQ(c->num_layers, 2);
  EXPECT_EQ(c->hidden_size, 32);
  EXPECT_EQ(c->head_dim, 16);
  EXPECT_EQ(c->num_kv_heads, 2);
  EXPECT_EQ(c->intermediate_size, 48);
  EXPECT_EQ(c->max_position_embeddings, 4096);
  EXPECT_TRUE(c->qk_norm);
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_EQ(c->torch_dtype, "bfloat16");
  auto vocab = TokenizerVocabSize(o.tokenizer_dir / "tokenizer.json");
  ASSERT_TRUE(vocab.ok());
  EXPECT_EQ(c->vocab_size, *vocab);
  // <|im_end|> (the chat eos) and <|endoftext|>, as the tokenizer defines them.
  auto ids = AddedTokens(o.tokenizer_dir / "tokenizer.json");
  EXPECT_THAT(c->eos_token_ids, ElementsAre(ids.at("<|im_end|>"), ids.at("<|endoftext|>")));
  EXPECT_EQ(c->bos_token_id, -1);  // the Qwen tokenizer has no bos_token

  auto w = Safetensors::Open(o.out_dir);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  Status v = ValidateWeights(*c, *w, TensorDtype::kBF16);
  EXPECT_TRUE(v.ok()) << v.ToString();
  EXPECT_EQ(w->Names().size(), ExpectedWeights(*c).size());

  auto files = ModelFiles::Locate(o.out_dir);
  ASSERT_TRUE(files.ok()) << files.status().ToString();
  EXPECT_EQ(ReadAll(files->tokenizer), ReadAll(o.tokenizer_dir / "tokenizer.json"));
  EXPECT_EQ(ReadAll(files->tokenizer_config), ReadAll(o.tokenizer_dir / "tokenizer_config.json"));
  EXPECT_FALSE(files->generation_config.empty());
}

TEST_F(ModelSynthTest, WeightDistributions) {
  RequireTokenizer("qwen3");
  auto w = Safetensors::Open(Shared());
  ASSERT_TRUE(w.ok());
  Stats emb = Bf16Stats(*w->Get("model.embed_tokens.weight"));
  EXPECT_NEAR(emb.mean, 0.0, 0.001);
  EXPECT_NEAR(emb.stddev, 0.02, 0.0005);
  Stats q = Bf16Stats(*w->Get("model.layers.1.self_attn.q_proj.weight"));
  EXPECT_NEAR(q.stddev, 0.02, 0.002);
  Stats norm = Bf16Stats(*w->Get("model.layers.0.input_layernorm.weight"));
  EXPECT_NEAR(norm.mean, 1.0, 0.05);
  EXPECT_NEAR(norm.stddev, 0.1, 0.03);
  // Tensors are drawn independently: equal shapes, different values.
  auto a = *w->Get("model.layers.0.self_attn.k_proj.weight");
  auto b = *w->Get("model.layers.1.self_attn.k_proj.weight");
  EXPECT_NE(std::memcmp(a.data, b.data, a.nbytes), 0);
}

TEST_F(ModelSynthTest, EosBiasIsAConstantFeatureReadOnlyForTheEosToken) {
  RequireTokenizer("qwen3");
  SynthOptions o = Tiny("qwen3", "qwen3");
  o.out_dir = dir_ / "eos";
  o.eos_bias = 1.5;
  o.lm_head_std = 0.2;
  ASSERT_TRUE(SynthesizeModel(o).ok());
  auto c = ModelConfig::Load(o.out_dir);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_FALSE(c->tie_word_embeddings);  // the LM head is its own
  auto w = Safetensors::Open(o.out_dir);
  ASSERT_TRUE(w.ok());
  EXPECT_TRUE(ValidateWeights(*c, *w, TensorDtype::kBF16).ok());
  const int H = c->hidden_size, f = H - 1, eos = c->eos_token_ids[0];
  auto at = [](const TensorView& t, int64_t row, int64_t col) {
    return Bf16ToF32(static_cast<const uint16_t*>(t.data)[row * t.shape[1] + col]);
  };
  const TensorView emb = *w->Get("model.embed_tokens.weight");
  const TensorView head = *w->Get("lm_head.weight");
  for (int64_t t = 0; t < c->vocab_size; t += 997) {
    EXPECT_EQ(at(emb, t, f), 1.0f) << t;
    if (t != eos) {
      EXPECT_EQ(at(head, t, f), 0.0f) << t;
    }
  }
  EXPECT_EQ(at(emb, eos, f), 1.0f);
  EXPECT_EQ(at(head, eos, f), Bf16ToF32(F32ToBf16(1.5f)));
  // No layer writes the feature's dimension.
  for (const char* name :
       {"model.layers.0.self_attn.o_proj.weight", "model.layers.1.mlp.down_proj.weight"}) {
    const TensorView t = *w->Get(name);
    for (int64_t col = 0; col < t.shape[1]; ++col) EXPECT_EQ(at(t, f, col), 0.0f) << name;
    EXPECT_NE(at(t, f - 1, 0), 0.0f) << name;
  }
  EXPECT_NEAR(Bf16Stats(head).stddev, 0.2, 0.01);

  o.tie = true;
  EXPECT_EQ(SynthesizeModel(o).code(), StatusCode::kInvalidArgument);
}

TEST_F(ModelSynthTest, DeterministicPerSeed) {
  RequireTokenizer("qwen3");
  SynthOptions o = Tiny("qwen3", "qwen3");
  o.out_dir = dir_ / "again";
  uint64_t last_done = 0, last_total = 0;
  int calls = 0;
  Status st = SynthesizeModel(o, [&](uint64_t done, uint64_t total) {
    EXPECT_GE(done, last_done);
    last_done = done;
    last_total = total;
    ++calls;
  });
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_GT(calls, 0);
  EXPECT_EQ(last_done, last_total);
  EXPECT_EQ(last_total,
            fs::file_size(o.out_dir / "model.safetensors") -
                (*SafetensorsFile::Open(o.out_dir / "model.safetensors"))->data_offset());
  o.out_dir = dir_ / "seed4";
  o.seed = 4;
  ASSERT_TRUE(SynthesizeModel(o).ok());
  EXPECT_EQ(ReadAll(Shared() / "model.safetensors"), ReadAll(dir_ / "again" / "model.safetensors"));
  EXPECT_NE(ReadAll(Shared() / "model.safetensors"), ReadAll(dir_ / "seed4" / "model.safetensors"));
  auto f1 = ModelFiles::Locate(Shared())->Fingerprint();
  auto f2 = ModelFiles::Locate(dir_ / "again")->Fingerprint();
  auto f3 = ModelFiles::Locate(dir_ / "seed4")->Fingerprint();
  ASSERT_TRUE(f1.ok() && f2.ok() && f3.ok());
  EXPECT_EQ(*f1, *f2);
  EXPECT_NE(*f1, *f3);
}

TEST_F(ModelSynthTest, DtypesHoldTheSameValues) {
  RequireTokenizer("qwen3");
  SynthOptions o = Tiny("qwen3", "qwen3");
  o.dtype = TensorDtype::kF32;
  o.out_dir = dir_ / "f32";
  ASSERT_TRUE(SynthesizeModel(o).ok());
  o.dtype = TensorDtype::kF16;
  o.out_dir = dir_ / "f16";
  ASSERT_TRUE(SynthesizeModel(o).ok());
  auto w32 = Safetensors::Open(dir_ / "f32");
  auto w16 = Safetensors::Open(Shared());
  auto wh = Safetensors::Open(dir_ / "f16");
  ASSERT_TRUE(w32.ok() && w16.ok() && wh.ok());
  EXPECT_EQ(ModelConfig::Load(dir_ / "f16")->torch_dtype, "float16");
  EXPECT_TRUE(ValidateWeights(*ModelConfig::Load(dir_ / "f16"), *wh, TensorDtype::kF16).ok());
  const std::string name = "model.layers.0.mlp.up_proj.weight";
  auto a = *w32->Get(name);
  auto b = *w16->Get(name);
  auto h = *wh->Get(name);
  ASSERT_EQ(a.dtype, TensorDtype::kF32);
  const auto* pa = static_cast<const float*>(a.data);
  const auto* pb = static_cast<const uint16_t*>(b.data);
  const auto* ph = static_cast<const uint16_t*>(h.data);
  for (int64_t i = 0; i < a.numel(); ++i) {
    ASSERT_EQ(pb[i], F32ToBf16(pa[i])) << i;
    ASSERT_EQ(ph[i], F32ToF16(pa[i])) << i;
  }
}

TEST(SynthFillTest, IndependentOfChunking) {
  std::vector<uint16_t> whole(1001), parts(1001);
  SynthFill(9, "t", TensorDtype::kBF16, 0.0, 1.0, 0, 1001, whole.data());
  SynthFill(9, "t", TensorDtype::kBF16, 0.0, 1.0, 0, 333, parts.data());
  SynthFill(9, "t", TensorDtype::kBF16, 0.0, 1.0, 333, 1, parts.data() + 333);
  SynthFill(9, "t", TensorDtype::kBF16, 0.0, 1.0, 334, 667, parts.data() + 334);
  EXPECT_EQ(whole, parts);
  std::vector<uint16_t> other(1001);
  SynthFill(9, "u", TensorDtype::kBF16, 0.0, 1.0, 0, 1001, other.data());
  EXPECT_NE(whole, other);
  // Large fills go through the parallel path; it must agree with small ones.
  std::vector<float> big(300000), small(1000);
  SynthFill(1, "big", TensorDtype::kF32, 0.5, 2.0, 0, big.size(), big.data());
  SynthFill(1, "big", TensorDtype::kF32, 0.5, 2.0, 123457, small.size(), small.data());
  for (size_t i = 0; i < small.size(); ++i) ASSERT_EQ(small[i], big[123457 + i]);
  double s = 0, s2 = 0;
  for (float v : big) {
    s += v;
    s2 += double(v) * v;
  }
  double m = s / big.size();
  EXPECT_NEAR(m, 0.5, 0.02);
  EXPECT_NEAR(std::sqrt(s2 / big.size() - m * m), 2.0, 0.02);
}

TEST_F(ModelSynthTest, Qwen2HasBiasesAndUntiedHead) {
  RequireTokenizer("qwen3");
  SynthOptions o = Tiny("qwen2", "qwen3");
  o.tie = false;
  ASSERT_TRUE(SynthesizeModel(o).ok());
  auto c = ModelConfig::Load(o.out_dir);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_TRUE(c->attention_bias);
  EXPECT_FALSE(c->tie_word_embeddings);
  auto w = Safetensors::Open(o.out_dir);
  ASSERT_TRUE(w.ok());
  EXPECT_TRUE(w->Get("model.layers.1.self_attn.k_proj.bias", {16}).ok());
  EXPECT_TRUE(w->Get("lm_head.weight", {c->vocab_size, 32}).ok());
  EXPECT_TRUE(ValidateWeights(*c, *w).ok());
}

TEST_F(ModelSynthTest, LlamaUsesTokenizerSpecials) {
  RequireTokenizer("llama3_1");
  SynthOptions o = Tiny("llama", "llama3_1");
  ASSERT_TRUE(SynthesizeModel(o).ok());
  auto c = ModelConfig::Load(o.out_dir);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  auto ids = AddedTokens(o.tokenizer_dir / "tokenizer.json");
  EXPECT_EQ(c->bos_token_id, ids.at("<|begin_of_text|>"));
  std::vector<int32_t> eos = {ids.at("<|eot_id|>"), ids.at("<|end_of_text|>")};
  if (ids.count("<|eom_id|>")) eos.push_back(ids.at("<|eom_id|>"));  // Llama 3.1+ only
  EXPECT_EQ(c->eos_token_ids, eos);
  EXPECT_FALSE(c->qk_norm);
  EXPECT_FLOAT_EQ(c->rope.theta, 500000.0f);
  EXPECT_TRUE(ValidateWeights(*c, *Safetensors::Open(o.out_dir)).ok());
}

TEST_F(ModelSynthTest, MistralSlidingWindowAndRopeTheta) {
  RequireTokenizer("llama3_1");
  SynthOptions o = Tiny("mistral", "llama3_1");
  o.sliding_window = 128;
  o.rope_theta = 12345.0;
  ASSERT_TRUE(SynthesizeModel(o).ok());
  auto c = ModelConfig::Load(o.out_dir);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_FALSE(c->tie_word_embeddings);  // Mistral default
  EXPECT_FLOAT_EQ(c->rope.theta, 12345.0f);
  for (int l = 0; l < 2; ++l) {
    EXPECT_EQ(c->layer_kinds[l], cache::AttentionKind::kSliding);
    EXPECT_EQ(c->layer_windows[l], 128);
  }
  EXPECT_TRUE(ValidateWeights(*c, *Safetensors::Open(o.out_dir)).ok());
}

TEST_F(ModelSynthTest, Gemma3) {
  RequireTokenizer("gemma3");
  SynthOptions o = Tiny("gemma3", "gemma3");
  o.layers = 7;
  o.hidden = 16;
  o.intermediate = 24;
  ASSERT_TRUE(SynthesizeModel(o).ok());
  auto c = ModelConfig::Load(o.out_dir);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->arch, Architecture::kGemma3);
  EXPECT_TRUE(c->sandwich_norm);
  EXPECT_FLOAT_EQ(c->query_scale, 1.0f / std::sqrt(4.0f));  // query_pre_attn_scalar = head_dim
  EXPECT_FLOAT_EQ(c->rope_local.theta, 10000.0f);
  for (int l = 0; l < 7; ++l) {
    EXPECT_EQ(c->layer_kinds[l],
              l == 5 ? cache::AttentionKind::kFull : cache::AttentionKind::kSliding);
    EXPECT_EQ(c->layer_windows[l], l == 5 ? 0 : 512);
  }
  auto ids = AddedTokens(o.tokenizer_dir / "tokenizer.json");
  EXPECT_EQ(c->bos_token_id, ids.at("<bos>"));
  EXPECT_THAT(c->eos_token_ids, ElementsAre(ids.at("<end_of_turn>"), ids.at("<eos>")));
  auto w = Safetensors::Open(o.out_dir);
  ASSERT_TRUE(w.ok());
  EXPECT_TRUE(ValidateWeights(*c, *w).ok());
  // (1 + w) norms: weights centred on zero.
  Stats s = Bf16Stats(*w->Get("model.layers.3.pre_feedforward_layernorm.weight"));
  EXPECT_NEAR(s.mean, 0.0, 0.06);
}

TEST_F(ModelSynthTest, OptionErrors) {
  RequireTokenizer("qwen3");
  struct Case {
    std::function<void(SynthOptions&)> edit;
    const char* want;
  };
  const Case cases[] = {
      {[](SynthOptions& o) { o.arch = "falcon"; }, "--arch"},
      {[](SynthOptions& o) { o.vocab = 1000; }, "--vocab 1000 is smaller"},
      {[](SynthOptions& o) { o.kv_heads = 3; }, "--kv-heads"},
      {[](SynthOptions& o) { o.layers = 0; }, "--layers"},
      {[](SynthOptions& o) {
         o.hidden = 66;
         o.head_dim = 0;
       },
       "--hidden"},
      {[](SynthOptions& o) { o.intermediate = -1; }, "--intermediate"},
      {[](SynthOptions& o) {
         o.arch = "llama";
         o.sliding_window = 64;
       },
       "--sliding-window"},
      {[](SynthOptions& o) { o.tokenizer_dir = "/nonexistent/tok"; },
       "/nonexistent/tok/tokenizer.json"},
  };
  for (const Case& k : cases) {
    SynthOptions o = Tiny("qwen3", "qwen3");
    k.edit(o);
    Status st = SynthesizeModel(o);
    ASSERT_FALSE(st.ok()) << k.want;
    EXPECT_THAT(st.message(), HasSubstr(k.want));
    EXPECT_FALSE(fs::exists(o.out_dir / "config.json")) << k.want;
  }
}

TEST_F(ModelSynthTest, TokenizerFileErrors) {
  fs::path tok = dir_ / "tok";
  fs::create_directories(tok);
  std::ofstream(tok / "tokenizer.json") << R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 7}},
      "added_tokens": [{"id": 9, "content": "<e>"}]})";
  auto v = TokenizerVocabSize(tok / "tokenizer.json");
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(*v, 10);
  SynthOptions o;
  o.arch = "qwen3";
  o.tokenizer_dir = tok;
  o.out_dir = dir_ / "out";
  Status st = SynthesizeModel(o);  // no tokenizer_config.json
  EXPECT_EQ(st.code(), StatusCode::kNotFound);
  EXPECT_THAT(st.message(), HasSubstr("tokenizer_config.json"));
  std::ofstream(tok / "tokenizer_config.json") << R"({"eos_token": "<missing>"})";
  st = SynthesizeModel(o);
  EXPECT_THAT(st.message(), HasSubstr("eos_token"));
  std::ofstream(tok / "tokenizer_config.json") << R"({"eos_token": {"content": "<e>"}})";
  st = SynthesizeModel(o);
  EXPECT_TRUE(st.ok()) << st.ToString();
  EXPECT_THAT(ModelConfig::Load(o.out_dir)->eos_token_ids, ElementsAre(9));

  std::ofstream(tok / "tokenizer.json") << "{";
  EXPECT_THAT(TokenizerVocabSize(tok / "tokenizer.json").status().message(),
              HasSubstr("not valid JSON"));
  std::ofstream(tok / "tokenizer.json") << R"({"model": {"vocab": {}}})";
  EXPECT_THAT(TokenizerVocabSize(tok / "tokenizer.json").status().message(),
              HasSubstr("no tokens"));
  // Unigram vocabularies are lists of [piece, score].
  std::ofstream(tok / "tokenizer.json") << R"({"model": {"vocab": [["a", 0.0], ["b", -1.0]]}})";
  EXPECT_EQ(*TokenizerVocabSize(tok / "tokenizer.json"), 2);
}

int RunCli(const std::string& args) {
  std::string cmd = std::string(AGENTKV_BINARY) + " " + args + " >/dev/null 2>&1";
  int rc = std::system(cmd.c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

TEST_F(ModelSynthTest, CliWithTheDefaultModelFlags) {
  RequireTokenizer("qwen3");
  if (!fs::exists(AGENTKV_BINARY)) GTEST_SKIP() << "agentkv binary not built";
  fs::path out = dir_ / "default";
  ASSERT_EQ(RunCli("model synth --arch qwen3 --tokenizer " + (kTokenizers / "qwen3").string() +
                   " --out " + out.string() +
                   " --layers 4 --hidden 192 --heads 6 --kv-heads 2 --head-dim 32"
                   " --intermediate 512 --max-position 131072 --seed 1 --eos-bias 1.5"
                   " --lm-head-std 0.2"),
            0);
  auto c = ModelConfig::Load(out);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->num_layers, 4);
  EXPECT_EQ(c->hidden_size, 192);
  EXPECT_EQ(c->num_heads, 6);
  EXPECT_EQ(c->num_kv_heads, 2);
  EXPECT_EQ(c->head_dim, 32);
  EXPECT_EQ(c->intermediate_size, 512);
  EXPECT_GE(c->max_position_embeddings, 131072);  // SPEC: default context >= 128k
  EXPECT_FALSE(c->tie_word_embeddings);
  auto w = Safetensors::Open(out);
  ASSERT_TRUE(w.ok());
  EXPECT_TRUE(ValidateWeights(*c, *w, TensorDtype::kBF16).ok());
}

TEST_F(ModelSynthTest, CliMatchesTheLibrary) {
  RequireTokenizer("qwen3");
  if (!fs::exists(AGENTKV_BINARY)) GTEST_SKIP() << "agentkv binary not built";
  fs::path out = dir_ / "cli";
  // Tiny("qwen3") as flags.
  ASSERT_EQ(RunCli("model synth --arch qwen3 --tokenizer " + (kTokenizers / "qwen3").string() +
                   " --out " + out.string() +
                   " --layers 2 --hidden 32 --heads 4 --kv-heads 2 --head-dim 16"
                   " --intermediate 48 --max-position 4096 --seed 3"),
            0);
  for (const char* f : {"model.safetensors", "config.json", "generation_config.json"})
    EXPECT_EQ(ReadAll(out / f), ReadAll(Shared() / f)) << f;
}

TEST_F(ModelSynthTest, CliRejectsBadFlags) {
  RequireTokenizer("qwen3");
  if (!fs::exists(AGENTKV_BINARY)) GTEST_SKIP() << "agentkv binary not built";
  std::string base = "model synth --tokenizer " + (kTokenizers / "qwen3").string() + " --out " +
                     (dir_ / "x").string();
  EXPECT_NE(RunCli(base + " --arch falcon"), 0);
  EXPECT_NE(RunCli(base), 0);  // --arch is required
  EXPECT_NE(RunCli(base + " --arch qwen3 --dtype f8"), 0);
  EXPECT_NE(RunCli(base + " --arch qwen3 --tie --no-tie"), 0);
  EXPECT_NE(RunCli(base + " --arch qwen3 --kv-heads 3"), 0);
  EXPECT_FALSE(fs::exists(dir_ / "x" / "config.json"));
  EXPECT_EQ(RunCli(base + " --arch qwen3 --layers 1 --hidden 32 --no-tie --dtype f32"), 0);
  auto c = ModelConfig::Load(dir_ / "x");
  ASSERT_TRUE(c.ok());
  EXPECT_FALSE(c->tie_word_embeddings);
  EXPECT_EQ(c->torch_dtype, "float32");
}

}  // namespace
}  // namespace agentkv::model
