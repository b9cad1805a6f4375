// CudaBackend::Layer: one decoder layer's weights on the GPU (pointers into
// CudaBackend's weight allocations; null where the architecture has none).
// Private to the backend's .cc files.
#pragma once

#include "engine/backend/cuda/backend.h"

namespace agentkv {

struct CudaBackend::Layer {
  float* in_norm = nullptr;
  float* post_attn_norm = nullptr;
  float* pre_ff_norm = nullptr;
  float* post_ff_norm = nullptr;
  cuda::bf16_t* wqkv = nullptr;  // [q | k | v] rows
  float* bqkv = nullptr;
  float* q_norm = nullptr;
  float* k_norm = nullptr;
  float* sinks = nullptr;  // [num_heads] attention sink logits (GPT-OSS)
  cuda::bf16_t* wo = nullptr;
  float* bo = nullptr;                // o_proj bias (GPT-OSS)
  cuda::bf16_t* w_gate_up = nullptr;  // gate and up rows interleaved
  cuda::bf16_t* w_down = nullptr;
  // Mixture-of-experts layers (router set; w_gate_up and w_down null).
  cuda::bf16_t* router = nullptr;           // [E][H]
  float* router_bias = nullptr;             // [E] (GPT-OSS)
  cuda::bf16_t* experts_gate_up = nullptr;  // [E][2I][H], gate and up rows interleaved
  float* experts_gate_up_bias = nullptr;    // [E][2I], interleaved (GPT-OSS)
  cuda::bf16_t* experts_down = nullptr;     // [E][H][I]
  float* experts_down_bias = nullptr;       // [E][H] (GPT-OSS)
  AttentionKind kind = AttentionKind::kFull;
  int window = 0;
  int group = 0;
  int index_in_group = 0;
};

}  // namespace agentkv
