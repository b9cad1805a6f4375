// The persistent prompt GEMM's kernel and launch plumbing (structure:
// wgmma_prompt_gemm.cu's header comment), shared by the product's launchers
// (wgmma_prompt_gemm.cu: bf16, gated and argmax forms) and the fp32
// residual form measured and not used (dev/cuda/prompt_gemm_add.cu:
// Out::kAddF32, each output tile added into y by a TMA reduction). Include
// only in translation units built for sm_90a; everything is in an anonymous
// namespace, one copy a unit.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>

#include <climits>

#include "engine/backend/cuda/kernels/activation.cuh"
#include "engine/backend/cuda/kernels/argmax.cuh"
#include "engine/backend/cuda/kernels/argmax.h"
#include "engine/backend/cuda/kernels/gemm_route.h"
#include "engine/backend/cuda/kernels/hopper.cuh"
#include "engine/backend/cuda/kernels/launch.h"
#include "engine/backend/cuda/kernels/mma.cuh"
#include "engine/backend/cuda/kernels/pdl.cuh"
#include "engine/backend/cuda/kernels/per_device_once.h"

namespace agentkv::backend::cuda::kernels {
namespace {

using bf16 = __nv_bfloat16;

constexpr int kBM = 128;               // tokens per tile
constexpr int kBN = kPromptGemmTileN;  // features per tile
constexpr int kBK = kPromptGemmTileK;  // k per stage: one 128-byte swizzled row
constexpr int kStages = 4;
constexpr int kBand = 8;  // feature tiles per raster band
constexpr int kThreads = 384;
constexpr int kConsumerThreads = 256;
constexpr int kABytes = kBM * kBK * 2;  // 16 KiB
constexpr int kBBytes = kBN * kBK * 2;  // 32 KiB
constexpr int kStageBytes = kABytes + kBBytes;
constexpr int kBarBytes = 2 * kStages * 8;
constexpr int kSlabBytes = kBM * 128;  // 128-byte rows: 64 bf16 or 32 fp32 columns

// The output forms: bf16; bf16 act(gate) * up (half the columns); fp32
// logits (stored only if asked) and each row's best feature of the tile
// (the LM head).
enum class Out { kBf16, kGated, kAddF32, kArgmax };
// The output tile leaves shared memory in parts of 32 KiB (two slabs):
// the gated form's whole tile, the bf16 form's in two parts of 128
// columns, the fp32 form's in four of 64, so that four stages fit beside
// it. (With three stages and the whole tile at once, the consumers waited
// on the stages' barriers for 18% of their samples and o and down ran 5-7%
// slower than cuBLAS.)
constexpr int kOutBytes = 2 * kSlabBytes;
template <Out kOut>
constexpr int PartsOf() {
  return kOut == Out::kGated ? 1 : kOut == Out::kBf16 ? 2 : 4;  // fp32 forms: 4
}
constexpr size_t kSmem = 1024 + kStages * kStageBytes + kOutBytes + kBarBytes;

struct PromptArgs {
  int M = 0, N = 0, K = 0;
  int act = -1;                    // gated: Activate's code
  float2* best = nullptr;          // kArgmax: [row][feature tile] (value, index bits)
  const int32_t* store = nullptr;  // kArgmax: logits stored unless *store == 0
};

__device__ __forceinline__ void Wgmma256(float (&d)[128], uint64_t a, uint64_t b) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
      "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
      "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, "
      "%127"
      "}, %128, %129, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]),
        "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
        "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]),
        "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]),
        "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]),
        "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]),
        "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]),
        "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]),
        "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
        "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]),
        "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]),
        "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]),
        "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "l"(a), "l"(b));
#endif
}

// act(g) * u. The epilogue holds up the tensor cores, so SiLU takes one
// multi-function-unit instruction: g * sigmoid(g) with sigmoid(g) =
// (1 + tanh(g / 2)) / 2 and the hardware tanh (absolute error ~5e-4, under
// the bf16 output's rounding): 1-2% faster than exp2 and rcp (item 96).
__device__ __forceinline__ float TanhApprox(float x) {
  float y;
  asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ float GatedValue(float g, float u, int act) {
  if (act == 0) return g * u * fmaf(0.5f, TanhApprox(0.5f * g), 0.5f);
  return Activate(g, act) * u;
}

__device__ __forceinline__ void FenceAcc(float (&d)[128]) {
#pragma unroll
  for (int i = 0; i < 128; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// Box {64 k, rows} of a 2-d map at (k, row).
__device__ __forceinline__ void Tma2d(uint32_t dst, const CUtensorMap* map, int k, int row,
                                      uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst),
      "l"(map), "r"(k), "r"(row), "r"(bar)
      : "memory");
}
// The 256 consumer threads only (the producer warpgroup has left).
__device__ __forceinline__ void ConsumerSync() {
  asm volatile("bar.sync 1, %0;\n" ::"n"(kConsumerThreads) : "memory");
}

// Tile t's first token and feature (bands of kBand feature tiles, token
// tiles fastest within a band).
__device__ __forceinline__ void TileOf(int t, int mtiles, int ntiles, int& m0, int& n0) {
  const int per_band = mtiles * kBand;
  const int band = t / per_band, in = t - band * per_band;
  const int width = min(kBand, ntiles - band * kBand);
  const int mt = in / width;
  m0 = mt * kBM;
  n0 = (band * kBand + in - mt * width) * kBN;
}

template <Out kOut>
__global__ void __launch_bounds__(kThreads, 1)
    PromptGemmKernel(const __grid_constant__ CUtensorMap xmap,
                     const __grid_constant__ CUtensorMap wmap,
                     const __grid_constant__ CUtensorMap ymap, const PromptArgs a) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr bool kGated = kOut == Out::kGated;
  constexpr int S = kStages;
  extern __shared__ unsigned char smem_raw[];
  const uint32_t raw = SmemAddr(smem_raw);
  const uint32_t base = (raw + 1023) & ~1023u;  // the swizzle atoms are 1024-byte aligned
  unsigned char* smem = smem_raw + (base - raw);
  const uint32_t out_s = base + S * kStageBytes;
  const uint32_t full = out_s + kOutBytes;
  const uint32_t empty = full + S * 8;
  const int tid = threadIdx.x;
  const int mtiles = (a.M + kBM - 1) / kBM, ntiles = a.N / kBN, nk = a.K / kBK;
  const int tiles = mtiles * ntiles;

  if (tid == 0) {
    for (int s = 0; s < S; ++s) {
      MbarInit(full + 8 * s, 1);
      MbarInit(empty + 8 * s, kConsumerThreads / 32);  // one arrival a consumer warp
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  PdlLaunchDependents();
  PdlWait();

  if (tid < 128) {  // producer
    if (tid != 0) return;
    int it = 0;
    for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
      int m0, n0;
      TileOf(t, mtiles, ntiles, m0, n0);
      for (int kt = 0; kt < nk; ++kt, ++it) {
        const int s = it % S;
        const uint32_t ph = (it / S) & 1;
        MbarWait(empty + 8 * s, ph ^ 1);
        const uint32_t st = base + s * kStageBytes;
        MbarExpectTx(full + 8 * s, kStageBytes);
        Tma2d(st, &xmap, kt * kBK, m0, full + 8 * s);
        Tma2d(st + kABytes, &wmap, kt * kBK, n0, full + 8 * s);
      }
    }
    return;
  }

  // Consumers: warpgroup c (1 or 2) takes the tile's rows 64 (c - 1) on.
  const int ct = tid - 128, wg = ct >> 7, warp = (ct >> 5) & 3, lane = tid & 31;
  float acc[128];
  int it = 0;
  // kArgmax: whether the logits are stored (the flag is read when the kernel
  // runs, so that one captured graph serves steps with and without rows
  // that sample).
  const bool store_logits = kOut != Out::kArgmax || a.store == nullptr || *a.store != 0;
  for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
    int m0, n0;
    TileOf(t, mtiles, ntiles, m0, n0);
#pragma unroll
    for (int i = 0; i < 128; ++i) acc[i] = 0.f;
    // A warpgroup whose 64 rows are all past M (decode-sized M) multiplies
    // nothing: its rows are zeros and are not stored.
    const bool live = m0 + wg * 64 < a.M;
    int prev = -1;
    for (int kt = 0; kt < nk; ++kt, ++it) {
      const int s = it % S;
      MbarWait(full + 8 * s, (it / S) & 1);
      const uint32_t st = base + s * kStageBytes;
      const uint64_t da = KMajorDesc(st + wg * 64 * 128), db = KMajorDesc(st + kABytes);
      asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
      for (int kk = 0; kk < kBK / 16; ++kk)
        if (live) Wgmma256(acc, da + 2 * kk, db + 2 * kk);
      asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
      // The stage before this one has been read once its group is done.
      asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
      FenceAcc(acc);
      if (prev >= 0 && lane == 0) MbarArrive(empty + 8 * prev);
      prev = s;
    }
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
    FenceAcc(acc);
    if (prev >= 0 && lane == 0) MbarArrive(empty + 8 * prev);

    // D fragment: rows 16 warp + lane / 4 (+ 8) of the warpgroup's 64,
    // features 8 j + 2 (lane % 4) (+ 1). The output tile goes to shared
    // memory as slabs of 64 columns (128-byte rows, 16-byte chunk c of row r
    // at chunk c ^ (r % 8): the layout a 128-byte-swizzle TMA store reads,
    // and no bank conflicts here), then out by TMA stores that run while
    // the consumers start on the next tile. Rows past M are not stored.
    const int r0 = wg * 64 + warp * 16 + (lane >> 2), q = lane & 3;
    constexpr int kParts = PartsOf<kOut>(), kJ = 32 / kParts;  // fragments j a part
    if constexpr (kOut == Out::kArgmax) {
      // Each row's best of the tile's 256 features: a thread's 64, then its
      // row's four lanes by shuffles (Better: the result does not depend on
      // the order).
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float bv = -INFINITY;
        int bi = INT_MAX;
#pragma unroll
        for (int j = 0; j < 32; ++j)
#pragma unroll
          for (int e = 0; e < 2; ++e)
            Better(bv, bi, acc[4 * j + 2 * h + e], n0 + 8 * j + 2 * q + e);
#pragma unroll
        for (int o = 1; o < 4; o <<= 1)
          Better(bv, bi, __shfl_xor_sync(0xffffffffu, bv, o), __shfl_xor_sync(0xffffffffu, bi, o));
        const int row = m0 + r0 + 8 * h;
        if (q == 0 && row < a.M)
          a.best[static_cast<int64_t>(row) * (a.N / kBN) + n0 / kBN] =
              make_float2(bv, __int_as_float(bi));
      }
      if (!store_logits) continue;
    }
#pragma unroll
    for (int part = 0; part < kParts; ++part) {
      if (ct == 0) asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
      ConsumerSync();  // the last stores have read the slabs
#pragma unroll
      for (int j = kJ * part; j < kJ * part + kJ; ++j)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int r = r0 + 8 * h;
          const float g = acc[4 * j + 2 * h], u = acc[4 * j + 2 * h + 1];
          if constexpr (kOut == Out::kAddF32 || kOut == Out::kArgmax) {
            const int col = 8 * (j - kJ * part) + 2 * q;  // fp32 column of the part
            unsigned char* at = smem + S * kStageBytes + (col >> 5) * kSlabBytes + r * 128 +
                                ((((col & 31) >> 2) ^ (r & 7)) << 4) + (col & 3) * 4;
            *reinterpret_cast<float2*>(at) = make_float2(g, u);
          } else {
            const int col = kGated ? 4 * j + q : 8 * (j - kJ * part) + 2 * q;
            unsigned char* at = smem + S * kStageBytes + (col >> 6) * kSlabBytes + r * 128 +
                                ((((col & 63) >> 3) ^ (r & 7)) << 4) + (col & 7) * 2;
            if constexpr (kGated) {
              *reinterpret_cast<bf16*>(at) = __float2bfloat16_rn(GatedValue(g, u, a.act));
            } else {
              *reinterpret_cast<__nv_bfloat162*>(at) = __floats2bfloat162_rn(g, u);
            }
          }
        }
      asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
      ConsumerSync();
      if (ct == 0) {
        // Two slabs of 128-byte rows: 64 bf16 or 32 fp32 columns each.
        constexpr int kSlabCols = kOut == Out::kAddF32 || kOut == Out::kArgmax ? 32 : 64;
        const int col0 = kGated ? n0 / 2 : n0 + part * 2 * kSlabCols;
#pragma unroll
        for (int sl = 0; sl < 2; ++sl) {
          if constexpr (kOut == Out::kAddF32) {
            asm volatile(
                "cp.reduce.async.bulk.tensor.2d.global.shared::cta.add.bulk_group"
                " [%0, {%1, %2}], [%3];\n" ::"l"(&ymap),
                "r"(col0 + sl * kSlabCols), "r"(m0), "r"(out_s + sl * kSlabBytes)
                : "memory");
          } else {
            asm volatile(
                "cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];\n" ::
                    "l"(&ymap),
                "r"(col0 + sl * kSlabCols), "r"(m0), "r"(out_s + sl * kSlabBytes)
                : "memory");
          }
        }
        asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
      }
    }
  }
  if (ct == 0) asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
