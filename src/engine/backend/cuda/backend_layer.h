// CudaBackend::Layer: one decoder layer's weights on the GPU (pointers into
// CudaBackend's weight allocations; null where the architecture has none).
// Private to the backend's .cc files.
#pragma once

#include "engine/backend/cuda/backend.h"
#include "engine/backend/cuda/kernels/moe_plan.h"

namespace agentkv::backend::cuda {

// A dense projection stored fp8 (codes null: not quantized): codes
// [n][k] (parts stacked, or gate and up rows interleaved) and a scale per
// row and block of block_cols columns, [n][ceil(k / block_cols)] (block,
// channel and tensor scales alike, expanded to rows at load).
struct CudaBackend::QuantDense {
  const uint8_t* codes = nullptr;
  const float* scales = nullptr;
  int block_cols = 128;
  int n = 0, k = 0;
};

struct CudaBackend::Layer {
  float* in_norm = nullptr;
  float* post_attn_norm = nullptr;
  float* pre_ff_norm = nullptr;
  float* post_ff_norm = nullptr;
  kernels::bf16_t* wqkv = nullptr;  // [q | k | v] rows
  float* bqkv = nullptr;
  float* q_norm = nullptr;
  float* k_norm = nullptr;
  float* sinks = nullptr;  // [num_heads] attention sink logits (GPT-OSS)
  kernels::bf16_t* wo = nullptr;
  float* bo = nullptr;                   // o_proj bias (GPT-OSS)
  kernels::bf16_t* w_gate_up = nullptr;  // gate and up rows interleaved
  kernels::bf16_t* w_down = nullptr;
  // fp8 checkpoints: the dense projections quantized (their bf16 pointers
  // above null).
  QuantDense q_qkv, q_o, q_gate_up, q_down;
  // Mixture-of-experts layers (router set; w_gate_up and w_down null).
  kernels::bf16_t* router = nullptr;           // [E][H]
  float* router_bias = nullptr;                // [E] (GPT-OSS)
  kernels::bf16_t* experts_gate_up = nullptr;  // [E][2I][H], gate and up rows interleaved
  float* experts_gate_up_bias = nullptr;       // [E][2I], interleaved (GPT-OSS)
  kernels::bf16_t* experts_down = nullptr;     // [E][H][I]
  float* experts_down_bias = nullptr;          // [E][H] (GPT-OSS)
  // Quantized experts (experts_format not kBf16; experts_gate_up and
  // experts_down null), as cuda::MoeGemmParams reads them: codes, and fp8
  // block scales (gate_up's paired: gate's and up's blocks apart) or mxfp4
  // exponents.
  kernels::MoeWeightFormat experts_format = kernels::MoeWeightFormat::kBf16;
  const uint8_t* experts_gate_up_q = nullptr;
  const uint8_t* experts_down_q = nullptr;
  const float* experts_gate_up_scales = nullptr;
  const float* experts_down_scales = nullptr;
  bool experts_gate_up_scale_pairs = false;
  const uint8_t* experts_gate_up_exps = nullptr;
  const uint8_t* experts_down_exps = nullptr;
  int experts_block_rows = 128, experts_block_cols = 128;
  cache::AttentionKind kind = cache::AttentionKind::kFull;
  int window = 0;
  int group = 0;
  int index_in_group = 0;
};

}  // namespace agentkv::backend::cuda
