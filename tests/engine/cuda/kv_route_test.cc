// Which attention path a step takes by KV dtype (kv_route.h), on the host:
// no GPU needed. bf16 keeps every fast path exactly where it was; fp8 is
// routed away from each kernel that reads or writes bf16 cache rows.
#include "engine/cuda/kv_route.h"

#include <gtest/gtest.h>

namespace agentkv::cuda {
namespace {

TEST(KvRoute, Bf16KeepsItsPaths) {
  for (bool decode : {false, true})
    for (bool sup : {false, true}) EXPECT_EQ(RouteWideTiles(false, decode, sup), !decode && sup);
  for (int bits = 0; bits < 16; ++bits) {
    const bool en = bits & 1, one = bits & 2, wide = bits & 4, sup = bits & 8;
    EXPECT_EQ(RouteFusedRotary(false, en, one, wide, sup), en && one && !wide && sup) << bits;
  }
  for (int bits = 0; bits < 16; ++bits) {
    const bool wide = bits & 1, store = bits & 2, ring = bits & 4, ok = bits & 8;
    EXPECT_EQ(RouteKvMap(false, wide, store, ring, ok), wide && store && !ring && ok) << bits;
  }
  for (bool ring : {false, true})
    for (bool one : {false, true})
      EXPECT_EQ(RouteStoreBeforeAttention(false, ring, one), !ring || one);
}

TEST(KvRoute, Fp8TakesNoBf16OnlyPath) {
  for (int bits = 0; bits < 16; ++bits) {
    const bool a = bits & 1, b = bits & 2, c = bits & 4, d = bits & 8;
    EXPECT_FALSE(RouteWideTiles(true, a, b));
    EXPECT_FALSE(RouteFusedRotary(true, a, b, c, d));
    EXPECT_FALSE(RouteKvMap(true, a, b, c, d));
    EXPECT_FALSE(RouteStoreBeforeAttention(true, a, b));
  }
}

}  // namespace
}  // namespace agentkv::cuda
