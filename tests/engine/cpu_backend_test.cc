// The CPU forward pass is batch-, chunk- and block-layout-invariant: the same
// sequence gives the same logits alone or in a batch, prefilled at once or in
// chunks, over many small blocks or one large one. (Agreement with Hugging
// Face transformers is checked by tests/reference/hf_compare.py on the GPU
// machine.)
#include "engine/cpu_backend.h"

#include "cache/kv_cache_manager.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>

#include "test_model.h"

namespace agentkv {
namespace {

using testing::MapWeights;
using testing::RandomWeights;
using testing::SmallConfig;

// Hands out blocks from a simple counter: each sequence gets its own.
struct Tables {
  std::vector<std::vector<std::vector<int32_t>>> t;  // [seq][group] -> blocks
  std::array<int32_t, kMaxCacheGroups> next{};
  void Ensure(const ModelCacheSpec& spec, int seq, int64_t tokens, int bs) {
    if (static_cast<int>(t.size()) <= seq) t.resize(seq + 1);
    t[seq].resize(spec.groups.size());
    for (size_t g = 0; g < spec.groups.size(); ++g) {
      const int need = spec.BlocksFor(static_cast<int>(g), tokens, bs);
      while (static_cast<int>(t[seq][g].size()) < need) t[seq][g].push_back(next[g]++);
    }
  }
  SeqStep Step(int seq, std::span<const int32_t> toks, int start, bool want) {
    SeqStep s;
    s.tokens = toks;
    s.start_pos = start;
    s.want_logits = want;
    for (size_t g = 0; g < t[seq].size(); ++g) s.block_tables[g] = t[seq][g];
    return s;
  }
};

std::vector<int32_t> Prompt(int len, uint32_t seed, int vocab) {
  std::mt19937 rng(seed);
  std::vector<int32_t> v(len);
  for (auto& x : v) x = static_cast<int32_t>(rng() % vocab);
  return v;
}

double RelErr(std::span<const float> a, std::span<const float> b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (a[i] - b[i]) * static_cast<double>(a[i] - b[i]);
    den += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

std::unique_ptr<CpuBackend> Make(const ModelConfig& c, const MapWeights& w, int bs, int blocks) {
  auto b = CpuBackend::Create(c, w, CpuBackendOptions{2});
  EXPECT_TRUE(b.ok()) << b.status().ToString();
  KvLayout layout;
  layout.block_size = bs;
  for (int g = 0; g < kMaxCacheGroups; ++g) layout.blocks_per_group[g] = blocks;
  EXPECT_TRUE((*b)->AllocateKv(layout).ok());
  return std::move(b).value();
}

// Prefill `prompt` in chunks of `chunk` then decode `decode` greedy tokens;
// returns the logits after prefill and after every decode step.
std::vector<std::vector<float>> RunAlone(const ModelConfig& c, const MapWeights& w,
                                         const std::vector<int32_t>& prompt, int chunk, int decode,
                                         int bs) {
  auto b = Make(c, w, bs, 4096 / bs + 64);
  Tables tab;
  std::vector<std::vector<float>> out;
  std::vector<int32_t> seq = prompt;
  std::vector<float> logits(c.vocab_size);
  int pos = 0;
  while (pos < static_cast<int>(prompt.size())) {
    const int n = std::min<int>(chunk, prompt.size() - pos);
    tab.Ensure(b->cache_spec(), 0, pos + n, bs);
    const bool last = pos + n == static_cast<int>(prompt.size());
    SeqStep st = tab.Step(0, std::span(seq).subspan(pos, n), pos, last);
    EXPECT_TRUE(b->Forward({&st, 1}, logits).ok());
    pos += n;
  }
  out.push_back(logits);
  for (int d = 0; d < decode; ++d) {
    const int32_t next =
        static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    seq.push_back(next);
    tab.Ensure(b->cache_spec(), 0, seq.size(), bs);
    SeqStep st = tab.Step(0, std::span(seq).subspan(seq.size() - 1, 1), seq.size() - 1, true);
    EXPECT_TRUE(b->Forward({&st, 1}, logits).ok());
    out.push_back(logits);
  }
  return out;
}

class CpuBackendArchTest : public ::testing::TestWithParam<Architecture> {};

TEST_P(CpuBackendArchTest, ChunkedAndBlockLayoutInvariant) {
  const ModelConfig c = SmallConfig(GetParam());
  const MapWeights w = RandomWeights(c, 7);
  const auto prompt = Prompt(45, 3, c.vocab_size);
  const auto ref = RunAlone(c, w, prompt, 1000, 5, 64);  // one large block, one chunk
  for (auto [chunk, bs] : {std::pair{1000, 1}, {7, 4}, {3, 16}, {16, 2}}) {
    const auto got = RunAlone(c, w, prompt, chunk, 5, bs);
    ASSERT_EQ(got.size(), ref.size());
    for (size_t i = 0; i < ref.size(); ++i)
      EXPECT_LT(RelErr(got[i], ref[i]), 1e-4) << "chunk " << chunk << " bs " << bs << " step " << i;
  }
}

TEST_P(CpuBackendArchTest, BatchOfEightMatchesAlone) {
  const ModelConfig c = SmallConfig(GetParam());
  const MapWeights w = RandomWeights(c, 11);
  const int bs = 4;
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::vector<std::vector<float>>> alone;
  for (int s = 0; s < 8; ++s) {
    prompts.push_back(Prompt(3 + 9 * s, 100 + s, c.vocab_size));
    alone.push_back(RunAlone(c, w, prompts[s], 1000, 4, 32));
  }
  // Batched: sequences start at different steps, so prefill chunks (of 5
  // tokens) and decode tokens share steps.
  auto b = Make(c, w, bs, 1024);
  Tables tab;
  std::vector<std::vector<int32_t>> seqs = prompts;
  std::vector<int> pos(8, 0), decoded(8, 0);
  std::vector<std::vector<std::vector<float>>> got(8);
  std::vector<float> logits(8 * c.vocab_size);
  for (int step = 0; step < 200; ++step) {
    std::vector<SeqStep> batch;
    std::vector<int> who;
    for (int s = 0; s < 8; ++s) {
      if (step < s || decoded[s] > 4) continue;
      const int len = seqs[s].size();
      int n = pos[s] < static_cast<int>(prompts[s].size()) ? std::min(5, len - pos[s]) : 1;
      if (pos[s] >= static_cast<int>(prompts[s].size())) n = len - pos[s];
      tab.Ensure(b->cache_spec(), s, pos[s] + n, bs);
      batch.push_back(
          tab.Step(s, std::span(seqs[s]).subspan(pos[s], n), pos[s], pos[s] + n == len));
      who.push_back(s);
      pos[s] += n;
    }
    if (batch.empty()) break;
    ASSERT_TRUE(b->Forward(batch, logits).ok());
    int r = 0;
    for (size_t i = 0; i < batch.size(); ++i) {
      if (!batch[i].want_logits) continue;
      const int s = who[i];
      std::vector<float> l(logits.begin() + r * c.vocab_size,
                           logits.begin() + (r + 1) * c.vocab_size);
      ++r;
      got[s].push_back(l);
      ++decoded[s];
      seqs[s].push_back(static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin()));
    }
  }
  for (int s = 0; s < 8; ++s) {
    ASSERT_EQ(got[s].size(), 5u) << s;
    for (size_t i = 0; i < 5; ++i)
      EXPECT_LT(RelErr(got[s][i], alone[s][i]), 1e-4) << "seq " << s << " step " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Archs, CpuBackendArchTest,
                         ::testing::Values(Architecture::kLlama, Architecture::kQwen2,
                                           Architecture::kQwen3, Architecture::kGemma3));

TEST(CpuBackendTest, SlidingWindowRingMatchesDirectAttention) {
  // With a window of 7 and blocks of 2, the ring holds ceil(7/2)+1 = 5 blocks;
  // a 40-token context must give the same logits as with one huge block.
  const ModelConfig c = SmallConfig(Architecture::kGemma3);
  const MapWeights w = RandomWeights(c, 5);
  const auto prompt = Prompt(40, 9, c.vocab_size);
  const auto ref = RunAlone(c, w, prompt, 1000, 3, 64);
  const auto got = RunAlone(c, w, prompt, 3, 3, 2);
  for (size_t i = 0; i < ref.size(); ++i) EXPECT_LT(RelErr(got[i], ref[i]), 1e-4);
  EXPECT_EQ(c.CacheSpec(KvDtype::kF32).BlocksFor(0, 40, 2), 5);
}

TEST(CpuBackendTest, RejectsBadBatches) {
  const ModelConfig c = SmallConfig(Architecture::kQwen3);
  const MapWeights w = RandomWeights(c, 1);
  auto b = Make(c, w, 4, 8);
  std::vector<float> logits(c.vocab_size);
  std::vector<int32_t> toks = {1, 2, 3, 4, 5};
  std::vector<int32_t> table = {0};  // too short for 5 tokens
  SeqStep st;
  st.tokens = toks;
  st.block_tables[0] = table;
  st.want_logits = true;
  EXPECT_EQ(b->Forward({&st, 1}, logits).code(), StatusCode::kInvalidArgument);
  std::vector<int32_t> table2 = {0, 99};  // block out of range
  st.block_tables[0] = table2;
  EXPECT_EQ(b->Forward({&st, 1}, logits).code(), StatusCode::kInvalidArgument);
  std::vector<int32_t> bad = {1000};
  st.tokens = bad;
  st.block_tables[0] = table;
  EXPECT_EQ(b->Forward({&st, 1}, logits).code(), StatusCode::kInvalidArgument);
  MapWeights missing = w;
  missing.t.erase("model.layers.1.mlp.up_proj.weight");
  auto r = CpuBackend::Create(c, missing, {});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("model.layers.1.mlp.up_proj.weight"), std::string::npos);
}

}  // namespace
}  // namespace agentkv

