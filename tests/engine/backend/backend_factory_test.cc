// What --kv-dtype means on each device (ResolveKvDtype), and that
// CreateBackend refuses an unknown one before loading anything.
#include "engine/backend/backend_factory.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

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

// The CUDA backend has no experts, sinks or YaRN yet: such a checkpoint is
// refused by name before any weight is read, instead of running as dense.
TEST(BackendFactoryTest, CudaRefusesMixtureOfExpertsModels) {
  namespace fs = std::filesystem;
  const fs::path dir =
      fs::path(::testing::TempDir()) / ("factory_moe_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "config.json") << R"({"architectures": ["Qwen3MoeForCausalLM"],
    "vocab_size": 64, "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
    "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 8,
    "max_position_embeddings": 128, "num_experts": 4, "num_experts_per_tok": 2,
    "moe_intermediate_size": 8})";
  BackendOptions o;
  o.device = "cuda";
  auto b = CreateBackend(dir, o);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(b.status().message().find("Qwen3MoeForCausalLM"), std::string::npos);
  EXPECT_NE(b.status().message().find("--device cpu"), std::string::npos);
  // On the cpu the same directory gets past the config to the (missing)
  // weights.
  o.device = "cpu";
  b = CreateBackend(dir, o);
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().code(), StatusCode::kUnimplemented);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace agentkv
