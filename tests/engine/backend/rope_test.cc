// RopeInvFreq: the scalings of rotary frequencies against their definitions.
#include "engine/backend/rope.h"

#include <gtest/gtest.h>

namespace agentkv {
namespace {

TEST(RopeTest, Llama3ScalingKeepsHighFrequenciesAndScalesLowOnes) {
  RopeSpec plain;
  plain.theta = 500000.f;
  RopeSpec l3 = plain;
  l3.type = "llama3";
  l3.factor = 8.f;
  l3.original_max_position = 8192;
  const auto a = kernels::RopeInvFreq(plain, 128), b = kernels::RopeInvFreq(l3, 128);
  EXPECT_FLOAT_EQ(a[0], b[0]);                // wavelength 2*pi: untouched
  EXPECT_FLOAT_EQ(a.back() / 8.f, b.back());  // longest wavelengths: divided by factor
}

}  // namespace
}  // namespace agentkv