namespace agentkv {
namespace {

// Two sequences with a common 3-block prefix: the second attaches the first's
// prefix-cached blocks (same physical blocks) and computes only its suffix;
// its logits equal those of an unshared run.
TEST(CpuBackendTest, SharedPrefixBlocksGiveSameLogitsAsUnshared) {
  const ModelConfig c = SmallConfig(Architecture::kQwen3);
  const MapWeights w = RandomWeights(c, 17);
  const ModelCacheSpec spec = c.CacheSpec(KvDtype::kF32);
  const int bs = 4;
  KvCacheConfig kc;
  kc.block_size = bs;
  kc.blocks_per_group = {64};
  auto kv = std::move(KvCacheManager::Create(spec, kc).value());
  auto b = Make(c, w, bs, 64);
  const std::vector<int32_t> prefix = Prompt(12, 40, c.vocab_size);
  std::vector<int32_t> a = prefix, bseq = prefix;
  for (int32_t t : Prompt(3, 41, c.vocab_size)) a.push_back(t);
  for (int32_t t : Prompt(5, 42, c.vocab_size)) bseq.push_back(t);
  std::vector<float> logits(c.vocab_size);
  auto run = [&](KvCacheManager::SeqId id, const std::vector<int32_t>& toks) {
    EXPECT_TRUE(kv->AddSequence(id).ok());
    const int64_t cached = kv->AttachCachedPrefix(id, toks).value();
    std::vector<KvBlockCopy> copies;
    EXPECT_TRUE(kv->EnsureCapacity(id, toks.size(), &copies).ok());
    EXPECT_TRUE(b->CopyBlocks(copies).ok());
    kv->CopiesDone();
    SeqStep st;
    st.tokens = std::span(toks).subspan(cached);
    st.start_pos = static_cast<int32_t>(cached);
    st.want_logits = true;
    st.block_tables[0] = kv->Table(id, 0).blocks();
    EXPECT_TRUE(b->Forward({&st, 1}, logits).ok());
    EXPECT_TRUE(kv->CommitTokens(id, st.tokens).ok());
    return cached;
  };
  EXPECT_EQ(run(1, a), 0);
  EXPECT_EQ(run(2, bseq), 12);  // three full blocks reused
  for (int i = 0; i < 3; ++i) EXPECT_EQ(kv->Table(1, 0).blocks()[i], kv->Table(2, 0).blocks()[i]);
  const std::vector<float> shared = logits;
  const auto alone = RunAlone(c, w, bseq, 1000, 0, bs);
  EXPECT_LT(RelErr(shared, alone[0]), 1e-5);
}

}  // namespace
}  // namespace agentkv
