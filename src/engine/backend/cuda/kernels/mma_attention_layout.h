// The shared-memory layout of the mma.sync flash attention kernel
// (flash_attention.cu) for each of its instantiations (head_dim 64 or
// 128, wide or narrow tiles, bf16 or fp8 cache): where the query rows, the
// bf16 K/V tiles, the narrow bf16 tiles' own-token rows and the fp8 staging
// stages lie, and how many bytes a launch asks for. Pure constexpr
// arithmetic with no CUDA types: the kernel takes its offsets from here and
// its launcher the byte count (and whether the 48 KiB default must be
// raised), so that tests/engine/backend/cuda/kernels/mma_attention_layout_test.cc checks
// every configuration without a GPU: regions in bounds and apart, 16-byte
// alignment of everything cp.async, uint4 stores and ldmatrix touch, the
// split merge fitting, the loaders' thread coverage.
#pragma once

#include <cstddef>

namespace agentkv::backend::cuda::kernels {

inline constexpr int kMmaThreads = 128;  // four warps
inline constexpr int kMmaWarps = kMmaThreads / 32;
inline constexpr int kMmaStage = 64;  // keys per pipeline stage
// fp8: staging stages of e4m3 rows (all but the one being widened are in
// flight). Prompt (wide) tiles: three; a stage of e4m3 rows is half the
// bytes of a bf16 one, and the tiles are bound by their MMAs. Decode
// (narrow) tiles: four. A block walks its keys one stage after another with
// little work per stage, so a stage costs about a memory round trip over
// the stages ahead; four is as deep as goes without costing a block per SM
// against three (54 KiB at head_dim 64, four an SM; 104 KiB at 128, two).
//
// Lean decode (narrow fp8 tiles, AttentionParams::fp8_decode_lean): the
// kernel is compiled for one more block per SM (MmaMinBlocks: registers
// capped by ptxas) and its staging shrinks to what that many blocks leave
// (head_dim 128: two stages, one in flight; 64 keeps four). A decode grid
// of one sequence is kv_heads x splits blocks, all resident at once: the
// blocks' warps, not their bytes in flight, bound it (issue slots ~35% busy
// at two blocks an SM), so more blocks an SM (and splits to fill them)
// should cut its time.
constexpr int MmaFp8Stages(int D, int rw, bool lean = false) {
  if (rw != 1) return 3;
  return lean && D == 128 ? 2 : 4;
}
// The blocks per SM an instantiation is compiled for (__launch_bounds__'s
// minimum): wide head_dim 64 tiles four, lean fp8 decode four (64) or three
// (128), the others one (ptxas's choice).
constexpr int MmaMinBlocks(int D, int rw, bool fp8, bool lean = false) {
  if (rw == 4) return D == 64 ? 4 : 1;
  if (fp8 && lean) return D == 64 ? 4 : 3;
  return 1;
}
// The most dynamic shared memory a block may opt into on sm_90.
inline constexpr size_t kMmaMaxSmemBytes = 227 * 1024;
// Launches above this need cudaFuncAttributeMaxDynamicSharedMemorySize.
inline constexpr size_t kDefaultSmemBytes = 48 * 1024;

// Bytes of one fp8 staging stage of `keys` keys at head_dim D: K bytes
// [keys][D], V bytes [keys][D], K scales [keys], V scales [keys] (f32).
constexpr size_t Fp8StageBytes(int D, int keys) {
  return static_cast<size_t>(keys) * (2 * static_cast<size_t>(D) + 8);
}
constexpr size_t Fp8KeyScalesAt(int D, int keys) { return 2 * static_cast<size_t>(keys) * D; }
constexpr size_t Fp8ValueScalesAt(int D, int keys) { return Fp8KeyScalesAt(D, keys) + 4 * keys; }

// Whether `lanes` threads, each keeping one 16-byte column, cover `rows`
// e4m3 rows of D bytes in whole passes (Fp8KvLoader::IssueRows).
constexpr bool Fp8IssueCovers(int D, int rows, int lanes) {
  const int vpr = D / 16;
  return D % 16 == 0 && vpr > 0 && lanes % vpr == 0 && rows % (lanes / vpr) == 0;
}
// Whether `lanes` threads widen `rows` rows of D bytes, 8 bytes each at a
// time, in whole passes (Fp8KvLoader::ConvertRows).
constexpr bool Fp8ConvertCovers(int D, int rows, int lanes) {
  return D % 8 == 0 && (rows * (D / 8)) % lanes == 0;
}

struct MmaAttentionLayout {
  int dp = 0;         // bf16 row stride of every tile (elements): D + 8
  int kv_stages = 0;  // stages of bf16 K/V tiles: 2 (bf16, cp.async), 1 (fp8, widened)
  int rows = 0;       // query rows of a block: 16 * rw
  int key_warps = 0;  // warps splitting a stage's keys: 4 (narrow), 1 (wide)
  size_t q_at = 0;    // [rows][dp] bf16
  size_t k_at = 0;    // [kv_stages][kMmaStage][dp] bf16
  size_t v_at = 0;    // same
  size_t own_at = 0;  // bf16 narrow: the step's own K row, then its V row ([D] bf16 each)
  size_t own_bytes = 0;
  size_t staging_at = 0;   // fp8: fp8_stages stages of stage_bytes
  size_t stage_bytes = 0;  // fp8: Fp8StageBytes(D, kMmaStage)
  int fp8_stages = 0;      // fp8: MmaFp8Stages(D, rw)
  size_t main_bytes = 0;   // everything above
  size_t merge_bytes = 0;  // narrow: the warps' merge, [4][16][D + 2] f32 from offset 0
  size_t bytes = 0;        // what a launch asks for: max(main, merge)
};

// lean: the lean fp8 decode instantiation (MmaFp8Stages); ignored elsewhere.
constexpr MmaAttentionLayout MmaLayout(int D, int rw, bool fp8, bool lean = false) {
  MmaAttentionLayout l;
  const size_t bf = 2;  // sizeof(bf16)
  l.dp = D + 8;
  l.kv_stages = fp8 ? 1 : 2;
  l.rows = 16 * rw;
  l.key_warps = kMmaWarps / rw;
  l.q_at = 0;
  l.k_at = l.q_at + static_cast<size_t>(l.rows) * l.dp * bf;
  l.v_at = l.k_at + static_cast<size_t>(l.kv_stages) * kMmaStage * l.dp * bf;
  const size_t tiles_end = l.v_at + static_cast<size_t>(l.kv_stages) * kMmaStage * l.dp * bf;
  l.own_at = tiles_end;
  l.own_bytes = !fp8 && rw == 1 ? 2 * static_cast<size_t>(D) * bf : 0;
  l.staging_at = l.own_at + l.own_bytes;
  l.stage_bytes = fp8 ? Fp8StageBytes(D, kMmaStage) : 0;
  l.fp8_stages = fp8 ? MmaFp8Stages(D, rw, lean) : 0;
  l.main_bytes = l.staging_at + static_cast<size_t>(l.fp8_stages) * l.stage_bytes;
  l.merge_bytes = rw == 1 ? static_cast<size_t>(kMmaWarps) * 16 * (D + 2) * 4 : 0;
  l.bytes = l.main_bytes > l.merge_bytes ? l.main_bytes : l.merge_bytes;
  return l;
}

// Whether the kernel has this instantiation.
constexpr bool MmaLayoutInstantiated(int D, int rw) {
  return (D == 64 || D == 128) && (rw == 1 || rw == 4);
}

}  // namespace agentkv::backend::cuda::kernels
