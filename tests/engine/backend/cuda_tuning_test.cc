// CudaTuning (cuda_tuning.h) on the host, no GPU: what each AGENTKV_CUDA_*
// value makes of its field (the defaults kept for unset and unknown values,
// as the command line has always read them), and the row thresholds and
// attention routes a tuning set through the struct gives.
#include "engine/backend/cuda_tuning.h"

#include <gtest/gtest.h>

#include <map>
#include <string>

#include "engine/backend/cuda/kernels/kv_route.h"

namespace agentkv::backend {
namespace {

using Env = std::map<std::string, std::string>;

CudaTuning FromEnv(const Env& env) {
  return CudaTuningFromEnv([&env](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}

TEST(CudaTuning, NoVariablesGiveTheDocumentedDefaults) {
  const CudaTuning t = FromEnv({});
  EXPECT_TRUE(t.graphs);
  EXPECT_TRUE(t.fused_rotary);
  EXPECT_TRUE(t.gemm_tune);
  EXPECT_FALSE(t.gemm_tune_log);
  EXPECT_EQ(t.wgmma_rows, CudaTuning::kAuto);
  EXPECT_TRUE(t.lm_argmax);
  EXPECT_TRUE(t.prompt_gemm);
  EXPECT_TRUE(t.prompt_argmax);
  EXPECT_TRUE(t.wgmma_attention);
  EXPECT_TRUE(t.mma_attention);
  EXPECT_TRUE(t.gemv_pipe);
  EXPECT_TRUE(t.pdl);
  EXPECT_TRUE(t.moe_gemv);
  EXPECT_TRUE(t.dense_dequant);
  EXPECT_EQ(t.decode_blocks_per_sm, 4);
  EXPECT_TRUE(t.fp8_decode_lean);
  EXPECT_EQ(t.step_log, "");
  EXPECT_EQ(t.profile_batch, 0);
}

// Each switch that is on by default: off for "0" only, and only itself.
TEST(CudaTuning, ZeroTurnsEachSwitchOffAndNothingElse) {
  const std::map<std::string, bool CudaTuning::*> switches = {
      {"AGENTKV_CUDA_GRAPHS", &CudaTuning::graphs},
      {"AGENTKV_CUDA_FUSED_ROTARY", &CudaTuning::fused_rotary},
      {"AGENTKV_CUDA_GEMM_TUNE", &CudaTuning::gemm_tune},
      {"AGENTKV_CUDA_LM_ARGMAX", &CudaTuning::lm_argmax},
      {"AGENTKV_CUDA_PROMPT_GEMM", &CudaTuning::prompt_gemm},
      {"AGENTKV_CUDA_PROMPT_ARGMAX", &CudaTuning::prompt_argmax},
      {"AGENTKV_CUDA_WGMMA_ATTENTION", &CudaTuning::wgmma_attention},
      {"AGENTKV_CUDA_MMA_ATTENTION", &CudaTuning::mma_attention},
      {"AGENTKV_CUDA_GEMV_PIPE", &CudaTuning::gemv_pipe},
      {"AGENTKV_CUDA_PDL", &CudaTuning::pdl},
      {"AGENTKV_CUDA_MOE_GEMV", &CudaTuning::moe_gemv},
      {"AGENTKV_CUDA_DENSE_DEQUANT", &CudaTuning::dense_dequant},
      {"AGENTKV_CUDA_FP8_DECODE_LEAN", &CudaTuning::fp8_decode_lean},
  };
  for (const auto& [name, field] : switches) {
    const CudaTuning off = FromEnv({{name, "0"}});
    for (const auto& [other, f] : switches)
      EXPECT_EQ(off.*f, other != name) << name << " " << other;
    for (const char* v : {"1", "", "false", "00", "off"})
      EXPECT_TRUE(FromEnv({{name, v}}).*field) << name << "=" << v;
  }
}

TEST(CudaTuning, TuneLogIsOnWhenSetToAnything) {
  EXPECT_FALSE(FromEnv({}).gemm_tune_log);
  for (const char* v : {"1", "0", ""})
    EXPECT_TRUE(FromEnv({{"AGENTKV_CUDA_GEMM_TUNE_LOG", v}}).gemm_tune_log) << v;
}

TEST(CudaTuning, WgmmaRowsArePositiveCountsOrNever) {
  EXPECT_EQ(FromEnv({{"AGENTKV_CUDA_WGMMA", "16"}}).wgmma_rows, 16);
  EXPECT_EQ(FromEnv({{"AGENTKV_CUDA_WGMMA", "1"}}).wgmma_rows, 1);
  for (const char* v : {"0", "-3", "abc", ""})
    EXPECT_EQ(FromEnv({{"AGENTKV_CUDA_WGMMA", v}}).wgmma_rows, 0) << v;
}

TEST(CudaTuning, DecodeBlocksPerSmTakesPositiveCounts) {
  EXPECT_EQ(FromEnv({{"AGENTKV_CUDA_DECODE_BLOCKS_PER_SM", "16"}}).decode_blocks_per_sm, 16);
  for (const char* v : {"0", "-1", "x", ""})
    EXPECT_EQ(FromEnv({{"AGENTKV_CUDA_DECODE_BLOCKS_PER_SM", v}}).decode_blocks_per_sm, 4) << v;
}

// The lean fp8 decode form is the default; "0" gives the old form back
// (for comparison), any other value keeps the lean one.
TEST(CudaTuning, Fp8DecodeLeanIsOnUnlessZero) {
  EXPECT_TRUE(FromEnv({}).fp8_decode_lean);
  EXPECT_FALSE(FromEnv({{"AGENTKV_CUDA_FP8_DECODE_LEAN", "0"}}).fp8_decode_lean);
  for (const char* v : {"1", "", "true", "2"})
    EXPECT_TRUE(FromEnv({{"AGENTKV_CUDA_FP8_DECODE_LEAN", v}}).fp8_decode_lean) << v;
}

TEST(CudaTuning, StepLogAndProfileBatch) {
  const CudaTuning t =
      FromEnv({{"AGENTKV_CUDA_STEP_LOG", "/tmp/steps.log"}, {"AGENTKV_CUDA_PROFILE_BATCH", "64"}});
  EXPECT_EQ(t.step_log, "/tmp/steps.log");
  EXPECT_EQ(t.profile_batch, 64);
  const CudaTuning empty =
      FromEnv({{"AGENTKV_CUDA_STEP_LOG", ""}, {"AGENTKV_CUDA_PROFILE_BATCH", ""}});
  EXPECT_EQ(empty.step_log, "");
  EXPECT_EQ(empty.profile_batch, 0);
}

TEST(CudaTuning, WgmmaMinRowsFollowTheTuning) {
  using cuda::kNeverRows;
  using cuda::WgmmaMinRows;
  const CudaTuning def;
  EXPECT_EQ(WgmmaMinRows(def, 2048, true), cuda::kWgmmaMinRows);
  EXPECT_EQ(WgmmaMinRows(def, 4096, true), kNeverRows);  // above kWgmmaMaxHidden
  // Asked for: any hidden size.
  const CudaTuning rows16 = FromEnv({{"AGENTKV_CUDA_WGMMA", "16"}});
  EXPECT_EQ(WgmmaMinRows(rows16, 4096, true), 16);
  EXPECT_EQ(WgmmaMinRows(rows16, 2048, true), 16);
  const CudaTuning never = FromEnv({{"AGENTKV_CUDA_WGMMA", "0"}});
  EXPECT_EQ(WgmmaMinRows(never, 2048, true), kNeverRows);
  // Off compute capability 9.0 whatever the tuning says.
  for (const CudaTuning& t : {def, rows16, never})
    for (int hidden : {1024, 4096}) EXPECT_EQ(WgmmaMinRows(t, hidden, false), kNeverRows);
}

// The mma.sync switch as LaunchAttention reads it (AttentionParams::mma
// from CudaTuning::mma_attention): narrow tiles go to the portable kernel,
// wide ones keep the mma.sync kernel.
TEST(CudaTuning, MmaAttentionSwitchRoutesNarrowTiles) {
  const CudaTuning on = FromEnv({});
  const CudaTuning off = FromEnv({{"AGENTKV_CUDA_MMA_ATTENTION", "0"}});
  for (const bool wide : {false, true}) {
    EXPECT_TRUE(cuda::kernels::RouteBf16Mma(wide, on.mma_attention, /*mma_supported=*/true))
        << wide;
    EXPECT_TRUE(cuda::kernels::RouteFp8Mma(wide, on.mma_attention, /*mma_supported=*/true)) << wide;
    EXPECT_EQ(cuda::kernels::RouteBf16Mma(wide, off.mma_attention, true), wide);
    EXPECT_EQ(cuda::kernels::RouteFp8Mma(wide, off.mma_attention, true), wide);
  }
}

}  // namespace
}  // namespace agentkv::backend