#endif
}

// A row-major [rows][cols] matrix (bf16, or fp32 where f32), boxes of 128
// bytes of columns x box_rows, 128-byte swizzle.
bool Map2d(const void* p, int rows, int cols, int box_rows, CUtensorMap* map, bool f32 = false) {
  const TensorMapEncoder encode = TensorMapEncode();
  if (encode == nullptr) return false;
  const cuuint64_t e = f32 ? 4 : 2;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(cols) * e};
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(128 / e), static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t step[2] = {1, 1};
  return encode(map, f32 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT32 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2,
                const_cast<void*>(p), dims, strides, box, step, CU_TENSOR_MAP_INTERLEAVE_NONE,
                CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

PromptArgs ArgsOf(int m, int n, int k, int act) {
  PromptArgs a;
  a.M = m;
  a.N = n;
  a.K = k;
  a.act = act;
  return a;
}

template <Out kOut>
cudaError_t LaunchKernel(const CUtensorMap& xm, const CUtensorMap& wm, const CUtensorMap& ym,
                         const PromptArgs& a, int num_sms, LaunchConfig launch) {
  static PerDeviceOnce raised;  // (per device: the attribute is the context's)
  {
    const cudaError_t e = raised.Run([] {
      return cudaFuncSetAttribute(PromptGemmKernel<kOut>,
                                  cudaFuncAttributeMaxDynamicSharedMemorySize, int{kSmem});
    });
    if (e != cudaSuccess) return e;
  }
  const int tiles = (a.M + kBM - 1) / kBM * (a.N / kBN);
  const int grid = tiles < num_sms ? tiles : num_sms;
  return LaunchPdl(PromptGemmKernel<kOut>, dim3(grid), dim3(kThreads), kSmem, launch, xm, wm, ym,
                   a);
}

}  // namespace
}  // namespace agentkv::backend::cuda::kernels
