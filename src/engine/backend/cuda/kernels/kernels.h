// CUDA kernels of the forward pass, behind plain launch functions so that
// host code (the backend, tests) needs no CUDA compiler. Every pointer is a
// device pointer unless said otherwise; bf16 values travel as uint16_t (the
// raw bfloat16 bits). Each launcher enqueues on `stream` and returns the
// launch error (not the kernel's outcome: that shows at the next
// synchronisation). None allocates, so all may be captured in CUDA graphs.
// Kernel choices made for comparison (CudaTuning) come in as arguments,
// except programmatic dependent launch (SetPdlLaunches). The CPU references
// are engine/backend/cpu/cpu_kernels.h.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "engine/backend/row_pick.h"

namespace agentkv::cuda {

using bf16_t = uint16_t;

// Whether launchers launch with programmatic dependent launch (pdl.cuh)
// where the device has it (sm_90+): on until set otherwise. Process-wide,
// for every launcher (CudaBackend::Create sets it from CudaTuning::pdl);
// launches read it as they are made, graphs keep what they were captured
// with. Thread-safe.
void SetPdlLaunches(bool on);

// x[t] = embed[tokens[t]] * scale (fp32 out), rows of `dim`. A negative
// tokens[t] stands for picks[-1 - tokens[t]] (the previous step's greedy
// pick, still on the device).
cudaError_t LaunchEmbed(const bf16_t* embed, const int32_t* tokens, const int32_t* picks, int rows,
                        int dim, float scale, float* x, cudaStream_t stream);

// out[r] = x[rows_idx ? rows_idx[r] : r] / rms * w (or (1 + w)) as bf16.
cudaError_t LaunchRmsNorm(const float* x, const int32_t* rows_idx, const float* w, bf16_t* out,
                          int rows, int dim, float eps, bool plus_one, cudaStream_t stream);

// LaunchRmsNorm after a residual add: x[src] += parts[0][src] + ... +
// parts[nparts - 1][src] (planes `plane` floats apart, rows of dim; added in
// plane order, deterministic), written back to x, then out[r] = the norm of
// it (src = rows_idx ? rows_idx[r] : r). The planes are a split-K GEMM's
// partial outputs (LaunchWgmmaGemm with planes). Requires
// AddPartsRmsNormSupported(dim, nparts).
bool AddPartsRmsNormSupported(int dim, int nparts);
cudaError_t LaunchAddPartsRmsNorm(float* x, const float* parts, int nparts, int64_t plane,
                                  const int32_t* rows_idx, const float* w, bf16_t* out, int rows,
                                  int dim, float eps, bool plus_one, cudaStream_t stream);

// Gemma 3 sandwich: x += norm(o, w_post); then h = norm(x, w_pre) (skipped
// when w_pre is null).
cudaError_t LaunchAddNormed(const float* o, const float* w_post, float* x, const float* w_pre,
                            bf16_t* h, int rows, int dim, float eps, bool plus_one,
                            cudaStream_t stream);

// Per token: qkv rows [q heads | k heads | v heads] * head_dim (fp32, the
// GEMM output) plus `bias` (or null); per-head RMSNorm of q and k by q_norm /
// k_norm (null: none); rotary embedding (rotate-half) at pos[t] with
// inv_freq[head_dim / 2]. Writes q [T][nh][D], k and v [T][nkv][D] in bf16.
// TIn: float, or bf16_t (prefill steps: the GEMM's output rounded to bf16,
// as a bf16 model's Linear leaves it; half the bytes of the fp32 form to
// write and read). Instantiated for those two.
template <typename TIn>
cudaError_t LaunchQkvPost(const TIn* qkv, const float* bias, const float* q_norm,
                          const float* k_norm, const float* inv_freq, const int32_t* pos,
                          int tokens, int nh, int nkv, int head_dim, float eps, bool plus_one,
                          bf16_t* q, bf16_t* k, bf16_t* v, cudaStream_t stream);

// Where one layer's K and V live in a group's paged cache: per block, for
// each layer of the group, K then V, each [block_size][nkv][head_dim] bf16.
// fp8: K then V are each a section of [block_size][nkv][head_dim] e4m3
// bytes followed by [block_size][nkv] f32 scales (engine/backend/kv_fp8.h), and
// base, block_stride and layer_offset count bytes.
struct KvCacheView {
  bf16_t* base = nullptr;    // the group's block 0
  int64_t block_stride = 0;  // elements per block (all layers of the group)
  int64_t layer_offset = 0;  // elements to this layer's K within a block
  bool fp8 = false;
  int block_size = 16;
  int ring = 0;                     // sliding groups: ring blocks; 0 for full
  const int32_t* tables = nullptr;  // [seq][*table_stride] block ids
  // One device int: the row stride of `tables`. Read on the device so that a
  // captured graph stays valid as the tables widen.
  const int32_t* table_stride = nullptr;
};

// LaunchQkvPost that also stores k and v into the paged cache, as
// LaunchKvStore would (tokens with pos < 0 skipped). Only where no query of
// the step still needs a cache slot it overwrites: full-attention groups, or
// steps of one token per sequence. k and v may be null for a bf16 projection
// at head_dim 64 (the cache alone gets K and V; see AttentionReadsCacheOnly);
// elsewhere null k or v is an invalid value.
template <typename TIn>
cudaError_t LaunchQkvPostStore(const TIn* qkv, const float* bias, const float* q_norm,
                               const float* k_norm, const float* inv_freq, const int32_t* pos,
                               const int32_t* tok_seq, int tokens, int nh, int nkv, int head_dim,
                               float eps, bool plus_one, bf16_t* q, bf16_t* k, bf16_t* v,
                               const KvCacheView& cache, cudaStream_t stream);

// Stores this step's K and V (bf16 [T][nkv][D]) into the cache at pos[t] of
// sequence tok_seq[t]; tokens with pos < 0 (padding) are skipped. In a ring,
// where several of a sequence's tokens this step share a slot, the newest
// one is kept (sequence s's step ends at seq_start[s] + seq_first[s + 1] -
// seq_first[s]).
cudaError_t LaunchKvStore(const bf16_t* k, const bf16_t* v, const int32_t* pos,
                          const int32_t* tok_seq, const int32_t* seq_start,
                          const int32_t* seq_first, int tokens, int nkv, int head_dim,
                          const KvCacheView& cache, cudaStream_t stream);

// The fp8 cache's path. A step's K and V rows quantized as the cache holds
// them ([T][nkv][head_dim] e4m3 bytes and [T][nkv] f32 scales each),
// between QkvPost and the store: attention reads the step's own keys from
// here, so that they are the values later steps will read from the cache.
struct Fp8KvRows {
  uint8_t* k = nullptr;
  uint8_t* v = nullptr;
  float* k_scale = nullptr;
  float* v_scale = nullptr;
};
// Bytes Fp8KvRows needs for `tokens` tokens, and the rows laid out in
// `base` (k bytes, v bytes, k scales, v scales; head_dim a multiple of 16).
inline size_t Fp8KvRowsBytes(int64_t tokens, int nkv, int head_dim) {
  return static_cast<size_t>(tokens) * nkv * (head_dim + 4) * 2;
}
inline Fp8KvRows Fp8KvRowsAt(void* base, int64_t tokens, int nkv, int head_dim) {
  auto* b = static_cast<uint8_t*>(base);
  const int64_t n = tokens * nkv;
  Fp8KvRows r;
  r.k = b;
  r.v = b + n * head_dim;
  r.k_scale = reinterpret_cast<float*>(b + 2 * n * head_dim);
  r.v_scale = r.k_scale + n;
  return r;
}
// Quantizes k and v (bf16 [T][nkv][D], QkvPost's) row by row into `rows`
// as engine/backend/kv_fp8.h's QuantizeRow does (bit for bit on the same values);
// tokens with pos < 0 (padding) are skipped.
cudaError_t LaunchKvQuantizeFp8(const bf16_t* k, const bf16_t* v, const int32_t* pos, int tokens,
                                int nkv, int head_dim, Fp8KvRows rows, cudaStream_t stream);
// Stores `rows` into the fp8 cache (cache.fp8) as LaunchKvStore stores bf16
// rows (pos < 0 skipped; in a ring the newest token of a slot wins).
cudaError_t LaunchKvStoreFp8(Fp8KvRows rows, const int32_t* pos, const int32_t* tok_seq,
                             const int32_t* seq_start, const int32_t* seq_first, int tokens,
                             int nkv, int head_dim, const KvCacheView& cache, cudaStream_t stream);

// Attention of one layer over paged KV, flash-style (online softmax, tensor
// cores, no score matrix in memory). Work comes in tiles: tile i covers
// tile_n[i] consecutive tokens of sequence tile_seq[i] from token tile_t0[i];
// tile_n = 0 marks padding. A tile may hold at most TokensPerTile(G, wide)
// tokens (G = nh / nkv <= 16): 16 query rows, or 64 with `wide` (prefill:
// each K/V tile loaded serves four times the rows; only where
// WideAttentionSupported(head_dim)). Keys at positions >= seq_start[s] (this step's)
// are read from k_new / v_new at token seq_first[s] + (p - seq_start[s]); older ones from the
// cache. With splits > 1 each tile's keys are split across thread blocks (at most 32) and merged by
// a second kernel through part_o / part_ml (tokens * nh * splits * (head_dim + 2) floats).
struct AttentionParams {
  const bf16_t* q = nullptr;  // [T][nh][D]
  const bf16_t* k_new = nullptr;
  const bf16_t* v_new = nullptr;
  KvCacheView cache;
  const int32_t* pos = nullptr;        // [T]
  const int32_t* seq_start = nullptr;  // [B]
  const int32_t* seq_first = nullptr;  // [B]
  const int32_t* tile_seq = nullptr;
  const int32_t* tile_t0 = nullptr;
  const int32_t* tile_n = nullptr;
  int num_tiles = 0;
  int tokens = 0;
  int nh = 0, nkv = 0, head_dim = 0;
  int window = 0;  // 0: full
  float scale = 1.f, softcap = 0.f;
  int splits = 1;
  bool wide = false;         // tiles of TokensPerTile(G, true) tokens
  float* part_o = nullptr;   // [T][nh][splits][D]
  float* part_ml = nullptr;  // [T][nh][splits][2]
  bf16_t* out = nullptr;     // [T][nh][D]
  // Decode steps (narrow tiles of one token) may leave q, k_new and v_new
  // unset and give the projection instead: each block then does what
  // LaunchQkvPostStore would for its query heads, and the block whose keys
  // include the step's token also stores that token's K and V into the
  // cache. One kernel instead of two per layer (FusedRotarySupported).
  const float* qkv = nullptr;  // [T][(nh + 2 * nkv) * D] fp32
  // The projection as qkv_planes (up to kMaxQkvPlanes) fp32 planes
  // qkv_plane floats apart (a split-K GEMM's partials, LaunchWgmmaGemm with
  // planes), added in order.
  int qkv_planes = 1;
  int64_t qkv_plane = 0;
  const float* bias = nullptr;
  const float* q_norm = nullptr;
  const float* k_norm = nullptr;
  const float* inv_freq = nullptr;
  float eps = 0.f;
  bool plus_one = false;
  // Prompt steps whose keys are all in the cache already (LaunchQkvPostStore
  // ran; no window): the group's TMA descriptor (EncodeKvTensorMap, in device
  // memory) lets the warpgroup kernel (head_dim 64, block_size 8 or 16)
  // copy whole pages; kv_map_layer is this layer's K plane in it (2 * its
  // index in the group; V is the next). Null: rows by cp.async.
  const void* kv_map = nullptr;
  int kv_map_layer = 0;
  // cache.fp8: the step's keys (positions >= seq_start) come from here
  // (k_new / v_new unused); `qkv` and kv_map are refused
  // (cudaErrorInvalidValue), and so are wide tiles where
  // WideAttentionSupported(head_dim) is false (the backend routes fp8 steps
  // so, see kv_route.h).
  Fp8KvRows fp8_new;
  // Kernel choices (CudaTuning, for comparison). mma: narrow tiles on the
  // mma.sync kernel where it has the head_dim (false: the portable WMMA
  // kernel; `qkv` is then refused). wgmma: wide bf16 tiles on the warpgroup
  // kernel where WgmmaAttentionSupported (false: the mma.sync kernel;
  // kv_map is then ignored and AttentionReadsCacheOnly false).
  bool mma = true;
  bool wgmma = true;
};
inline constexpr int kMaxQkvPlanes = 8;
// Writes to `map` (kKvTensorMapBytes, 64-byte aligned host memory) the TMA
// descriptor of a cache group's `blocks` blocks at `base` (`layers` layers,
// block_stride elements a block, K then V of each layer: [block_size][nkv]
// [head_dim]) for AttentionParams::kv_map. False where there is none to
// make: not head_dim 64, block_size not 8 or 16, or no driver entry point.
inline constexpr size_t kKvTensorMapBytes = 128;
// Whether LaunchAttention reads every key of this step from the cache (the
// warpgroup kernel's TMA path: kv_map set, wide tiles, head_dim 64, block
// size 8 or 16, no window or ring), so that k_new and v_new may be null
// (and LaunchQkvPostStore of a bf16 projection at head_dim 64 may skip
// writing k and v).
bool AttentionReadsCacheOnly(const AttentionParams& p);
// Whether prompt steps' attention can run on the warpgroup kernel: head_dim
// 64 on compute capability 9.0 (AttentionParams::wgmma chooses it).
bool WgmmaAttentionSupported(int head_dim);
bool EncodeKvTensorMap(const bf16_t* base, int64_t blocks, int64_t block_stride, int layers,
                       int block_size, int nkv, int head_dim, void* map);
int TokensPerTile(int group_size, bool wide = false);
bool WideAttentionSupported(int head_dim);
// Largest head_dim the attention kernel takes (a multiple of 16).
inline constexpr int kMaxAttentionHeadDim = 256;
cudaError_t LaunchAttention(const AttentionParams& p, cudaStream_t stream);
// Whether LaunchAttention takes AttentionParams::qkv for decode steps at
// this head_dim (the mma.sync kernel's; AttentionParams::mma must be set).
bool FusedRotarySupported(int head_dim);

// out[r][i] = act(gate_up[r][2i]) * gate_up[r][2i + 1]: rows of 2n with
// gate and up interleaved, as the backend uploads the two weights' rows
// (so that a GEMV block holds both halves of its outputs; see
// LaunchGemvGatedAct). bf16 in and out. act: 0 SiLU, 1 GELU (tanh).
cudaError_t LaunchGatedAct(const bf16_t* gate_up, bf16_t* out, int rows, int n, int act,
                           cudaStream_t stream);

// y[m][n] = x[m] . w[n] + beta * y[m][n] (x [m][k], w [n][k] bf16; y fp32
// or bf16) for decode steps of at most kMaxGemvRows rows; k a multiple of 8
// and m * k * 2 <= 32 KiB (GemvSupported). num_sms sizes the grid. pipe:
// k of 8,192 or more on the pipelined kernel (CudaTuning::gemv_pipe; false:
// the plain one, for comparison).
inline constexpr int kMaxGemvRows = 8;
bool GemvSupported(int m, int k);
cudaError_t LaunchGemv(const bf16_t* x, const bf16_t* w, void* y, bool y_f32, int m, int n, int k,
                       float beta, int num_sms, cudaStream_t stream, bool pipe = true);

// y[m][n] = RmsNorm(x[m], norm_w) . w[n] + beta * y[m][n] with x fp32 [m][k]
// (the residual stream), normalised as LaunchRmsNorm does, in one kernel;
// for m <= kMaxNormGemvRows and k <= 4096 (x is held in registers).
inline constexpr int kMaxNormGemvRows = 2;
bool NormGemvSupported(int m, int k);
cudaError_t LaunchNormGemv(const float* x, const float* norm_w, float eps, bool plus_one,
                           const bf16_t* w, void* y, bool y_f32, int m, int n, int k, float beta,
                           cudaStream_t stream);

// out[m][i] = act(x[m] . w[2i]) * (x[m] . w[2i + 1]), bf16 [m][n / 2]: the
// gate_up GEMV with the gated activation in its epilogue (w's rows gate and
// up interleaved, as LaunchGatedAct reads them); for m <= kMaxGemvActRows,
// n even. One kernel less per layer for one- and two-row decode steps.
inline constexpr int kMaxGemvActRows = 2;
bool GemvGatedActSupported(int m, int n, int k);
cudaError_t LaunchGemvGatedAct(const bf16_t* x, const bf16_t* w, bf16_t* out, int m, int n, int k,
                               int act, cudaStream_t stream);

// out = act(gate) * up of RmsNorm(x[m], norm_w) . w, as LaunchRmsNorm then
// LaunchGemvGatedAct, in one kernel (x fp32 [m][k]); for m <= kMaxNormGemvRows,
// k <= 4096, n even. A pipelined kernel: the backend launches the two
// kernels instead where CudaTuning::gemv_pipe is off.
bool NormGemvGatedActSupported(int m, int n, int k);
cudaError_t LaunchNormGemvGatedAct(const float* x, const float* norm_w, float eps, bool plus_one,
                                   const bf16_t* w, bf16_t* out, int m, int n, int k, int act,
                                   cudaStream_t stream);

// y[m][n] = x[m] . w[n] + beta * y[m][n] on the tensor cores, for decode
// steps of up to kMaxSkinnyRows rows (x [m][k], w [n][k] bf16; y fp32 or
// bf16; k a multiple of 128): the weights are streamed once. When the tiles
// of 128 features are too few for the GPU, K is split across
// SkinnyGemmSplits blocks of a cluster (sm_90), whose partials are added in
// a fixed order: the result is deterministic.
inline constexpr int kMaxSkinnyRows = 8;
bool SkinnyGemmSupported(int m, int n, int k);
int SkinnyGemmSplits(int n, int k, int num_sms);
// splits: 0 for SkinnyGemmSplits, else a power of two up to 8 (for
// measurements).
cudaError_t LaunchSkinnyGemm(const bf16_t* x, const bf16_t* w, void* y, bool y_f32, int m, int n,
                             int k, float beta, int num_sms, cudaStream_t stream, int splits = 0);

// y[m][n] = x[m] . w[n] + beta * y[m][n] with Hopper warpgroup MMAs, for
// decode steps of up to kMaxWgmmaRows rows (x [m][k], w [n][k] bf16; y fp32
// or bf16; n a multiple of 64, k of 64). Compute capability 9.0 only (the
// kernel is built for sm_90a); launched with programmatic dependent launch,
// it requests its first weight stages before waiting on the kernel before
// it. K may be split over several blocks, whose partials are added in a
// fixed order: the result is deterministic.
inline constexpr int kMaxWgmmaRows = 64;
struct WgmmaGemmPlan {
  int tile = 0;  // features per block, 64 or 128; 0: WgmmaGemmPlanFor's
  int splits = 1;
  bool k128 = false;  // stages of 128 k (k a multiple of 128)
};
// Device scratch of a split K: the blocks' partial tiles and a counter per
// tile. WgmmaGemmWorkspaceBytes(num_sms) of device memory, zeroed once
// before the first launch (each launch leaves the counters at zero). The
// launches that share one must run in stream order (one stream).
struct WgmmaGemmWorkspace {
  void* base = nullptr;
  int num_sms = 0;
};
size_t WgmmaGemmWorkspaceBytes(int num_sms);
bool WgmmaGemmSupported(int m, int n, int k);
WgmmaGemmPlan WgmmaGemmPlanFor(int n, int k, int num_sms);
// act < 0: y as above. act >= 0 (Activate's codes: 0 SiLU, 1 GELU-tanh):
// y bf16 [m][n / 2] = act(x . w[2i]) * (x . w[2i + 1]), the gated MLP's
// activation on weights whose gate and up rows are interleaved (beta 0).
// planes: y is fp32 [plan.splits][m][n], split s's partial product in
// plane s, not added up (beta 0; the workspace is not used): for
// LaunchAddPartsRmsNorm. Plans whose partial tiles exceed the workspace are
// refused (cudaErrorInvalidValue), as are other invalid arguments.
inline constexpr int kMaxWgmmaSplits = 16;
cudaError_t LaunchWgmmaGemm(const bf16_t* x, const bf16_t* w, void* y, bool y_f32, int m, int n,
                            int k, float beta, WgmmaGemmWorkspace ws, cudaStream_t stream,
                            int act = -1, bool planes = false, WgmmaGemmPlan plan = {});

// y = x . w^T for prompt steps (x [m][k], w [n][k] bf16; y bf16 [m][n]),
// compute-bound: a persistent warp-specialised kernel with TMA loads and
// 128 x 256 warpgroup tiles (wgmma_prompt_gemm.cu). act >= 0
// (Activate's codes): y [m][n / 2] = act(x . w[2i]) * (x . w[2i + 1]), the
// gated activation in the epilogue (rows gate and up interleaved, as
// LaunchGatedAct reads them), from the fp32 products. Needs compute
// capability 9.0, n a multiple of 256 and k of 64 (PromptGemmSupported);
// x, w and y 16-byte aligned. num_sms sizes the grid.
bool PromptGemmSupported(int m, int n, int k);
cudaError_t LaunchPromptGemm(const bf16_t* x, const bf16_t* w, bf16_t* y, int m, int n, int k,
                             int act, int num_sms, cudaStream_t stream);
// The residual form: y fp32 [m][n] += x . w^T, each tile added by a TMA
// reduction (one add an element: deterministic) while the kernel goes on.
cudaError_t LaunchPromptGemmAdd(const bf16_t* x, const bf16_t* w, float* y, int m, int n, int k,
                                int num_sms, cudaStream_t stream);
// The LM head's form (as LaunchWgmmaGemmArgmax, any m): y fp32 [m][n]
// stored unless store_logits points to a device 0, and argmax[r] of each
// row as LaunchArgmax defines it, through `scratch`
// (PromptArgmaxScratchBytes) and LaunchArgmaxOfParts.
size_t PromptArgmaxScratchBytes(int m, int n);
cudaError_t LaunchPromptGemmArgmax(const bf16_t* x, const bf16_t* w, float* y,
                                   const int32_t* store_logits, int m, int n, int k, void* scratch,
                                   int32_t* argmax, int num_sms, cudaStream_t stream);

// The LM head's form: y fp32 [m][n] = x . w^T (beta 0, no split), stored
// only when store_logits is null or the device int it points to is not 0
// (read when the kernel runs, so that one captured graph serves steps with
// and without rows that sample), and argmax[r] of each row as LaunchArgmax
// defines it, from the same fp32 values: each block's best per row into
// `scratch` (WgmmaArgmaxScratchBytes(m, n, plan)), then one pass over
// them. The logits cross memory once at most instead of being written and
// read back.
size_t WgmmaArgmaxScratchBytes(int m, int n, WgmmaGemmPlan plan = {});
cudaError_t LaunchWgmmaGemmArgmax(const bf16_t* x, const bf16_t* w, float* y,
                                  const int32_t* store_logits, int m, int n, int k, void* scratch,
                                  int32_t* argmax, int num_sms, cudaStream_t stream,
                                  WgmmaGemmPlan plan = {});

// x = cap * tanh(x / cap) over n floats.
cudaError_t LaunchSoftcap(float* x, int64_t n, float cap, cudaStream_t stream);

// For each row r < rows with picks[r].mode == kDevice: out[r] = the token
// SampleDraw (engine/backend/sample_draw.h) draws from logits row r (vocab floats,
// rows contiguous) with picks[r].sample; other rows' out[r] are left as they
// are. One block of 512 threads per row; picks is a device array. The same
// token as the CPU's SampleDraw except where u * M, top_p's target or a
// weight against min_p lies within float rounding of a boundary (float
// expf here and there may differ by an ulp or two; sums run in double in
// another order).
cudaError_t LaunchSampleRows(const float* logits, int rows, int vocab, const RowPick* picks,
                             int32_t* out, cudaStream_t stream);

// out[r] = argmax of row r (cols floats): lowest index on ties, NaN never wins,
// 0 when nothing beats -inf.
// In two passes: kArgmaxChunks blocks per row, then one per row; `scratch`
// holds ArgmaxScratchBytes(rows) of device memory.
inline constexpr int kArgmaxChunks = 64;
inline constexpr size_t ArgmaxScratchBytes(int rows) {
  return static_cast<size_t>(rows) * kArgmaxChunks * 8;
}
cudaError_t LaunchArgmax(const float* x, int rows, int cols, int32_t* out, void* scratch,
                         cudaStream_t stream);
// LaunchArgmax's second pass alone: out[r] from the (value, index as int
// bits) float2 pairs parts[r][chunks], the bests of a row's chunks.
cudaError_t LaunchArgmaxOfParts(const void* parts, int rows, int chunks, int32_t* out,
                                cudaStream_t stream);

// fp32 -> bf16 (round to nearest even), and back.
cudaError_t LaunchF32ToBf16(const float* in, bf16_t* out, int64_t n, cudaStream_t stream);
cudaError_t LaunchBf16ToF32(const bf16_t* in, float* out, int64_t n, cudaStream_t stream);

// Fills n floats with `value` (tests poison outputs with NaN).
cudaError_t LaunchFill(float* x, int64_t n, float value, cudaStream_t stream);

}  // namespace agentkv::cuda
