// Decode-step grouped GEMMs of the mixture-of-experts and quantized dense
// layers on the GPU (kernels::LaunchMoeGemm), by path: the weight-streaming GEMV
// (`/gemv`: bf16 on the CUDA cores, fp8 and mxfp4 on mma.sync) and the
// tensor cores' tiles (`/tiles`), at 1-16 tokens, on the shapes of
// Qwen3-30B-A3B (128 experts, 8 a token; gate_up 1,536 x 2,048 with SwiGLU,
// down 2,048 x 768; bf16 and fp8 128x128 blocks), GPT-OSS-20B (32 experts,
// 4 a token, mxfp4; gate_up 5,760 x 2,880 with the clamped SwiGLU, down
// 2,880 x 2,880) and Qwen3-8B fp8 (one group: qkv 6,144 x 4,096, down
// 4,096 x 12,288). Each launch of an iteration takes its own routing
// (random distinct experts per token, seeded by the launch), so the
// experts it reads are mostly not in the L2 from the launch before; the
// dense shapes rotate through weight copies of more than 200 MiB. The 32
// launches of an iteration are one CUDA graph. Reported: microseconds per
// launch and `weight_GBps`, the bytes of the experts (and scales) a launch
// reads over its time: against the copy rate (tools/device/copy_bw.py) the
// share of the bandwidth floor. Also (`<shape>/dequant`) the fp8 dense
// projections of Qwen3-8B dequantized to bf16 (kernels::LaunchDequantFp8,
// what many-token steps run before the bf16 GEMM), `weight_GBps` its fp8
// reads and `moved_GBps` reads and bf16 writes together (3 bytes a value).
// Built with CUDA only; without a GPU every case reports an error.
#include <benchmark/benchmark.h>

#ifdef AGENTKV_HAVE_CUDA
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "engine/backend/cuda/device_buffer.h"
#include "engine/backend/cuda/kernels/dequant.h"
#include "engine/backend/cuda/kernels/moe.h"

