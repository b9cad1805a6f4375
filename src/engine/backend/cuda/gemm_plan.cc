#include "engine/backend/cuda/gemm_plan.h"

#include <algorithm>

#include "engine/backend/cuda/kernels/gemm_route.h"
#include "engine/backend/cuda/kernels/moe_plan.h"

namespace agentkv::backend::cuda {

bool UseWgmma(const GemmModel& g, int m, int n, int k) {
  // Not the LM head either: its 2,000 tiles leave the early weight loads
  // nothing to overlap, and cuBLAS was as fast.
  return m >= g.wgmma_min_rows && n <= 32768 && kernels::WgmmaGemmSupported(m, n, k) &&
         kernels::WgmmaGemmPlanFor(n, k, g.num_sms).splits == 1;
}

GemmKernel ChooseGemm(const GemmModel& g, int m, int n, int k) {
  if (m <= kGemvMaxRows && kernels::GemvSupported(m, k)) return GemmKernel::kGemv;
  if (UseWgmma(g, m, n, k)) return GemmKernel::kWgmma;
  return GemmKernel::kCublas;
}

int GemmRows(int m) {
  const int g = m <= 64 ? 8 : m <= 256 ? 16 : 64;
  return (m + g - 1) / g * g;
}

int CublasRows(int m, int64_t max_rows) {
  return static_cast<int>(std::min<int64_t>(GemmRows(m), std::max<int64_t>(max_rows, m)));
}

int PlanesFor(const GemmModel& g, int m, int n, int k) {
  // (Up to kGemvMaxRows rows take the GEMVs, some with the norm fused,
  // which add no planes.)
  if (m < g.wgmma_min_rows || m <= kGemvMaxRows || !kernels::WgmmaGemmSupported(m, n, k)) return 0;
  const int splits = kernels::WgmmaGemmPlanFor(n, k, g.num_sms).splits;
  return splits > 1 && kernels::AddPartsRmsNormSupported(n, splits) ? splits : 0;
}

bool UsePromptGemm(const GemmModel& g, int m, int n, int k) {
  return g.prompt_gemm && m > kernels::kMaxWgmmaRows && kernels::PromptGemmShapeSupported(m, n, k);
}

bool UseDequantGemm(const GemmModel& g, int m, int n, int k) {
  if (!g.quant_dequant || m <= 0 || n <= 0 || k <= 0) return false;
  // (A dense projection is the MoE kernels' one group of m rows.)
  const kernels::MoeGemmPath path =
      kernels::ChooseMoeGemmPath(m, 1, 1, n, k, kernels::MoeWeightFormat::kFp8Block, g.quant_gemv);
  if (path == kernels::MoeGemmPath::kTensorCores) return true;
  return path == kernels::MoeGemmPath::kGemv && m > kDenseQuantGemvMaxRows;
}

kernels::GatedForm DenseGatedForm(const GemmModel& g) {
  return g.gelu_mlp ? kernels::GatedForm::kGeluTanh : kernels::GatedForm::kSwiglu;
}

int64_t DequantScratchElems(std::span<const std::array<int64_t, 2>> shapes) {
  int64_t most = 0;
  for (const auto& s : shapes) most = std::max(most, s[0] * s[1]);
  return most;
}

namespace {

// o and down. Every norm before them has added the planes pending from the
// layer before (a projection's planes are added by the next norm, and each
// of o and down follows one), so the split depends on the shape alone.
ResidualPath PlanResidual(const GemmModel& g, int m, int n, int k, int* planes) {
  *planes = 0;
  if (g.sandwich_norm) return ResidualPath::kGemmOut;
  // Partial sums, all-reduced next: no planes for a norm to add.
  if (g.tp) return ResidualPath::kGemmPartial;
  *planes = PlanesFor(g, m, n, k);
  return *planes > 0 ? ResidualPath::kPlanes : ResidualPath::kGemmAdd;
}

}  // namespace

bool QuantResidualAdds(const GemmModel& g, int tp_rank) {
  return !g.sandwich_norm && (!g.tp || tp_rank == 0);
}

DenseLayerPlan PlanDenseLayer(const GemmModel& g, int tokens, bool fused_rotary,
                              int max_qkv_planes) {
  const int T = tokens, H = g.hidden, I = g.inter;
  DenseLayerPlan p;
  // QKV: where the decode attention applies the rotary it can add split-K
  // planes itself. Otherwise one or two rows normalise inside the GEMV
  // while its first weight loads are in flight; with more blocks (the MLP,
  // the LM head) every block would re-read x and the norm weights, measured
  // slower than a separate norm kernel. (No planes are pending where the
  // GEMV takes the norm: those rows leave none.)
  int planes = fused_rotary ? PlanesFor(g, T, g.qkv_n, H) : 0;
  if (planes > max_qkv_planes) planes = 0;
  if (planes > 0) {
    p.qkv = QkvPath::kWgmmaPlanes;
    p.qkv_planes = planes;
  } else if (g.qkv_n <= 4096 && kernels::NormGemvSupported(T, H)) {
    p.qkv = QkvPath::kNormGemv;
  } else {
    p.qkv = QkvPath::kNormThenGemm;
  }
  p.o = PlanResidual(g, T, H, g.attn_n, &p.o_planes);
  // gate_up: the activation in an epilogue wherever a kernel has one.
  if (!g.sandwich_norm && T <= kGemvMaxRows && g.gemv_pipe &&
      kernels::NormGemvGatedActSupported(T, 2 * I, H)) {
    p.gate_up = GateUpPath::kNormGemvAct;
  } else if (T <= kGemvMaxRows && kernels::GemvGatedActSupported(T, 2 * I, H)) {
    p.gate_up = GateUpPath::kGemvAct;
  } else if (UseWgmma(g, T, 2 * I, H)) {
    p.gate_up = GateUpPath::kWgmmaAct;
  } else if (UsePromptGemm(g, T, 2 * I, H)) {
    // Prompt steps: gate_up never crosses memory (bench/RESULTS.md item 96).
    p.gate_up = GateUpPath::kPromptAct;
  } else {
    p.gate_up = GateUpPath::kGemmThenAct;
  }
  p.down = PlanResidual(g, T, H, I, &p.down_planes);
  return p;
}

LmHeadPath PlanLmHead(const GemmModel& g, int rows) {
  // The argmax in a GEMM's epilogue (logits stored only for steps that
  // sample a row), never with a softcap. The persistent prompt GEMM streams
  // the LM head's weights at ~3 TB/s (178 us at 64 rows against 207 for the
  // warpgroup GEMM; bench/RESULTS.md item 98).
  if (g.lm_argmax && !g.softcap) {
    if (g.prompt_gemm && g.prompt_argmax && rows >= kPromptArgmaxMinRows &&
        kernels::PromptGemmShapeSupported(rows, g.vocab, g.hidden))
      return LmHeadPath::kPromptArgmax;
    if (rows >= g.wgmma_min_rows && rows > kGemvMaxRows &&
        kernels::WgmmaGemmSupported(rows, g.vocab, g.hidden))
      return LmHeadPath::kWgmmaArgmax;
  }
  return LmHeadPath::kGemmArgmax;
}

}  // namespace agentkv::backend::cuda
