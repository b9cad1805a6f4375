// NcclComms: the checks before NCCL is touched (no GPU needed), and on a
// machine with 2 or more GPUs, all-reduces of fp32, bf16 and argmax keys on
// every visible GPU, one thread and stream per rank, launched plainly and
// from a captured CUDA graph (as the decode steps run them).
#include "test_util.h"

#ifdef AGENTKV_HAVE_CUDA

#include <vector>

#include "engine/backend/cuda/nccl_comms.h"
#include "engine/backend/tp_combine.h"
#include "nccl_test_util.h"

namespace agentkv::backend::cuda {
namespace {

using cuda::NcclComms;
using cuda::NcclOptions;

TEST(NcclComms, RefusesUnsettledMulticastSettingAndBadDevices) {
  const int one[] = {0};
  auto r = NcclComms::Create(one, NcclOptions{});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("NCCL_NVLS_ENABLE"), std::string::npos);
  EXPECT_FALSE(NcclComms::Create(std::span<const int>(), NcclOptions{"0"}).ok());
  const int twice[] = {0, 0};
  auto t = NcclComms::Create(twice, NcclOptions{"0"});
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("twice"), std::string::npos);
  const int beyond[] = {cuda::VisibleGpus(), cuda::VisibleGpus() + 1};
  auto b = NcclComms::Create(beyond, NcclOptions{"0"});
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find("not one of the"), std::string::npos);
}

TEST(NcclComms, AllReducesOnEveryVisibleGpu) {
  AGENTKV_REQUIRE_GPUS(2);
  const int n = cuda::VisibleGpus();
  auto comms = testing::CommsOnEveryGpu();
  ASSERT_TRUE(comms.ok()) << comms.status().ToString();
  // Sizes of a decode step's residual and a prompt chunk's, and an odd one.
  for (size_t count : {size_t{4096}, size_t{1} << 20, size_t{1000003}}) {
    std::vector<std::vector<float>> f32(n);
    std::vector<std::vector<uint16_t>> b16(n);
    std::vector<std::vector<uint64_t>> keys(n);
    const Status st = testing::OnEveryRank(n, [&](int r, cudaStream_t s) -> Status {
      std::vector<float> x(count);
      std::vector<uint16_t> y(count);
      std::vector<uint64_t> k(64);
      for (size_t i = 0; i < count; ++i) {
        x[i] = static_cast<float>((i % 97) * (r + 1));
        y[i] = testing::ToBf16(static_cast<float>(r + 1));
      }
      for (size_t i = 0; i < k.size(); ++i)
        k[i] = tp::ArgmaxKey(static_cast<float>((i + r) % n), static_cast<int64_t>(1000 * r + i));
      cuda::DeviceBuffer dx = testing::Upload(x), dy = testing::Upload(y), dk = testing::Upload(k);
      const cuda::NcclRank rank = (*comms)->rank(r);
      RETURN_IF_ERROR(rank.SumF32(dx.get<float>(), count, s));
      RETURN_IF_ERROR(rank.SumBf16(dy.get(), count, s));
      // The keys' max from a captured graph, launched twice (max is
      // idempotent: the same result).
      RETURN_IF_ERROR(
          testing::RunCaptured(s, 2, [&] { return rank.MaxU64(dk.get<uint64_t>(), k.size(), s); }));
      f32[r] = testing::Download<float>(dx, count);
      b16[r] = testing::Download<uint16_t>(dy, count);
      keys[r] = testing::Download<uint64_t>(dk, k.size());
      return Status::Ok();
    });
    ASSERT_TRUE(st.ok()) << st.ToString();
    const float ranks_sum = static_cast<float>(n * (n + 1) / 2);
    for (int r = 0; r < n; ++r) {
      for (size_t i = 0; i < count; i += 997) {
        ASSERT_EQ(f32[r][i], static_cast<float>(i % 97) * ranks_sum) << r << " " << i;
        ASSERT_EQ(testing::FromBf16(b16[r][i]), ranks_sum) << r << " " << i;
      }
      for (size_t i = 0; i < keys[r].size(); ++i) {
        // The largest value is n - 1, held by the rank with (i + r) % n ==
        // n - 1: its id wins.
        const int winner = static_cast<int>((2 * n - 1 - i % n) % n);
        ASSERT_EQ(tp::ArgmaxKeyId(keys[r][i]), 1000 * winner + static_cast<int>(i))
            << r << " " << i;
      }
    }
  }
}

}  // namespace
}  // namespace agentkv::backend::cuda

#else
TEST(NcclComms, Skipped) { GTEST_SKIP() << "built without CUDA (no toolkit found)"; }
#endif