namespace agentkv::backend::cuda {
namespace {

constexpr int kLaunches = 32;

struct Shape {
  const char* name;
  kernels::MoeWeightFormat format;
  int E, k, N, K;  // E 1, k 1: one group (a dense layer)
  kernels::MoeEpilogue epilogue;
};
constexpr Shape kShapes[] = {
    {"q3moe_gate_up_bf16", kernels::MoeWeightFormat::kBf16, 128, 8, 1536, 2048,
     kernels::MoeEpilogue::kSwiglu},
    {"q3moe_down_bf16", kernels::MoeWeightFormat::kBf16, 128, 8, 2048, 768,
     kernels::MoeEpilogue::kStore},
    {"q3moe_gate_up_fp8", kernels::MoeWeightFormat::kFp8Block, 128, 8, 1536, 2048,
     kernels::MoeEpilogue::kSwiglu},
    {"q3moe_down_fp8", kernels::MoeWeightFormat::kFp8Block, 128, 8, 2048, 768,
     kernels::MoeEpilogue::kStore},
    {"gptoss_gate_up_mxfp4", kernels::MoeWeightFormat::kMxfp4, 32, 4, 5760, 2880,
     kernels::MoeEpilogue::kClampedSwiglu},
    {"gptoss_down_mxfp4", kernels::MoeWeightFormat::kMxfp4, 32, 4, 2880, 2880,
     kernels::MoeEpilogue::kStore},
    {"q3_8b_qkv_fp8", kernels::MoeWeightFormat::kFp8Block, 1, 1, 6144, 4096,
     kernels::MoeEpilogue::kStoreBf16},
    {"q3_8b_down_fp8", kernels::MoeWeightFormat::kFp8Block, 1, 1, 4096, 12288,
     kernels::MoeEpilogue::kStore},
};

// Bytes of one expert's weights and scales.
size_t ExpertBytes(const Shape& s) {
  const size_t n = s.N, k = s.K;
  switch (s.format) {
    case kernels::MoeWeightFormat::kBf16:
      return n * k * 2;
    case kernels::MoeWeightFormat::kFp8Block:
      return n * k + ((n + 127) / 128) * ((k + 127) / 128) * 4;
    default:
      return n * k / 2 + n * (k / 32);
  }
}

template <typename T>
bool Fill(DeviceBuffer& b, const std::vector<T>& h) {
  return b.Allocate(h.size() * sizeof(T)).ok() &&
         cudaMemcpy(b.get(), h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice) == cudaSuccess;
}

void Run(benchmark::State& state, Shape s, int T, kernels::MoeGemmPath path) {
  const bool dense = s.E == 1;
  const int A = T * s.k;
  std::mt19937 rng(7);
  // Weights: random bytes (fp8 codes off the NaN pattern), scales near 1.
  // One copy for the experts; dense shapes get enough copies to pass 200
  // MiB.
  const size_t eb = ExpertBytes(s);
  const int copies = dense ? static_cast<int>(std::max<size_t>(1, (200u << 20) / eb + 1)) : 1;
  const size_t wn = static_cast<size_t>(s.E) * s.N * s.K;
  std::vector<DeviceBuffer> w(copies), wq(copies);
  DeviceBuffer scales, exps;
  for (int c = 0; c < copies; ++c) {
    if (s.format == kernels::MoeWeightFormat::kBf16) {
      std::vector<uint16_t> h(wn);
      for (auto& v : h) v = static_cast<uint16_t>(0x3c00u + (rng() & 0x1ff)) ^ ((rng() & 1u) << 15);
      if (!Fill(w[c], h)) return state.SkipWithError("alloc");
    } else {
      std::vector<uint8_t> h(s.format == kernels::MoeWeightFormat::kFp8Block ? wn : wn / 2);
      for (auto& v : h) {
        v = static_cast<uint8_t>(rng());
        if (s.format == kernels::MoeWeightFormat::kFp8Block && (v & 0x7f) == 0x7f) v = 0x3f;
      }
      if (!Fill(wq[c], h)) return state.SkipWithError("alloc");
    }
  }
  if (s.format == kernels::MoeWeightFormat::kFp8Block) {
    std::vector<float> h(static_cast<size_t>(s.E) * ((s.N + 127) / 128) * ((s.K + 127) / 128),
                         1.f / 64);
    if (!Fill(scales, h)) return state.SkipWithError("alloc");
  }
  if (s.format == kernels::MoeWeightFormat::kMxfp4) {
    std::vector<uint8_t> h(wn / 32, 120);
    if (!Fill(exps, h)) return state.SkipWithError("alloc");
  }
  std::vector<uint16_t> xh(static_cast<size_t>(T) * s.K, 0x3f80);  // 1.0
  DeviceBuffer x, y, act;
  if (!Fill(x, xh) || !y.Allocate(static_cast<size_t>(A) * s.N * 4).ok() ||
      !act.Allocate(static_cast<size_t>(A) * s.N * 2).ok())
    return state.SkipWithError("alloc");
  // A routing per launch (grouped shapes): its plan, and the bytes read.
  std::vector<DeviceBuffer> off(kLaunches), tiles(kLaunches), order(kLaunches);
  double bytes = 0;
  for (int l = 0; l < kLaunches && !dense; ++l) {
    std::vector<int32_t> experts(A), ids(s.E);
    for (int t = 0; t < T; ++t) {
      std::iota(ids.begin(), ids.end(), 0);
      std::shuffle(ids.begin(), ids.end(), rng);
      std::copy_n(ids.begin(), s.k, experts.begin() + static_cast<size_t>(t) * s.k);
    }
    std::vector<int32_t> o(s.E + 1), ti(s.E + 1), ord(A), slot(A);
    kernels::MoePlanOffsets(experts.data(), A, s.E, o.data());
    for (int e = 0; e < s.E; ++e)
      kernels::MoePlanExpert(e, experts.data(), A, o.data(), ord.data(), slot.data());
    kernels::MoePlanTiles(o.data(), s.E, ti.data());
    for (int e = 0; e < s.E; ++e) bytes += o[e + 1] > o[e] ? static_cast<double>(eb) : 0.0;
    if (!Fill(off[l], o) || !Fill(tiles[l], ti) || !Fill(order[l], ord))
      return state.SkipWithError("alloc");
  }
  if (dense) bytes = static_cast<double>(eb) * kLaunches;
  bytes /= kLaunches;
  auto params = [&](int l) {
    kernels::MoeGemmParams p;
    p.path = path;
    p.format = s.format;
    p.x = x.get<kernels::bf16_t>();
    p.w = s.format == kernels::MoeWeightFormat::kBf16 ? w[l % copies].get<kernels::bf16_t>()
                                                      : nullptr;
    p.wq = s.format != kernels::MoeWeightFormat::kBf16 ? wq[l % copies].get<uint8_t>() : nullptr;
    p.scales = scales.get<float>();
    p.exps = exps.get<uint8_t>();
    p.scale_pairs = s.epilogue != kernels::MoeEpilogue::kStore &&
                    s.epilogue != kernels::MoeEpilogue::kStoreBf16 &&
                    s.format == kernels::MoeWeightFormat::kFp8Block;
    p.N = s.N;
    p.K = s.K;
    p.max_group_rows = T;
    p.epilogue = s.epilogue;
    p.limit = 7.f;
    p.y = y.get<float>();
    p.act = act.get<kernels::bf16_t>();
    if (dense) {
      p.rows = T;
    } else {
      p.order = order[l].get<int32_t>();
      p.div = s.k;
      p.offsets = off[l].get<int32_t>();
      p.tiles = tiles[l].get<int32_t>();
      p.num_experts = s.E;
      p.max_tiles = kernels::MoeMaxTiles(A, s.E);
    }
    return p;
  };
  cudaStream_t stream = nullptr;
  cudaEvent_t ev[2] = {nullptr, nullptr};
  cudaGraphExec_t exec = nullptr;
  cudaGraph_t graph = nullptr;
  bool ok = cudaStreamCreate(&stream) == cudaSuccess && cudaEventCreate(&ev[0]) == cudaSuccess &&
            cudaEventCreate(&ev[1]) == cudaSuccess;
  for (int l = 0; l < kLaunches && ok; ++l)
    ok = kernels::LaunchMoeGemm(params(l), stream) == cudaSuccess;
  ok = ok && cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal) == cudaSuccess;
  for (int l = 0; l < kLaunches && ok; ++l)
    ok = kernels::LaunchMoeGemm(params(l), stream) == cudaSuccess;
  ok = cudaStreamEndCapture(stream, &graph) == cudaSuccess && ok;
  ok = ok && cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess;
  ok = ok && cudaStreamSynchronize(stream) == cudaSuccess;
  if (ok) {
    for (auto _ : state) {
      cudaEventRecord(ev[0], stream);
      cudaGraphLaunch(exec, stream);
      cudaEventRecord(ev[1], stream);
      cudaEventSynchronize(ev[1]);
      float ms = 0;
      cudaEventElapsedTime(&ms, ev[0], ev[1]);
      state.SetIterationTime(ms / 1e3 / kLaunches);
    }
    state.counters["weight_GBps"] =
        benchmark::Counter(bytes, benchmark::Counter::kIsIterationInvariantRate);
    state.counters["experts_MB"] = bytes / 1e6;
  } else {
    state.SkipWithError("launch or capture failed");
  }
  if (graph != nullptr) cudaGraphDestroy(graph);
  if (exec != nullptr) cudaGraphExecDestroy(exec);
  for (cudaEvent_t e : ev)
    if (e != nullptr) cudaEventDestroy(e);
  if (stream != nullptr) cudaStreamDestroy(stream);
}

// One fp8 dense projection n x k (a scale per row and 128 columns)
// dequantized to bf16, kLaunches a graph, rotating through weight copies of
// more than 200 MiB into one output.
void RunDequant(benchmark::State& state, int n, int k) {
  std::mt19937 rng(9);
  const size_t wn = static_cast<size_t>(n) * k, nkb = (k + 127) / 128;
  const int copies = static_cast<int>((200u << 20) / wn + 1);
  std::vector<DeviceBuffer> wq(copies);
  std::vector<uint8_t> h(wn);
  for (auto& v : h) {
    v = static_cast<uint8_t>(rng());
    if ((v & 0x7f) == 0x7f) v = 0x3f;
  }
  for (auto& b : wq)
    if (!Fill(b, h)) return state.SkipWithError("alloc");
  DeviceBuffer scales, out;
  if (!Fill(scales, std::vector<float>(static_cast<size_t>(n) * nkb, 1.f / 64)) ||
      !out.Allocate(wn * 2).ok())
    return state.SkipWithError("alloc");
  cudaStream_t stream = nullptr;
  cudaEvent_t ev[2] = {nullptr, nullptr};
  cudaGraphExec_t exec = nullptr;
  cudaGraph_t graph = nullptr;
  bool ok = cudaStreamCreate(&stream) == cudaSuccess && cudaEventCreate(&ev[0]) == cudaSuccess &&
            cudaEventCreate(&ev[1]) == cudaSuccess;
  auto launch = [&](int l) {
    return kernels::LaunchDequantFp8(wq[l % copies].get<uint8_t>(), scales.get<float>(), n, k, 128,
                                     out.get<kernels::bf16_t>(), stream) == cudaSuccess;
  };
  for (int l = 0; l < kLaunches && ok; ++l) ok = launch(l);
  ok = ok && cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal) == cudaSuccess;
  for (int l = 0; l < kLaunches && ok; ++l) ok = launch(l);
  ok = cudaStreamEndCapture(stream, &graph) == cudaSuccess && ok;
  ok = ok && cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess;
  ok = ok && cudaStreamSynchronize(stream) == cudaSuccess;
  if (ok) {
    for (auto _ : state) {
      cudaEventRecord(ev[0], stream);
      cudaGraphLaunch(exec, stream);
      cudaEventRecord(ev[1], stream);
      cudaEventSynchronize(ev[1]);
      float ms = 0;
      cudaEventElapsedTime(&ms, ev[0], ev[1]);
      state.SetIterationTime(ms / 1e3 / kLaunches);
    }
    const double read = static_cast<double>(wn) + static_cast<double>(n) * nkb * 4;
    state.counters["weight_GBps"] =
        benchmark::Counter(read, benchmark::Counter::kIsIterationInvariantRate);
    state.counters["moved_GBps"] =
        benchmark::Counter(read + 2.0 * wn, benchmark::Counter::kIsIterationInvariantRate);
    state.counters["experts_MB"] = read / 1e6;
  } else {
    state.SkipWithError("launch or capture failed");
  }
  if (graph != nullptr) cudaGraphDestroy(graph);
  if (exec != nullptr) cudaGraphExecDestroy(exec);
  for (cudaEvent_t e : ev)
    if (e != nullptr) cudaEventDestroy(e);
  if (stream != nullptr) cudaStreamDestroy(stream);
}

