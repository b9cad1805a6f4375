// The CUDA backend's GEMM plan (gemm_plan.h): which kernel runs each
// projection of a step, on the host (no GPU, no CUDA toolkit needed). The
// expected splits are the ones the warpgroup GEMM was measured fastest with.
#include "engine/backend/cuda/gemm_plan.h"

#include <gtest/gtest.h>

#include "engine/backend/cuda/step_plan.h"

namespace agentkv::backend::cuda {
namespace {

constexpr int kQkvPlanesMax = 8;  // kernels::kMaxQkvPlanes

// A dense model's shapes on an H100 (132 SMs), the prompt GEMM on.
GemmModel Shape(int hidden, int heads, int kv_heads, int head_dim, int inter, int vocab) {
  GemmModel g;
  g.hidden = hidden;
  g.qkv_n = (heads + 2 * kv_heads) * head_dim;
  g.attn_n = heads * head_dim;
  g.inter = inter;
  g.vocab = vocab;
  g.num_sms = 132;
  g.prompt_gemm = true;
  return g;
}

// Llama-3.2-1B: hidden 2,048 takes the warpgroup GEMM from 3 rows.
GemmModel Llama1B() {
  GemmModel g = Shape(2048, 32, 8, 64, 8192, 128256);
  g.wgmma_min_rows = 3;
  return g;
}

// Qwen3-8B: hidden 4,096, the warpgroup GEMM off (slower than cuBLAS there).
GemmModel Qwen8B() { return Shape(4096, 32, 8, 128, 12288, 151936); }

TEST(GemmPlanTest, OneRowFusesTheNormsIntoTheGemvs) {
  const GemmModel g = Llama1B();
  const DenseLayerPlan p = PlanDenseLayer(g, 1, /*fused_rotary=*/true, kQkvPlanesMax);
  EXPECT_EQ(p.qkv, QkvPath::kNormGemv);
  EXPECT_EQ(p.gate_up, GateUpPath::kNormGemvAct);
  EXPECT_EQ(p.o, ResidualPath::kGemmAdd);
  EXPECT_EQ(p.down, ResidualPath::kGemmAdd);
  EXPECT_EQ(p.o_planes, 0);
  EXPECT_EQ(ChooseGemm(g, 1, g.hidden, g.attn_n), GemmKernel::kGemv);
  EXPECT_EQ(ChooseGemm(g, 2, g.hidden, g.inter), GemmKernel::kGemv);
  EXPECT_EQ(PlanLmHead(g, 1), LmHeadPath::kGemmArgmax);
}

TEST(GemmPlanTest, SwitchesAndSandwichNormsKeepTheNormOutOfTheActivationGemv) {
  GemmModel g = Llama1B();
  g.gemv_pipe = false;
  EXPECT_EQ(PlanDenseLayer(g, 1, true, kQkvPlanesMax).gate_up, GateUpPath::kGemvAct);
  g = Llama1B();
  g.sandwich_norm = true;
  const DenseLayerPlan p = PlanDenseLayer(g, 2, true, kQkvPlanesMax);
  EXPECT_EQ(p.gate_up, GateUpPath::kGemvAct);
  EXPECT_EQ(p.o, ResidualPath::kGemmOut);
  EXPECT_EQ(p.down, ResidualPath::kGemmOut);
}

TEST(GemmPlanTest, DecodeBatchesSplitTheResidualProjectionsIntoPlanes) {
  const GemmModel g = Llama1B();
  const DenseLayerPlan p = PlanDenseLayer(g, 16, /*fused_rotary=*/true, kQkvPlanesMax);
  EXPECT_EQ(p.qkv, QkvPath::kWgmmaPlanes);
  EXPECT_EQ(p.qkv_planes, 4);
  EXPECT_EQ(p.o, ResidualPath::kPlanes);
  EXPECT_EQ(p.o_planes, 8);
  EXPECT_EQ(p.down, ResidualPath::kPlanes);
  EXPECT_EQ(p.down_planes, 8);
  EXPECT_EQ(p.gate_up, GateUpPath::kWgmmaAct);  // 256 tiles: no split needed
  // More planes than the attention adds: the QKV projection goes unsplit.
  EXPECT_EQ(PlanDenseLayer(g, 16, true, 2).qkv, QkvPath::kNormThenGemm);
  // Without the fused rotary the QKV projection leaves no planes, and its
  // split plan keeps it off the warpgroup GEMM.
  const DenseLayerPlan q = PlanDenseLayer(g, 16, /*fused_rotary=*/false, kQkvPlanesMax);
  EXPECT_EQ(q.qkv, QkvPath::kNormThenGemm);
  EXPECT_EQ(ChooseGemm(g, 16, g.qkv_n, g.hidden), GemmKernel::kCublas);
  EXPECT_EQ(PlanLmHead(g, 4), LmHeadPath::kWgmmaArgmax);
  EXPECT_EQ(PlanLmHead(g, 16), LmHeadPath::kPromptArgmax);
}

TEST(GemmPlanTest, PromptStepsTakeThePersistentGemm) {
  GemmModel g = Llama1B();
  DenseLayerPlan p = PlanDenseLayer(g, 512, false, kQkvPlanesMax);
  EXPECT_EQ(p.gate_up, GateUpPath::kPromptAct);
  EXPECT_EQ(p.o, ResidualPath::kGemmAdd);  // past the warpgroup GEMM's 64 rows
  EXPECT_TRUE(UsePromptGemm(g, 65, 2 * g.inter, g.hidden));
  EXPECT_FALSE(UsePromptGemm(g, 64, 2 * g.inter, g.hidden));
  EXPECT_FALSE(UsePromptGemm(g, 512, 2 * g.inter + 128, g.hidden));  // not whole 256-wide tiles
  EXPECT_EQ(PlanLmHead(g, 512), LmHeadPath::kPromptArgmax);
  g.prompt_gemm = false;  // off, or a device without it
  p = PlanDenseLayer(g, 512, false, kQkvPlanesMax);
  EXPECT_EQ(p.gate_up, GateUpPath::kGemmThenAct);
  EXPECT_EQ(PlanLmHead(g, 512), LmHeadPath::kGemmArgmax);  // 512 rows: past the warpgroup GEMM
  EXPECT_EQ(PlanLmHead(g, 16), LmHeadPath::kWgmmaArgmax);
}

TEST(GemmPlanTest, TheLmHeadArgmaxNeedsItsSwitchAndNoSoftcap) {
  GemmModel g = Llama1B();
  g.softcap = true;
  EXPECT_EQ(PlanLmHead(g, 16), LmHeadPath::kGemmArgmax);
  g = Llama1B();
  g.lm_argmax = false;  // also what tensor-parallel ranks run with
  EXPECT_EQ(PlanLmHead(g, 16), LmHeadPath::kGemmArgmax);
  g = Llama1B();
  g.prompt_argmax = false;
  EXPECT_EQ(PlanLmHead(g, 16), LmHeadPath::kWgmmaArgmax);
  EXPECT_EQ(PlanLmHead(g, 100), LmHeadPath::kGemmArgmax);
}

TEST(GemmPlanTest, WideModelsKeepCublasWhereTheWarpgroupGemmIsOff) {
  const GemmModel g = Qwen8B();
  const DenseLayerPlan one = PlanDenseLayer(g, 1, true, kQkvPlanesMax);
  EXPECT_EQ(one.qkv, QkvPath::kNormThenGemm);  // 6,144 outputs: past the fused norm's
  EXPECT_EQ(ChooseGemm(g, 1, g.qkv_n, g.hidden), GemmKernel::kGemv);
  EXPECT_EQ(one.gate_up, GateUpPath::kNormGemvAct);
  const DenseLayerPlan p = PlanDenseLayer(g, 16, true, kQkvPlanesMax);
  EXPECT_EQ(p.qkv, QkvPath::kNormThenGemm);
  EXPECT_EQ(p.o, ResidualPath::kGemmAdd);
  EXPECT_EQ(p.gate_up, GateUpPath::kGemmThenAct);
  EXPECT_EQ(ChooseGemm(g, 16, g.hidden, g.attn_n), GemmKernel::kCublas);
  EXPECT_EQ(PlanLmHead(g, 4), LmHeadPath::kGemmArgmax);
  // 151,936 is not a whole number of the prompt GEMM's 256-wide tiles.
  EXPECT_EQ(PlanLmHead(g, 8), LmHeadPath::kGemmArgmax);
}

TEST(GemmPlanTest, TensorParallelRanksLeavePartialSums) {
  GemmModel g = Llama1B();
  g.tp = true;
  const DenseLayerPlan p = PlanDenseLayer(g, 16, true, kQkvPlanesMax);
  EXPECT_EQ(p.o, ResidualPath::kGemmPartial);
  EXPECT_EQ(p.down, ResidualPath::kGemmPartial);
  EXPECT_EQ(p.o_planes + p.down_planes, 0);
}

// The quantized o and down projections (fp8, no plan) as the bf16 ones:
// added into x on one GPU and on rank 0 only under tensor parallelism (the
// others store their partial sums: the all-reduce must count the residual
// once, not once per rank), stored into o with sandwich norms.
TEST(GemmPlanTest, QuantizedResidualProjectionsAddTheResidualOnce) {
  GemmModel g = Llama1B();
  EXPECT_TRUE(QuantResidualAdds(g, 0));
  g.tp = true;
  EXPECT_TRUE(QuantResidualAdds(g, 0));
  EXPECT_FALSE(QuantResidualAdds(g, 1));
  EXPECT_FALSE(QuantResidualAdds(g, 3));
  g.sandwich_norm = true;
  EXPECT_FALSE(QuantResidualAdds(g, 0));
  g.tp = false;
  EXPECT_FALSE(QuantResidualAdds(g, 0));
}

TEST(GemmPlanTest, CublasRowCountsAreTheOnesTheWarmUpRan) {
  EXPECT_EQ(GemmRows(1), 8);
  EXPECT_EQ(GemmRows(64), 64);
  EXPECT_EQ(GemmRows(65), 80);
  EXPECT_EQ(GemmRows(257), 320);
  EXPECT_EQ(CublasRows(5, 64), 8);
  EXPECT_EQ(CublasRows(5, 4), 5);  // never past what the buffers hold, but all of m
  EXPECT_EQ(CublasRows(300, 310), 310);
}

// fp8 dense projections: the quantized GEMV for decode-sized steps (up to
// kDenseQuantGemvMaxRows, 12 rows), the bf16 plan on the dequantized weight
// beyond, for every projection of Qwen3-8B; down (k 12,288) only up to 4
// rows, whose x fills the GEMV's shared memory there.
TEST(GemmPlanTest, ManyRowQuantizedProjectionsRunDequantized) {
  GemmModel g = Qwen8B();
  g.quant_dequant = true;
  EXPECT_EQ(kDenseQuantGemvMaxRows, 12);
  const int shapes[3][2] = {{g.qkv_n, g.hidden}, {g.hidden, g.attn_n}, {2 * g.inter, g.hidden}};
  for (const auto& s : shapes) {
    for (int m : {1, 2, 8, 12}) EXPECT_FALSE(UseDequantGemm(g, m, s[0], s[1])) << m << " " << s[0];
    for (int m : {13, 16, 17, 64, 512, 8192}) EXPECT_TRUE(UseDequantGemm(g, m, s[0], s[1])) << m;
  }
  for (int m : {1, 2, 4}) EXPECT_FALSE(UseDequantGemm(g, m, g.hidden, g.inter)) << m;
  for (int m : {5, 8, 16, 17, 8192}) EXPECT_TRUE(UseDequantGemm(g, m, g.hidden, g.inter)) << m;
  EXPECT_FALSE(UseDequantGemm(g, 0, g.hidden, g.inter));
  // Off (or no scratch): the quantized kernels at every row count.
  g.quant_dequant = false;
  EXPECT_FALSE(UseDequantGemm(g, 8192, g.hidden, g.inter));
}

// Where the quantized GEMV is off or cannot hold a row of x in shared
// memory, the tiles would run at any row count: the dequantized weight
// instead.
TEST(GemmPlanTest, DequantizedWhereTheQuantizedGemvDoesNotRun) {
  GemmModel g = Qwen8B();
  g.quant_dequant = true;
  g.quant_gemv = false;
  EXPECT_TRUE(UseDequantGemm(g, 1, g.hidden, g.inter));
  g.quant_gemv = true;
  EXPECT_FALSE(UseDequantGemm(g, 1, g.hidden, g.inter));
  EXPECT_TRUE(UseDequantGemm(g, 1, 256, 65536));  // 128 KiB of bf16 x a row
}

// Decode graphs run a bucket's row count (DecodeBucket): up to 8
// sequences the quantized GEMV, from 9 (the bucket of 16) the dequantized
// weights, as the steps of 17 and more sequences. With the quantized GEMV
// off every bucket dequantizes; with the scratch off none does.
TEST(GemmPlanTest, DecodeBucketsPastEightSequencesRunDequantized) {
  GemmModel g = Qwen8B();
  g.quant_dequant = true;
  for (int seqs = 1; seqs <= 64; ++seqs) {
    const int rows = DecodeBucket(seqs);
    EXPECT_EQ(UseDequantGemm(g, rows, g.qkv_n, g.hidden), seqs > 8) << seqs;
    EXPECT_EQ(UseDequantGemm(g, rows, 2 * g.inter, g.hidden), seqs > 8) << seqs;
  }
  g.quant_gemv = false;
  for (int seqs : {1, 8, 9, 16}) EXPECT_TRUE(UseDequantGemm(g, DecodeBucket(seqs), g.hidden, 4096));
  g.quant_dequant = false;
  for (int seqs : {1, 9, 64}) EXPECT_FALSE(UseDequantGemm(g, DecodeBucket(seqs), g.hidden, 4096));
}

// A dense layer's gated form, whichever kernel runs gate_up (the bf16
// kernels' activation, the quantized kernels' epilogue): GELU (tanh) for
// Gemma 3's MLP, SwiGLU for the others.
TEST(GemmPlanTest, DenseGatedFormFollowsTheActivation) {
  GemmModel g = Qwen8B();
  EXPECT_EQ(DenseGatedForm(g), kernels::GatedForm::kSwiglu);
  g.gelu_mlp = true;
  EXPECT_EQ(DenseGatedForm(g), kernels::GatedForm::kGeluTanh);
}

TEST(GemmPlanTest, TheScratchHoldsTheLargestProjection) {
  const GemmModel g = Qwen8B();
  const std::array<int64_t, 2> shapes[] = {
      {g.qkv_n, g.hidden}, {g.hidden, g.attn_n}, {2 * g.inter, g.hidden}, {g.hidden, g.inter}};
  EXPECT_EQ(DequantScratchElems(shapes), int64_t{2} * 12288 * 4096);
  EXPECT_EQ(DequantScratchElems({}), 0);
}

}  // namespace
}  // namespace agentkv::backend::cuda
