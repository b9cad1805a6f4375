// KV pool sizing: the pure arithmetic, the default measured against a
// backend whose free memory is a chosen number, and what the engine does
// with the pool's capacity (a prompt it cannot hold is refused up front).
#include "engine/kv_pool_sizing.h"

#include <gtest/gtest.h>

#include "engine/backend/cpu/cpu_backend.h"
#include "engine/engine.h"
#include "engine/finish_reason.h"
#include "test_model.h"

namespace agentkv::engine {
namespace {

using testing::MapWeights;
using testing::RandomWeights;
using testing::SmallConfig;

std::unique_ptr<backend::Backend> Cpu(model::Architecture arch) {
  const model::ModelConfig c = SmallConfig(arch);
  const MapWeights w = RandomWeights(c, 5);
  auto b = backend::cpu::CpuBackend::Create(c, w, backend::cpu::CpuBackendOptions{1});
  EXPECT_TRUE(b.ok()) << b.status().ToString();
  return std::move(b).value();
}

// A CPU backend that reports `free` bytes of free memory (less the pool it
// holds, as a device would) and records the pools it was asked for.
class FakeFreeMemory final : public backend::Backend {
 public:
  FakeFreeMemory(std::unique_ptr<backend::Backend> inner, uint64_t free, double fraction)
      : inner_(std::move(inner)), free_(free), fraction_(fraction) {}
  const model::ModelConfig& config() const override { return inner_->config(); }
  const cache::ModelCacheSpec& cache_spec() const override { return inner_->cache_spec(); }
  std::string name() const override { return "fake-free"; }
  Result<uint64_t> FreeMemoryBytes() const override {
    const backend::KvLayout& l = inner_->kv_layout();
    std::vector<int32_t> blocks(
        l.blocks_per_group.begin(),
        l.blocks_per_group.begin() + static_cast<long>(cache_spec().groups.size()));
    return free_ - PoolBytes(cache_spec(), l.block_size, blocks);
  }
  double default_kv_memory_fraction() const override { return fraction_; }
  Status AllocateKv(const backend::KvLayout& layout) override {
    layouts.push_back(layout);
    return inner_->AllocateKv(layout);
  }
  const backend::KvLayout& kv_layout() const override { return inner_->kv_layout(); }
  Status Reserve(int max_step_tokens, int max_batch) override {
    ++reserves;
    return inner_->Reserve(max_step_tokens, max_batch);
  }
  Status CopyBlocks(std::span<const cache::KvBlockCopy> copies) override {
    return inner_->CopyBlocks(copies);
  }
  Status Forward(std::span<const backend::SeqStep> batch, std::span<float> logits) override {
    return inner_->Forward(batch, logits);
  }
  Status ReadBlock(int group, int32_t block, std::span<std::byte> out) override {
    return inner_->ReadBlock(group, block, out);
  }
  Status WriteBlock(int group, int32_t block, std::span<const std::byte> in) override {
    return inner_->WriteBlock(group, block, in);
  }
  std::vector<backend::KvLayout> layouts;
  int reserves = 0;