int Register() {
  struct Dense {
    const char* name;
    int n, k;
  };
  for (const Dense d :
       {Dense{"q3_8b_qkv_fp8", 6144, 4096}, Dense{"q3_8b_o_fp8", 4096, 4096},
        Dense{"q3_8b_gate_up_fp8", 24576, 4096}, Dense{"q3_8b_down_fp8", 4096, 12288}}) {
    const std::string name = std::string(d.name) + "/dequant";
    benchmark::RegisterBenchmark(name.c_str(),
                                 [=](benchmark::State& st) { RunDequant(st, d.n, d.k); })
        ->UseManualTime()
        ->Iterations(20)
        ->Unit(benchmark::kMicrosecond);
  }
  for (const Shape& s : kShapes)
    for (const int T : {1, 2, 4, 8, 16})
      for (const auto& [name, path] : {std::pair{"gemv", kernels::MoeGemmPath::kGemv},
                                       std::pair{"tiles", kernels::MoeGemmPath::kTensorCores}}) {
        if (path == kernels::MoeGemmPath::kGemv && !kernels::MoeGemvTakes(s.N, s.K, s.format, T))
          continue;
        const std::string n = std::string(s.name) + "/t" + std::to_string(T) + "/" + name;
        benchmark::RegisterBenchmark(n.c_str(), [=](benchmark::State& st) { Run(st, s, T, path); })
            ->UseManualTime()
            ->Iterations(20)
            ->Unit(benchmark::kMicrosecond);
      }
  return 0;
}
const int registered = Register();

}  // namespace
}  // namespace agentkv::backend::cuda
#endif  // AGENTKV_HAVE_CUDA
