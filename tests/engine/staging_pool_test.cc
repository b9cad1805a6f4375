#include "engine/staging_pool.h"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "engine/backend/cpu/cpu_backend.h"
#include "test_model.h"

namespace agentkv::engine {
namespace {

std::unique_ptr<backend::Backend> SmallBackend() {
  const model::ModelConfig c = testing::SmallConfig(model::Architecture::kQwen3);
  static const testing::MapWeights w = testing::RandomWeights(c, 3);
  auto b = backend::cpu::CpuBackend::Create(c, w, backend::cpu::CpuBackendOptions{1});
  EXPECT_TRUE(b.ok());
  return std::move(b).value();
}

TEST(StagingPoolTest, LendsEachChunkOnceAndTakesItBackFromAnyThread) {
  auto backend = SmallBackend();
  auto pool = StagingPool::Create(*backend, 4096, 3);
  ASSERT_TRUE(pool.ok());
  std::shared_ptr<StagingPool> p = *pool;
  EXPECT_EQ(p->chunks(), 3);
  EXPECT_EQ(p->chunk_bytes(), 4096u);
  auto a = p->TryAcquire(), b = p->TryAcquire(), c = p->TryAcquire();
  ASSERT_TRUE(a && b && c);
  EXPECT_EQ(p->TryAcquire(), nullptr);
  EXPECT_EQ(p->free_chunks(), 0);
  EXPECT_NE(a->data(), b->data());
  EXPECT_NE(b->data(), c->data());
  EXPECT_EQ(a->size(), 4096u);
  // A copy keeps the chunk out; the last one returns it, here from another
  // thread.
  auto a2 = a;
  a.reset();
  EXPECT_EQ(p->free_chunks(), 0);
  std::thread([x = std::move(a2)]() mutable { x.reset(); }).join();
  EXPECT_EQ(p->free_chunks(), 1);
  auto again = p->TryAcquire();
  ASSERT_TRUE(again);
  EXPECT_EQ(p->free_chunks(), 0);
}

TEST(StagingPoolTest, ChunksOutliveThePoolHandle) {
  auto backend = SmallBackend();
  auto pool = StagingPool::Create(*backend, 1024, 1);
  ASSERT_TRUE(pool.ok());
  auto chunk = (*pool)->TryAcquire();
  ASSERT_TRUE(chunk);
  pool->reset();  // the engine let go; a tier still holds the chunk
  std::fill(chunk->begin(), chunk->end(), std::byte{7});
  EXPECT_EQ((*chunk)[1023], std::byte{7});
  chunk.reset();  // frees the pool (ASan checks the memory is released once)
}

}  // namespace
}  // namespace agentkv::engine
