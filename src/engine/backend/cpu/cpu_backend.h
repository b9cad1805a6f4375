// CpuBackend: the reference forward pass, fp32 throughout, on the CPU.
// Dense and mixture-of-experts MLPs (engine/backend/cpu/cpu_moe), attention
// sinks, sliding windows per layer, YaRN.
// GEMMs through OpenBLAS; attention, norms and rotary embeddings through
// engine/backend/cpu/cpu_kernels, parallel over (token, head) on a ThreadPool.
// KV is cached in per-group block arrays (see Backend): fp32 by default, or
// e4m3 with per-row scales (KvDtype::kFP8E4M3, engine/backend/kv_fp8.h): quantized as
// it is stored and dequantized as attention reads it. With fp8 the step's
// own keys are read as the cache will hold them too (quantized once, then
// dequantized), so a prompt gives the same logits however it is chunked.
//
// Thread-safety: as Backend; one engine thread calls it. Internally it uses
// `threads` worker threads during Forward.
#pragma once

#include <memory>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/backend/cpu/cpu_attention.h"
#include "engine/backend/cpu/cpu_moe.h"
#include "engine/backend/cpu/cpu_quant_matmul.h"
#include "engine/model/weight_source.h"
#include "util/thread_pool.h"
#include "util/zeroed_buffer.h"

namespace agentkv::backend::cpu {

struct CpuBackendOptions {
  int threads = 0;  // 0: all cores
  // kF32 (the reference) or kFP8E4M3; anything else is InvalidArgument.
  cache::KvDtype kv_dtype = cache::KvDtype::kF32;
};

class CpuBackend final : public Backend {
 public:
  static Result<std::unique_ptr<CpuBackend>> Create(const model::ModelConfig& config,
                                                    const model::WeightSource& weights,
                                                    const CpuBackendOptions& options);
  ~CpuBackend() override;

  const model::ModelConfig& config() const override { return config_; }
  const cache::ModelCacheSpec& cache_spec() const override { return spec_; }
  std::string name() const override { return "cpu"; }
  std::string kv_format() const override { return cache::KvDtypeName(spec_.kv_dtype); }
  uint32_t kv_element_size() const override {
    return static_cast<uint32_t>(cache::KvDtypeBytes(spec_.kv_dtype));
  }

  Status AllocateKv(const KvLayout& layout) override;
  const KvLayout& kv_layout() const override { return layout_; }
  Status CopyBlocks(std::span<const cache::KvBlockCopy> copies) override;
  Status Forward(std::span<const SeqStep> batch, std::span<float> logits) override;
  // The default ForwardSampled / LaunchStep / CollectStep compute them.
  bool picks_logprobs() const override { return true; }
  bool multi_logit_rows() const override { return true; }
  // The default LaunchStep leaves every row's logits in place.
  bool reads_kept_logits() const override { return true; }
  Status ReadKeptLogits(std::span<const int32_t> rows, std::span<float> logits) override {
    return KeptLogitsInPlace(rows, logits);
  }
  // Each step's rows stay in the span it was launched with.
  bool reads_kept_logits_in_flight() const override { return true; }
  Status ReadBlock(int group, int32_t block, std::span<std::byte> out) override;
  // Bytes the weights take in memory: quantized linear layers (FP8, MXFP4)
  // count their stored size, not an fp32 copy (none exists).
  uint64_t weight_bytes() const { return weight_bytes_; }
  Status WriteBlock(int group, int32_t block, std::span<const std::byte> in) override;

 private:
  struct Layer;
  CpuBackend(const model::ModelConfig& config, const CpuBackendOptions& options);
  Status LoadWeights(const model::WeightSource& weights);
  Status CheckBatch(std::span<const SeqStep> batch) const;
  void EnsureScratch(int64_t tokens, int64_t max_keys);
  // fp32 cache: K (which 0) or V (1) of row `offset` of a block's layer.
  float* KvPtr(int group, int32_t block, int layer_in_group, int which, int offset) const;
  // A whole block's bytes (either dtype).
  std::byte* BlockBytes(int group, int32_t block) const;
  // fp8 cache: the K or V section of a block's layer (engine/backend/kv_fp8.h).
  uint8_t* Fp8Section(int group, int32_t block, int layer_in_group, int which) const;
  bool fp8() const { return spec_.kv_dtype == cache::KvDtype::kFP8E4M3; }
  // fp8: quantizes the step's K and V rows (of qkv_) into kv8_ / kv8_scale_
  // and replaces them in qkv_ by their dequantized values.
  void QuantizeStepKv(int64_t t);
  void Attention(int layer, std::span<const SeqStep> batch);
  void WriteKv(int layer, std::span<const SeqStep> batch);

  model::ModelConfig config_;
  cache::ModelCacheSpec spec_;
  CpuBackendOptions options_;
  KvLayout layout_;
  // Per group (for fp8 the block bytes); mapped zero pages, so a pool sized from a share of the
  // machine's memory takes memory only as sequences fill it.
  std::vector<ZeroedBuffer> kv_;

  // Embedding and LM head stay in bf16 when the checkpoint stores them so
  // (exact, half the bytes of the largest matrices); else fp32.
  std::vector<float> embed_, final_norm_, lm_head_;
  std::vector<uint16_t> embed_bf16_, lm_head_bf16_;
  std::vector<Layer> layers_;
  std::vector<float> inv_freq_global_, inv_freq_local_;
  uint64_t weight_bytes_ = 0;
  QuantScratch qscratch_;    // quantized linear layers' dequantized tiles
  float rope_scale_ = 1.0f;  // YaRN's attention factor on cos and sin
  CpuMoe moe_;

  // Scratch, grown outside the steady state and reused every step.
  int64_t cap_tokens_ = 0, cap_keys_ = 0;
  std::vector<float> x_, h_, qkv_, attn_, o_, gu_, act_, last_;
  std::vector<int32_t> tok_seq_, tok_pos_;
  // fp8: the step's quantized K/V, [T][2][nkv][D] bytes and [T][2][nkv]
  // scales; per thread, a ring of kDeqRing dequantized K and V rows (the
  // attention kernels hold at most kKeyTile rows at once).
  std::vector<uint8_t> kv8_;
  std::vector<float> kv8_scale_;
  static constexpr int kDeqRing = 2 * kernels::kKeyTile;
  std::vector<std::vector<float>> deq_;
  std::vector<int64_t> seq_first_;
  // Attention work: runs of up to kQueryTile tokens of one sequence.
  static constexpr int64_t kQueryTile = 32;
  struct Chunk {
    int seq;
    int64_t begin, end;
  };
  std::vector<Chunk> chunks_;
  std::vector<std::vector<kernels::AttnRow>> attn_rows_;  // per thread
  std::vector<std::vector<float>> scores_;                // per thread
  std::unique_ptr<ThreadPool> pool_;
};

}  // namespace agentkv::backend::cpu
