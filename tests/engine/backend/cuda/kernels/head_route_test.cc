// The QkvPost kernels' head routing and cache-row arithmetic (head_route.h),
// on the host: no GPU needed.
#include "../test_util.h"

#ifdef AGENTKV_HAVE_CUDA

#include <vector>

#include "engine/backend/cuda/kernels/head_route.h"

namespace agentkv::backend::cuda {
namespace {

TEST(HeadRoute, QKAndVHeadsGoToTheirRowsAndCacheSlots) {
  const int nh = 4, nkv = 2, D = 8, bs = 16, t = 3;
  std::vector<kernels::bf16_t> q(64 * nh * D), k(64 * nkv * D), v(64 * nkv * D), cache(4096);
  const float qn[D] = {}, kn[D] = {};
  kernels::bf16_t* ck = cache.data() + 100;
  for (int hh = 0; hh < nh + 2 * nkv; ++hh) {
    const kernels::HeadRoute r =
        kernels::RouteHead(hh, t, nh, nkv, D, bs, q.data(), k.data(), v.data(), qn, kn, ck);
    if (hh < nh) {
      EXPECT_EQ(r.dst, q.data() + (t * nh + hh) * D);
      EXPECT_EQ(r.cache, nullptr);
      EXPECT_EQ(r.norm, qn);
      EXPECT_TRUE(r.rotary);
    } else if (hh < nh + nkv) {
      EXPECT_EQ(r.dst, k.data() + (t * nkv + hh - nh) * D);
      EXPECT_EQ(r.cache, ck + (hh - nh) * D);
      EXPECT_EQ(r.norm, kn);
      EXPECT_TRUE(r.rotary);
    } else {
      EXPECT_EQ(r.dst, v.data() + (t * nkv + hh - nh - nkv) * D);
      EXPECT_EQ(r.cache, ck + bs * nkv * D + (hh - nh - nkv) * D);  // V: block_size rows on
      EXPECT_EQ(r.norm, nullptr);
      EXPECT_FALSE(r.rotary);
    }
  }
  // Without a cache row, nothing goes to the cache.
  EXPECT_EQ(kernels::RouteHead(nh, t, nh, nkv, D, bs, q.data(), k.data(), v.data(), qn, kn, nullptr)
                .cache,
            nullptr);
}

TEST(HeadRoute, CacheRowFollowsTheBlockTableAndRing) {
  std::vector<kernels::bf16_t> base(1 << 16);
  const int32_t stride = 4;
  // Sequence 1's blocks: 7, 2, 5, 9.
  const std::vector<int32_t> tables = {0, 0, 0, 0, 7, 2, 5, 9};
  const std::vector<int32_t> tok_seq = {1, 1};
  kernels::KvCacheView c;
  c.base = base.data();
  c.block_stride = 1000;
  c.layer_offset = 30;
  c.block_size = 4;
  c.tables = tables.data();
  c.table_stride = &stride;
  const int nkv = 2, D = 8;
  // Position 9: logical block 2 (id 5), slot 1.
  EXPECT_EQ(kernels::CacheRow(c, tok_seq.data(), 1, 9, nkv, D),
            base.data() + 5 * 1000 + 30 + 1 * nkv * D);
  c.ring = 2;  // a sliding group's ring of 2 blocks: logical block 2 -> slot 0 (id 7)
  EXPECT_EQ(kernels::CacheRow(c, tok_seq.data(), 1, 9, nkv, D),
            base.data() + 7 * 1000 + 30 + 1 * nkv * D);
  EXPECT_EQ(kernels::CacheRow(c, tok_seq.data(), 0, -1, nkv, D), nullptr);  // padding
  EXPECT_EQ(kernels::CacheRow(c, nullptr, 0, 9, nkv, D), nullptr);          // no cache
}

}  // namespace
}  // namespace agentkv::backend::cuda

#else
TEST(HeadRoute, Skipped) { GTEST_SKIP() << "built without CUDA (no toolkit found)"; }
#endif
