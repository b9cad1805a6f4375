// CpuBackend: the reference forward pass, fp32 throughout, on the CPU.
// GEMMs through OpenBLAS; attention, norms and rotary embeddings through
// engine/cpu_kernels, parallel over (token, head) on a ThreadPool.
// KV is cached in fp32 in per-group block arrays (see Backend).
//
// Thread-safety: as Backend; one engine thread calls it. Internally it uses
// `threads` worker threads during Forward.
#pragma once

#include <memory>
#include <vector>

#include "engine/backend.h"
#include "engine/cpu_attention.h"
#include "engine/weight_source.h"
#include "util/thread_pool.h"
#include "util/zeroed_buffer.h"

namespace agentkv {

struct CpuBackendOptions {
  int threads = 0;  // 0: all cores
};

class CpuBackend final : public Backend {
 public:
  static Result<std::unique_ptr<CpuBackend>> Create(const ModelConfig& config,
                                                    const WeightSource& weights,
                                                    const CpuBackendOptions& options);
  ~CpuBackend() override;

  const ModelConfig& config() const override { return config_; }
  const ModelCacheSpec& cache_spec() const override { return spec_; }
  std::string name() const override { return "cpu"; }

  Status AllocateKv(const KvLayout& layout) override;
  const KvLayout& kv_layout() const override { return layout_; }
  Status CopyBlocks(std::span<const KvBlockCopy> copies) override;
  Status Forward(std::span<const SeqStep> batch, std::span<float> logits) override;
  Status ReadBlock(int group, int32_t block, std::span<std::byte> out) override;
  Status WriteBlock(int group, int32_t block, std::span<const std::byte> in) override;

 private:
  struct Layer;
  CpuBackend(const ModelConfig& config, const CpuBackendOptions& options);
  Status LoadWeights(const WeightSource& weights);
  Status CheckBatch(std::span<const SeqStep> batch) const;
  void EnsureScratch(int64_t tokens, int64_t max_keys);
  float* KvPtr(int group, int32_t block, int layer_in_group, int which, int offset) const;
  void Attention(int layer, std::span<const SeqStep> batch);
  void WriteKv(int layer, std::span<const SeqStep> batch);

  ModelConfig config_;
  ModelCacheSpec spec_;
  CpuBackendOptions options_;
  KvLayout layout_;
  // Per group; mapped zero pages, so a pool sized from a share of the
  // machine's memory takes memory only as sequences fill it.
  std::vector<ZeroedBuffer> kv_;

  // Embedding and LM head stay in bf16 when the checkpoint stores them so
  // (exact, half the bytes of the largest matrices); else fp32.
  std::vector<float> embed_, final_norm_, lm_head_;
  std::vector<uint16_t> embed_bf16_, lm_head_bf16_;
  std::vector<Layer> layers_;
  std::vector<float> inv_freq_global_, inv_freq_local_;

  // Scratch, grown outside the steady state and reused every step.
  int64_t cap_tokens_ = 0, cap_keys_ = 0;
  std::vector<float> x_, h_, qkv_, attn_, o_, gu_, act_, last_;
  std::vector<int32_t> tok_seq_, tok_pos_;
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

}  // namespace agentkv