 private:
  std::unique_ptr<backend::Backend> inner_;
  uint64_t free_;
  double fraction_;
};

TEST(KvPoolSizingTest, MinimumPoolAndCapacity) {
  const cache::ModelCacheSpec full =
      SmallConfig(model::Architecture::kQwen3).CacheSpec(cache::KvDtype::kF32);
  EXPECT_EQ(MinimumBlocks(full, 4), std::vector<int32_t>({1}));
  // 3 layers x K,V x 4 tokens x 2 heads x 16 dims x 4 bytes.
  EXPECT_EQ(PoolBytes(full, 4, {10}), 10u * 3 * 2 * 4 * 2 * 16 * 4);
  EXPECT_EQ(SequenceCapacity(full, 4, {10}, 4096), 40);

  // Gemma-style: a sliding group (window 7: rings of ceil(7/4)+1 = 3 blocks)
  // and a full group; only the full group limits one sequence.
  const cache::ModelCacheSpec mixed =
      SmallConfig(model::Architecture::kGemma3).CacheSpec(cache::KvDtype::kF32);
  ASSERT_EQ(mixed.groups.size(), 2u);
  const std::vector<int32_t> min = MinimumBlocks(mixed, 4);
  for (size_t g = 0; g < 2; ++g) {
    EXPECT_EQ(min[g], mixed.groups[g].kind == cache::AttentionKind::kFull ? 1 : 3) << g;
  }
  std::vector<int32_t> blocks(2);
  for (size_t g = 0; g < 2; ++g)
    blocks[g] = mixed.groups[g].kind == cache::AttentionKind::kFull ? 25 : 6;
  EXPECT_EQ(SequenceCapacity(mixed, 4, blocks, 4096), 100);
}

TEST(KvPoolSizingTest, GivenBlocksOrBytesAreUsedWithoutProbing) {
  FakeFreeMemory b(Cpu(model::Architecture::kQwen3), 1ull << 30, 0.5);
  KvPoolSize given;
  given.blocks_per_group = {7};
  EXPECT_EQ(SizeKvPool(b, 4, given, 64, 8).value(), std::vector<int32_t>({7}));
  KvPoolSize bytes;
  bytes.bytes = PoolBytes(b.cache_spec(), 4, {100}) + 5;
  EXPECT_EQ(SizeKvPool(b, 4, bytes, 64, 8).value(), std::vector<int32_t>({100}));
  EXPECT_TRUE(b.layouts.empty());
  EXPECT_EQ(b.reserves, 0);
}

TEST(KvPoolSizingTest, DefaultTakesTheBackendsShareOfWhatIsFreeAfterReserving) {
  const uint64_t block =
      PoolBytes(SmallConfig(model::Architecture::kQwen3).CacheSpec(cache::KvDtype::kF32), 4, {1});
  // 1,000 blocks' worth free with no pool: the backend's 85% is 850 blocks.
  FakeFreeMemory b(Cpu(model::Architecture::kQwen3), 1000 * block, 0.85);
  Result<std::vector<int32_t>> got = SizeKvPool(b, 4, {}, 64, 8);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, std::vector<int32_t>({850}));
  // It measured with the smallest pool and the workspaces reserved.
  ASSERT_EQ(b.layouts.size(), 1u);
  EXPECT_EQ(b.layouts[0].blocks_per_group[0], 1);
  EXPECT_EQ(b.reserves, 1);

  // A fraction given overrides the backend's; a bad one is refused.
  KvPoolSize half;
  half.fraction = 0.5;
  EXPECT_EQ(SizeKvPool(b, 4, half, 64, 8).value(), std::vector<int32_t>({500}));
  KvPoolSize bad;
  bad.fraction = 1.5;
  EXPECT_EQ(SizeKvPool(b, 4, bad, 64, 8).status().code(), StatusCode::kInvalidArgument);

  // Too little memory for even one block.
  FakeFreeMemory tiny(Cpu(model::Architecture::kQwen3), block, 0.5);
  EXPECT_EQ(SizeKvPool(tiny, 4, {}, 64, 8).status().code(), StatusCode::kResourceExhausted);
}

TEST(KvPoolSizingTest, EngineUsesTheDefaultAndRefusesPromptsThePoolCannotHold) {
  const cache::ModelCacheSpec spec =
      SmallConfig(model::Architecture::kQwen3).CacheSpec(cache::KvDtype::kF32);
  const uint64_t block = PoolBytes(spec, 4, {1});
  auto fake = std::make_unique<FakeFreeMemory>(Cpu(model::Architecture::kQwen3), 20 * block, 0.5);
  EngineOptions o;
  o.block_size = 4;
  o.scheduler.max_batch = 4;
  o.scheduler.max_step_tokens = 32;
  auto e = Engine::Create(std::move(fake), nullptr, o);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  EXPECT_EQ((*e)->kv_blocks(), std::vector<int32_t>({10}));
  EXPECT_EQ((*e)->kv_memory_bytes(), 10 * block);
  EXPECT_EQ((*e)->sequence_capacity(), 40);
  EXPECT_EQ((*e)->Stats().pools[0].total, 10);

  EngineRequest r;
  r.params.temperature = 0;
  r.params.ignore_eos = true;
  for (int i = 0; i < 40; ++i) r.prompt.push_back(i % 90);
  Result<RequestHandle> h = (*e)->Submit(r);
  ASSERT_FALSE(h.ok());
  EXPECT_EQ(h.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(h.status().message().find("at most 40 tokens"), std::string::npos)
      << h.status().message();

  // One token less fits, and its output is clamped to what the pool holds
  // (one token) rather than failing mid-stream.
  r.prompt.pop_back();
  r.params.max_tokens = 100;
  Result<RequestHandle> ok = (*e)->Submit(r);
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  int generated = 0;
  while (true) {
    RequestOutput ev = ok->stream->Pop();
    if (ev.kind == RequestOutput::Kind::kDelta) {
      generated += static_cast<int>(ev.tokens.size());
      continue;
    }
    ASSERT_EQ(ev.kind, RequestOutput::Kind::kFinished) << ev.error.ToString();
    EXPECT_EQ(ev.finish, FinishReason::kLength);
    break;
  }
  EXPECT_EQ(generated, 1);
}

}  // namespace
}  // namespace agentkv::engine
