// One layer's attention over a long context on the GPU, bf16 cache against
// fp8 (docs/kv-fp8.md), through LaunchAttention as the backend calls it:
//   decode32k/<shape>/<dtype>: one sequence's token at position 32,767,
//     narrow tiles, its keys split 32 ways across blocks (what GraphShape
//     gives one sequence), plus the split merge; the step's key from k_new /
//     v_new (bf16) or the quantized rows (fp8). Reported: microseconds a
//     layer and the K/V bytes read per second (the roofline's terms: a 32k
//     context is 32,768 * 2 * kv_heads * head_dim * 2 bytes a layer in
//     bf16, 32,768 * 2 * kv_heads * (head_dim + 4) in fp8).
//   decode32k/<shape>/<dtype>/s<n>: the same at n splits, and fp8_lean:
//     the lean fp8 decode form (AttentionParams::fp8_decode_lean, one more
//     block per SM) at 32, 48 and 64 splits (GraphShape gives it 64 at
//     head_dim 64 and 49 at 128 with that form on: a wave of 4 or 3 blocks
//     an SM); bf16 at 48 and 64 (GraphShape gives bf16 one wave of the
//     blocks its form fits, MmaBf16DecodeBlocksPerSm: 64 splits at 4 an
//     SM, 49 at 3).
//   prefill32k/<shape>/<dtype>: the last 2,048-token chunk of a 32k prompt
//     (after 30,720 cached tokens) on wide tiles, one split. Reported:
//     microseconds and attention TFLOP/s (4 * heads * head_dim flops per
//     visible (query, key) pair).
// Shapes: 1b (32 heads, 8 KV heads, head_dim 64), 8b (32, 8, 128). The
// cache holds enough layers (each launch reads the next) that no layer's
// K/V stays in the 50 MiB L2 between its launches. Data is constant (the
// kernels' speed does not depend on it). The bf16 prompt runs read K/V by
// cp.async, not the TMA page copies the backend uses at head_dim 64.
// Without a GPU (or CUDA) nothing is run.
#include <benchmark/benchmark.h>

#ifdef AGENTKV_HAVE_CUDA
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/backend/cuda/device_buffer.h"
#include "engine/backend/cuda/kernels/attention.h"
#include "engine/backend/cuda/kernels/fp8_kv.h"
#include "engine/backend/cuda/status.h"
#include "engine/backend/kv_fp8.h"

