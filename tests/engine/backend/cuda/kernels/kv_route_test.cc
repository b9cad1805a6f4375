// Which attention path a step takes by KV dtype (kv_route.h), on the host:
// no GPU needed. bf16 keeps every fast path exactly where it was; fp8 takes
// the mma.sync kernel (prompt and decode tiles) where it has the head_dim
// and is routed away from each kernel that reads or writes bf16 cache rows.
#include "engine/backend/cuda/kernels/kv_route.h"

#include <gtest/gtest.h>

namespace agentkv::backend::cuda {
namespace {

TEST(KvRoute, Bf16KeepsItsPaths) {
  for (int bits = 0; bits < 16; ++bits) {
    const bool en = bits & 1, one = bits & 2, wide = bits & 4, sup = bits & 8;
    EXPECT_EQ(kernels::RouteFusedRotary(false, en, one, wide, sup), en && one && !wide && sup)
        << bits;
  }
  for (int bits = 0; bits < 16; ++bits) {
    const bool wide = bits & 1, store = bits & 2, ring = bits & 4, ok = bits & 8;
    EXPECT_EQ(kernels::RouteKvMap(false, wide, store, ring, ok), wide && store && !ring && ok)
        << bits;
  }
  for (bool ring : {false, true})
    for (bool one : {false, true})
      EXPECT_EQ(kernels::RouteStoreBeforeAttention(false, ring, one), !ring || one);
}

// Wide prompt tiles do not depend on the dtype: the kernel that has them
// (mma.sync) reads both caches.
TEST(KvRoute, WideTilesForPromptsWhereTheHeadDimHasThem) {
  EXPECT_TRUE(kernels::RouteWideTiles(/*decode=*/false, /*wide_supported=*/true));
  EXPECT_FALSE(kernels::RouteWideTiles(/*decode=*/true, /*wide_supported=*/true));
  EXPECT_FALSE(kernels::RouteWideTiles(/*decode=*/false, /*wide_supported=*/false));
  EXPECT_FALSE(kernels::RouteWideTiles(/*decode=*/true, /*wide_supported=*/false));
}

TEST(KvRoute, Fp8TakesNoBf16OnlyPath) {
  for (int bits = 0; bits < 16; ++bits) {
    const bool a = bits & 1, b = bits & 2, c = bits & 4, d = bits & 8;
    EXPECT_FALSE(kernels::RouteFusedRotary(true, a, b, c, d));
    EXPECT_FALSE(kernels::RouteKvMap(true, a, b, c, d));
    EXPECT_FALSE(kernels::RouteStoreBeforeAttention(true, a, b));
  }
}

// fp8 attention: the mma.sync kernel wherever it has the head_dim, wide
// tiles even with mma.sync decode attention turned off (the portable kernel
// has no wide tiles); the portable kernel for other head_dims.
TEST(KvRoute, Fp8ReadsThroughTheMmaKernelWhereItHasTheHeadDim) {
  EXPECT_TRUE(kernels::RouteFp8Mma(/*wide=*/true, /*mma_enabled=*/true, /*mma_supported=*/true));
  EXPECT_TRUE(kernels::RouteFp8Mma(/*wide=*/false, /*mma_enabled=*/true, /*mma_supported=*/true));
  EXPECT_TRUE(kernels::RouteFp8Mma(/*wide=*/true, /*mma_enabled=*/false, /*mma_supported=*/true));
  EXPECT_FALSE(kernels::RouteFp8Mma(/*wide=*/false, /*mma_enabled=*/false, /*mma_supported=*/true));
  for (int bits = 0; bits < 4; ++bits)
    EXPECT_FALSE(kernels::RouteFp8Mma(bits & 1, bits & 2, /*mma_supported=*/false)) << bits;
}

// bf16 attention: wide tiles always on the mma.sync kernel (only head_dims
// it has get them), narrow ones where it has the head_dim unless turned
// off; the portable kernel otherwise.
TEST(KvRoute, Bf16ReadsThroughTheMmaKernelUnlessTurnedOff) {
  for (int bits = 0; bits < 4; ++bits)
    EXPECT_TRUE(kernels::RouteBf16Mma(/*wide=*/true, bits & 1, bits & 2)) << bits;
  EXPECT_TRUE(kernels::RouteBf16Mma(/*wide=*/false, /*mma_enabled=*/true, /*mma_supported=*/true));
  EXPECT_FALSE(
      kernels::RouteBf16Mma(/*wide=*/false, /*mma_enabled=*/false, /*mma_supported=*/true));
  EXPECT_FALSE(
      kernels::RouteBf16Mma(/*wide=*/false, /*mma_enabled=*/true, /*mma_supported=*/false));
}

}  // namespace
}  // namespace agentkv::backend::cuda
