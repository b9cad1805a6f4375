// The mixture-of-experts MLP of the CPU reference backend (GPT-OSS,
// Qwen3-MoE): the router, the choice of each token's experts, and the
// experts themselves, run expert by expert over the tokens routed to each.
// Float expert weights are held in fp32, de-interleaved and transposed at
// load to the [out][in] layout kernels::Linear takes. Quantized experts
// (GPT-OSS's MXFP4 blocks, FP8 Qwen3-MoE experts) stay as stored and are
// multiplied through engine/backend/cpu/cpu_quant_matmul (a tile of rows
// dequantized at a time; no fp32 copy of an expert exists).
//
// Thread-safety: the pure functions are thread-safe; CpuMoe is used by one
// thread (its scratch is reused across calls) and parallelises inside
// through the pool it is given.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/backend/cpu/cpu_quant_matmul.h"
#include "engine/model/model_config.h"
#include "engine/model/weight_source.h"
#include "util/status.h"
#include "util/thread_pool.h"

namespace agentkv::backend::cpu {

namespace kernels {

// One token's experts from its router logits (`num_experts` of them): the k
// chosen expert ids into `experts` and their weights into `weights`, highest
// first; among equal values the lower expert id is taken first.
//   kTopKThenSoftmax: top k logits, softmax over those k values.
//   kSoftmaxThenTopK: softmax over all logits, top k probabilities, divided
//                     by their sum when `renormalize`.
void RouteTopK(const float* logits, int num_experts, int k, model::MoeRouting routing,
               bool renormalize, int32_t* experts, float* weights);

// GPT-OSS's expert activation on rows of [gate (n) | up (n)]:
//   gate = min(gate, limit), up = clamp(up, -limit, limit),
//   out = (up + 1) * gate * sigmoid(1.702 * gate).
void ClampedSwiglu(const float* gate_up, float* out, int64_t rows, int n, float limit);

}  // namespace kernels

// One layer's router and experts. The experts are in exactly one of three
// forms: fp32 (`gate_up`, `down`), batched quantized (`q_gate_up`, `q_down`)
// or quantized per expert (`qe_gate_up`, `qe_down`); the others are empty.
struct MoeLayerWeights {
  int num_experts = 0, hidden = 0, inter = 0;
  std::vector<float> router;        // [E][H]
  std::vector<float> router_bias;   // [E], or empty
  std::vector<float> gate_up;       // [E][2I][H]: per expert gate rows, then up rows
  std::vector<float> gate_up_bias;  // [E][2I], gate then up (whatever the weights' order), or empty
  std::vector<float> down;          // [E][H][I]
  std::vector<float> down_bias;     // [E][H], or empty
  // GPT-OSS's MXFP4 experts as stored: [E][2I][H] with gate and up rows
  // interleaved (gate 0, up 0, gate 1, ...) and [E][H][I].
  model::QuantizedWeight q_gate_up, q_down;
  // Qwen3-MoE's quantized experts: per expert gate rows then up rows
  // ([2I][H]), and down ([H][I]); a part a checkpoint leaves unquantized is
  // held as fp32 rows inside its matrix.
  std::vector<QuantMatrix> qe_gate_up, qe_down;

  bool batched_quant() const { return !q_gate_up.codes.empty(); }
  bool per_expert_quant() const { return !qe_gate_up.empty(); }
  // Bytes held: quantized experts at their stored size, the rest as fp32.
  uint64_t bytes() const;
};

// Loads layer `layer`'s experts. GPT-OSS: the fused mlp.experts.* tensors
// ([E, H, 2I] with gate/up interleaved, [E, I, H]), or, when the checkpoint
// stores them as MXFP4 (`*_blocks` / `*_scales`, [out, in] order), those,
// kept quantized. Qwen3-MoE: per-expert mlp.experts.e.{gate,up,down}_proj.weight
// (kept quantized when any of them is stored FP8), or the fused [E, 2I, H] /
// [E, H, I] mlp.experts.{gate_up,down}_proj when a checkpoint stores those
// instead. Quantized experts are read as config.quant says.
Status LoadMoeLayer(const model::ModelConfig& config, const model::WeightSource& weights, int layer,
                    MoeLayerWeights* out);

class CpuMoe {
 public:
  // out[t] = sum over token t's chosen experts of weight x expert(h[t]), for
  // T rows of hidden_size floats. `out` must not alias `h`.
  void Forward(const model::ModelConfig& config, const MoeLayerWeights& w, const float* h,
               float* out, int64_t tokens, ThreadPool* pool);

 private:
  std::vector<float> logits_, weights_, xs_, gu_, raw_, act_, ys_;
  std::vector<int32_t> experts_, count_, first_, order_;
  QuantScratch qscratch_;
};

}  // namespace agentkv::backend::cpu