namespace agentkv::backend::cuda {
namespace {

struct Shape {
  const char* name;
  int nh, nkv, D;
};
constexpr Shape kShapes[] = {{"1b", 32, 8, 64}, {"8b", 32, 8, 128}};
constexpr int kContext = 32768, kBlock = 16, kChunk = 2048;

template <typename T>
DeviceBuffer Filled(size_t n, int byte) {
  DeviceBuffer b;
  if (!b.Allocate(n * sizeof(T)).ok()) return b;
  cudaMemset(b.get(), byte, n * sizeof(T));  // 0x38: 1.0 in e4m3, 4.4e-5 in bf16 and f32
  return b;
}

void Run(benchmark::State& state, Shape s, bool fp8, bool prefill, int decode_splits = 32,
         bool lean = false) {
  if (!DeviceAvailable().ok()) {
    state.SkipWithError("no GPU");
    return;
  }
  const int D = s.D, nh = s.nh, nkv = s.nkv;
  const int T = prefill ? kChunk : 1, start = kContext - T;
  const int blocks = kContext / kBlock;
  const int64_t section = fp8 ? kvfp8::SectionBytes(kBlock, nkv, D)
                              : static_cast<int64_t>(kBlock) * nkv * D * 2;  // bytes
  // Layers enough for 256 MiB of cache.
  const int layers =
      static_cast<int>(std::max<int64_t>(2, (256ll << 20) / (2 * section * blocks) + 1));
  const int64_t block_bytes = layers * 2 * section;
  DeviceBuffer cache = Filled<uint8_t>(static_cast<size_t>(blocks) * block_bytes, 0x38);
  DeviceBuffer q = Filled<uint16_t>(static_cast<size_t>(T) * nh * D, 0x38);
  DeviceBuffer knew = Filled<uint16_t>(static_cast<size_t>(T) * nkv * D, 0x38);
  DeviceBuffer vnew = Filled<uint16_t>(static_cast<size_t>(T) * nkv * D, 0x38);
  DeviceBuffer rows = Filled<uint8_t>(kernels::Fp8KvRowsBytes(T, nkv, D), 0x38);
  const int splits = prefill ? 1 : decode_splits;
  DeviceBuffer part_o = Filled<float>(static_cast<size_t>(T) * nh * splits * D, 0);
  DeviceBuffer part_ml = Filled<float>(static_cast<size_t>(T) * nh * splits * 2, 0);
  DeviceBuffer out = Filled<uint16_t>(static_cast<size_t>(T) * nh * D, 0);
  if (cache.get() == nullptr || part_o.get() == nullptr) {
    state.SkipWithError("out of device memory");
    return;
  }
  // Metadata: the table, positions, tiles as the backend cuts them.
  std::vector<int32_t> table(blocks), pos(T), tile_seq, tile_t0, tile_n;
  for (int b = 0; b < blocks; ++b) table[b] = b;
  for (int t = 0; t < T; ++t) pos[t] = start + t;
  const int tpt = kernels::TokensPerTile(nh / nkv, prefill);
  for (int t = 0; t < T; t += tpt) {
    tile_seq.push_back(0);
    tile_t0.push_back(t);
    tile_n.push_back(std::min(tpt, T - t));
  }
  auto upload = [](const std::vector<int32_t>& v) {
    DeviceBuffer b;
    if (b.Allocate(v.size() * 4).ok())
      cudaMemcpy(b.get(), v.data(), v.size() * 4, cudaMemcpyHostToDevice);
    return b;
  };
  DeviceBuffer dtab = upload(table), dpos = upload(pos), dstart = upload({start}),
               dfirst = upload({0, T}), dw = upload({blocks}), dseq = upload(tile_seq),
               dt0 = upload(tile_t0), dn = upload(tile_n);
  kernels::AttentionParams p;
  p.q = q.get<kernels::bf16_t>();
  p.k_new = knew.get<kernels::bf16_t>();
  p.v_new = vnew.get<kernels::bf16_t>();
  p.cache.fp8 = fp8;
  p.cache.base = cache.get<kernels::bf16_t>();
  p.cache.block_stride = fp8 ? block_bytes : block_bytes / 2;  // bytes / elements
  p.cache.block_size = kBlock;
  p.cache.tables = dtab.get<int32_t>();
  p.cache.table_stride = dw.get<int32_t>();
  if (fp8) p.fp8_new = kernels::Fp8KvRowsAt(rows.get(), T, nkv, D);
  p.pos = dpos.get<int32_t>();
  p.seq_start = dstart.get<int32_t>();
  p.seq_first = dfirst.get<int32_t>();
  p.tile_seq = dseq.get<int32_t>();
  p.tile_t0 = dt0.get<int32_t>();
  p.tile_n = dn.get<int32_t>();
  p.num_tiles = static_cast<int>(tile_seq.size());
  p.tokens = T;
  p.nh = nh;
  p.nkv = nkv;
  p.head_dim = D;
  p.scale = 0.125f;
  p.splits = splits;
  p.wide = prefill;
  p.fp8_decode_lean = lean;
  p.part_o = part_o.get<float>();
  p.part_ml = part_ml.get<float>();
  p.out = out.get<kernels::bf16_t>();

  cudaStream_t stream = nullptr;
  cudaEvent_t ev[2];
  cudaStreamCreate(&stream);
  cudaEventCreate(&ev[0]);
  cudaEventCreate(&ev[1]);
  int layer = 0;
  auto launch = [&] {
    p.cache.layer_offset = fp8 ? layer * 2 * section : layer * section;  // bytes / elements
    layer = (layer + 1) % layers;
    return LaunchAttention(p, stream);
  };
  for (int i = 0; i < layers; ++i) launch();  // warm-up (and the smem attribute)
  if (cudaStreamSynchronize(stream) != cudaSuccess) {
    state.SkipWithError("launch failed");
    return;
  }
  const int reps = prefill ? 4 : 4 * layers;
  for (auto _ : state) {
    cudaEventRecord(ev[0], stream);
    for (int i = 0; i < reps; ++i) launch();
    cudaEventRecord(ev[1], stream);
    cudaEventSynchronize(ev[1]);
    float ms = 0;
    cudaEventElapsedTime(&ms, ev[0], ev[1]);
    state.SetIterationTime(ms / 1e3 / reps);
  }
  if (cudaGetLastError() != cudaSuccess) state.SkipWithError("a launch failed");
  const double kv_bytes =
      static_cast<double>(kContext) * 2 * nkv * (fp8 ? D + 4 : 2 * D);  // a layer's keys
  if (prefill) {
    // Visible pairs: each query row sees start + its index + 1 keys.
    const double pairs = static_cast<double>(T) * nh * (start + (T + 1) / 2.0);
    state.counters["TFLOP/s"] =
        benchmark::Counter(4.0 * D * pairs / 1e12, benchmark::Counter::kIsIterationInvariantRate);
  } else {
    state.counters["KV_GB/s"] =
        benchmark::Counter(kv_bytes / 1e9, benchmark::Counter::kIsIterationInvariantRate);
  }
  cudaEventDestroy(ev[0]);
  cudaEventDestroy(ev[1]);
  cudaStreamDestroy(stream);
}

int Register() {
  for (const Shape& s : kShapes)
    for (bool prefill : {false, true})
      for (bool fp8 : {false, true}) {
        const std::string name =
            std::string(prefill ? "prefill32k/" : "decode32k/") + s.name + (fp8 ? "/fp8" : "/bf16");
        benchmark::RegisterBenchmark(name.c_str(),
                                     [=](benchmark::State& st) { Run(st, s, fp8, prefill); })
            ->UseManualTime()
            ->Iterations(10)
            ->Unit(benchmark::kMicrosecond);
      }
  // Decode at other splits, and the lean fp8 form.
  struct Variant {
    const char* dtype;
    bool fp8, lean;
    int splits;
  };
  constexpr Variant kVariants[] = {{"bf16", false, false, 48},   {"bf16", false, false, 64},
                                   {"fp8", true, false, 64},     {"fp8_lean", true, true, 32},
                                   {"fp8_lean", true, true, 48}, {"fp8_lean", true, true, 64}};
  for (const Shape& s : kShapes)
    for (const Variant& v : kVariants) {
      const std::string name =
          std::string("decode32k/") + s.name + "/" + v.dtype + "/s" + std::to_string(v.splits);
      benchmark::RegisterBenchmark(
          name.c_str(), [=](benchmark::State& st) { Run(st, s, v.fp8, false, v.splits, v.lean); })
          ->UseManualTime()
          ->Iterations(10)
          ->Unit(benchmark::kMicrosecond);
    }
  return 0;
}
const int registered = Register();

}  // namespace
}  // namespace agentkv::backend::cuda
#endif  // AGENTKV_HAVE_CUDA
