// What --kv-dtype means on each device (ResolveKvDtype), and that
// CreateBackend refuses an unknown one before loading anything.
#include "engine/backend/backend_factory.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

namespace agentkv::backend {
namespace {

TEST(BackendFactoryTest, KvDtypeByDevice) {
  BackendOptions o;
  o.device = "cpu";
  EXPECT_EQ(ResolveKvDtype(o).value(), cache::KvDtype::kF32);  // the reference, unchanged
  o.kv_dtype = "fp8";
  EXPECT_EQ(ResolveKvDtype(o).value(), cache::KvDtype::kFP8E4M3);
  o.device = "cuda";
  EXPECT_EQ(ResolveKvDtype(o).value(), cache::KvDtype::kFP8E4M3);
  o.kv_dtype = "bf16";
  EXPECT_EQ(ResolveKvDtype(o).value(), cache::KvDtype::kBF16);
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

// Mixture-of-experts checkpoints (experts, sinks, YaRN) are no longer
// refused by the factory for the GPU: on either device the same directory
// gets past the config to the (missing) weights. (Shapes the CUDA kernels
// lack, and quantized checkpoints, are refused by CudaBackend::Create:
// tests/engine/backend/cuda/backend_test.cc.)
TEST(BackendFactoryTest, MixtureOfExpertsModelsReachTheWeightsOnEitherDevice) {
  namespace fs = std::filesystem;
  const fs::path dir =
      fs::path(::testing::TempDir()) / ("factory_moe_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "config.json") << R"({"architectures": ["Qwen3MoeForCausalLM"],
    "vocab_size": 64, "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
    "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 8,
    "max_position_embeddings": 128, "num_experts": 4, "num_experts_per_tok": 2,
    "moe_intermediate_size": 8})";
  for (const char* device : {"cuda", "cpu"}) {
    BackendOptions o;
    o.device = device;
    auto b = CreateBackend(dir, o);
    ASSERT_FALSE(b.ok()) << device;
    EXPECT_EQ(b.status().code(), StatusCode::kNotFound) << device << ": " << b.status().ToString();
  }
  fs::remove_all(dir);
}

// --tensor-parallel is refused at start, before any weight is read: on the
// CPU, below 1, and with fewer GPUs than asked for (this test's machine may
// have none; a CUDA-less build says it has no CUDA backend).
TEST(BackendFactoryTest, TensorParallelRefusedAtStart) {
  namespace fs = std::filesystem;
  const fs::path dir =
      fs::path(::testing::TempDir()) / ("factory_tp_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "config.json") << R"({"architectures": ["Qwen3ForCausalLM"],
    "vocab_size": 64, "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
    "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 8,
    "max_position_embeddings": 128})";
  auto refused = [&](const BackendOptions& o, const std::string& text) {
    auto b = CreateBackend(dir, o);
    ASSERT_FALSE(b.ok());
    EXPECT_EQ(b.status().code(), StatusCode::kInvalidArgument) << b.status().ToString();
    EXPECT_NE(b.status().message().find(text), std::string::npos) << b.status().ToString();
  };
  BackendOptions o;
  o.tensor_parallel = 2;
  refused(o, "needs --device cuda");  // the cpu
  o.tensor_parallel = 0;
  refused(o, "at least 1");
  o.device = "cuda";
  o.tensor_parallel = 1024;
#ifdef AGENTKV_HAVE_CUDA
  refused(o, "--tensor-parallel 1024 needs 1024 GPUs; this process sees");
  // Any degree the GPUs or the model cannot take.
  o.tensor_parallel = 3;
  auto b = CreateBackend(dir, o);
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find("--tensor-parallel 3"), std::string::npos)
      << b.status().ToString();
#else
  auto b = CreateBackend(dir, o);
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find("no CUDA backend"), std::string::npos);
#endif
  fs::remove_all(dir);
}

}  // namespace
}  // namespace agentkv::backend
