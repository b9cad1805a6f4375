// What --kv-dtype means on each device (ResolveKvDtype), and that
// CreateBackend refuses an unknown one before loading anything.
#include "engine/backend/backend_factory.h"

#include <gtest/gtest.h>

namespace agentkv {
namespace {

TEST(BackendFactoryTest, KvDtypeByDevice) {
  BackendOptions o;
  o.device = "cpu";
  EXPECT_EQ(ResolveKvDtype(o).value(), KvDtype::kF32);  // the reference, unchanged
  o.kv_dtype = "fp8";
  EXPECT_EQ(ResolveKvDtype(o).value(), KvDtype::kFP8E4M3);
  o.device = "cuda";
  EXPECT_EQ(ResolveKvDtype(o).value(), KvDtype::kFP8E4M3);
  o.kv_dtype = "bf16";
  EXPECT_EQ(ResolveKvDtype(o).value(), KvDtype::kBF16);
  EXPECT_EQ(BackendOptions{}.kv_dtype, "bf16");
}

TEST(BackendFactoryTest, UnknownKvDtypeIsRefused) {
  BackendOptions o;
  o.kv_dtype = "int4";
  EXPECT_EQ(ResolveKvDtype(o).status().code(), StatusCode::kInvalidArgument);
  auto b = CreateBackend("/nonexistent-model-dir", o);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(b.status().message().find("kv-dtype"), std::string::npos);
}

}  // namespace
}  // namespace agentkv
