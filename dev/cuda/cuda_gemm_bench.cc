// Decode-step GEMMs on the GPU: y[m][n] = x[m] . w[n] for the Llama-3.2-1B
// shapes (qkv, o, gate_up, down, lm_head) at 1-64 rows, by the skinny
// tensor-core kernel (up to 8 rows; its own split of K and forced ones),
// cuBLAS, the GEMV (up to 8 rows), and cuBLASLt with each of the first 24
// algorithms its heuristic proposes (`/ltN`: is cuBLAS's default choice the
// best for these skinny shapes?), and the warpgroup GEMM (`/wgmma`: its
// plan; `/wgmma_planes`: its plan, the splits' partial planes left for the
// next kernel to add; `/wgmma_tT_sN[_k128]`: tiles of T features, K split
// N ways, stages of 128 k; CC 9.0 only). The weights rotate through copies
// totalling more than 200 MiB, so that each launch reads them from memory,
// not from the 50 MiB L2. The 50 launches of an iteration are one CUDA
// graph, as in a decode step (launched one by one, the host's ~10 us per
// launch would be timed). For the LM head also `/cublas_argmax` (cuBLAS
// then the two-pass argmax) and `/wgmma_argmax[_t128]` (the argmax in the
// warpgroup GEMM's epilogue, no logits stored). `prefill/<shape>/m<rows>/`:
// the prompt steps' form of each projection at 2,048 and 8,192 rows (QKV
// and gate_up bf16 out, o and down fp32 added into the residual) on random
// data, by cuBLAS's default and each heuristic candidate (what GemmTuner
// chooses among), and the persistent prompt GEMM (`/prompt`: bf16 out, or
// for o and down its residual form); for gate_up also cuBLAS then the gated activation
// (`/cublas_gated`) against the prompt GEMM with it in its epilogue
// (`/prompt_gated`), those two also at 128, 256 and 512 rows. Reported: microseconds per launch
// (CUDA events around the graph) and weight bytes per second. Without a GPU (or CUDA) nothing is
// run.
#include <benchmark/benchmark.h>

#ifdef AGENTKV_HAVE_CUDA
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "dev/cuda/prompt_gemm_add.h"
#include "dev/cuda/skinny_gemm.h"
#include "engine/backend/cuda/device_buffer.h"
#include "engine/backend/cuda/kernels/activation.h"
#include "engine/backend/cuda/kernels/argmax.h"
#include "engine/backend/cuda/kernels/gemv.h"
#include "engine/backend/cuda/kernels/wgmma_gemm.h"
#include "engine/backend/cuda/kernels/wgmma_prompt_gemm.h"
#include "engine/backend/cuda/status.h"

namespace agentkv::backend::cuda {
namespace {

struct Shape {
  const char* name;
  int n, k;
};
constexpr Shape kShapes[] = {{"qkv", 3072, 2048},
                             {"o", 2048, 2048},
                             {"gate_up", 16384, 2048},
                             {"down", 2048, 8192},
                             {"lm_head", 128256, 2048}};

// kCublasArgmax / kWgmmaArgmax (the LM head): cuBLAS then LaunchArgmax,
// against the warpgroup GEMM with the argmax in its epilogue and no logits
// stored.
// kPrompt / kPromptGated (prompt steps' qkv and gate_up): the persistent
// warpgroup GEMM, plain or with the gated activation in its epilogue,
// against kCublasGated (cuBLAS, then LaunchGatedAct); kPromptAdd (o and
// down): its residual form, fp32 added into y.
enum class Impl {
  kSkinny,
  kCublas,
  kGemv,
  kLt,
  kWgmma,
  kCublasArgmax,
  kWgmmaArgmax,
  kPrompt,
  kPromptGated,
  kCublasGated,
  kPromptAdd,
  kPromptArgmax
};

struct Fixture {
  std::vector<DeviceBuffer> w;
  DeviceBuffer x, y, ws, wgmma_ws, best, picks, store, act;
  cudaStream_t stream = nullptr;
  cudaGraphExec_t exec = nullptr;
  cublasHandle_t cublas = nullptr;
  cublasLtHandle_t lt = nullptr;
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
  cublasLtMatmulAlgo_t algo{};
  cudaEvent_t ev[2] = {nullptr, nullptr};
  int sms = 0;
  ~Fixture() {
    if (exec != nullptr) cudaGraphExecDestroy(exec);
    for (cudaEvent_t e : ev)
      if (e != nullptr) cudaEventDestroy(e);
    if (cublas != nullptr) cublasDestroy(cublas);
    for (cublasLtMatrixLayout_t l : {la, lb, lc})
      if (l != nullptr) cublasLtMatrixLayoutDestroy(l);
    if (op != nullptr) cublasLtMatmulDescDestroy(op);
    if (lt != nullptr) cublasLtDestroy(lt);
    if (stream != nullptr) cudaStreamDestroy(stream);
  }
};

// tile * 1000 + splits * 10 + k128, as the benchmark names them.
kernels::WgmmaGemmPlan WgmmaPlanOf(int code) {
  kernels::WgmmaGemmPlan p;
  if (code > 0) p = {code / 1000, code / 10 % 100, code % 10 == 1};
  return p;
}

// prefill: the prompt-step forms of the shape (Enqueue's output type and
// beta: qkv and gate_up bf16, o and down fp32 added into the residual).
// Random bf16 in [-1, 1): the tensor cores' power (and so the clocks a
// compute-bound GEMM keeps) depends on the data; constant inputs ran the
// prompt-sized GEMMs 5-8% faster than the random ones do.
void FillRandom(void* dst, size_t bytes, uint32_t seed) {
  std::vector<uint16_t> h(bytes / 2);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (uint16_t& v : h) {
    const float f = u(rng);
    uint32_t b;
    std::memcpy(&b, &f, 4);
    v = static_cast<uint16_t>(b >> 16);
  }
  cudaMemcpy(dst, h.data(), bytes, cudaMemcpyHostToDevice);
}

void Run(benchmark::State& state, Shape s, int m, Impl impl, int splits, bool prefill = false) {
  const std::string sn = s.name;
  const bool out_f32 = !prefill || sn == "o" || sn == "down";
  const float beta = prefill && out_f32 ? 1.f : 0.f;
  if (!DeviceAvailable().ok()) {
    state.SkipWithError("no GPU");
    return;
  }
  Fixture f;
  cudaDeviceGetAttribute(&f.sms, cudaDevAttrMultiProcessorCount, 0);
  const size_t wbytes = static_cast<size_t>(s.n) * s.k * 2;
  // (Prompt-sized GEMMs are compute-bound: two copies.)
  const size_t copies = prefill ? 2 : std::max<size_t>(2, (200u << 20) / wbytes + 1);
  f.w.resize(copies);
  for (auto& b : f.w) {
    if (!b.Allocate(wbytes).ok()) {
      state.SkipWithError("out of device memory");
      return;
    }
    if (prefill)
      FillRandom(b.get(), wbytes, 1);
    else
      cudaMemset(b.get(), 0x3c, wbytes);  // small finite bf16 values
  }
  (void)f.x.Allocate(static_cast<size_t>(m) * s.k * 2);
  (void)f.y.Allocate(static_cast<size_t>(m) * s.n * 4 * (prefill ? 1 : kernels::kMaxWgmmaSplits));
  if (prefill)
    FillRandom(f.x.get(), f.x.bytes(), 2);
  else
    cudaMemset(f.x.get(), 0x3c, f.x.bytes());
  cudaMemset(f.y.get(), 0, f.y.bytes());
  if (impl == Impl::kCublasGated) (void)f.act.Allocate(static_cast<size_t>(m) * s.n);
  cudaStreamCreateWithFlags(&f.stream, cudaStreamNonBlocking);
  cublasCreate(&f.cublas);
  cublasSetStream(f.cublas, f.stream);
  (void)f.ws.Allocate(32u << 20);
  cublasSetWorkspace(f.cublas, f.ws.get(), f.ws.bytes());
  if (impl == Impl::kWgmma) {
    (void)f.wgmma_ws.Allocate(kernels::WgmmaGemmWorkspaceBytes(f.sms));
    cudaMemset(f.wgmma_ws.get(), 0, f.wgmma_ws.bytes());
  }
  if (impl == Impl::kCublasArgmax || impl == Impl::kWgmmaArgmax || impl == Impl::kPromptArgmax) {
    (void)f.best.Allocate(
        std::max({kernels::ArgmaxScratchBytes(m), kernels::WgmmaArgmaxScratchBytes(m, s.n),
                  kernels::PromptArgmaxScratchBytes(m, s.n)}));
    (void)f.picks.Allocate(static_cast<size_t>(m) * 4);
    (void)f.store.Allocate(4);
    cudaMemset(f.store.get(), 0, 4);  // greedy rows only: no logits stored
  }
  cudaEventCreate(&f.ev[0]);
  cudaEventCreate(&f.ev[1]);
  if (impl == Impl::kLt) {
    // The heuristic's candidates for this shape; `splits` picks one (0 is
    // the heuristic's first choice).
    cublasLtCreate(&f.lt);
    cublasLtMatmulDescCreate(&f.op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    cublasLtMatmulDescSetAttribute(f.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta));
    cublasLtMatmulDescSetAttribute(f.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb));
    cublasLtMatrixLayoutCreate(&f.la, CUDA_R_16BF, s.k, s.n, s.k);
    cublasLtMatrixLayoutCreate(&f.lb, CUDA_R_16BF, s.k, m, s.k);
    cublasLtMatrixLayoutCreate(&f.lc, out_f32 ? CUDA_R_32F : CUDA_R_16BF, s.n, m, s.n);
    cublasLtMatmulPreference_t pref = nullptr;
    cublasLtMatmulPreferenceCreate(&pref);
    const size_t wsb = f.ws.bytes();
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb,
                                         sizeof(wsb));
    cublasLtMatmulHeuristicResult_t res[32];
    int found = 0;
    cublasLtMatmulAlgoGetHeuristic(f.lt, f.op, f.la, f.lb, f.lc, f.lc, pref, 32, res, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    if (splits >= found) {
      state.SkipWithError("no such candidate");
      return;
    }
    f.algo = res[splits].algo;
    int tile = 0, sk = 0;
    cublasLtMatmulAlgoConfigGetAttribute(&f.algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof(tile),
                                         nullptr);
    cublasLtMatmulAlgoConfigGetAttribute(&f.algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &sk, sizeof(sk),
                                         nullptr);
    state.counters["tile"] = tile;
    state.counters["splitk"] = sk;
    state.counters["found"] = found;
  }
  constexpr int kLaunches = 50;
  size_t next = 0;
  auto launch = [&]() -> bool {
    const auto* w = f.w[next++ % copies].get<kernels::bf16_t>();
    const auto* x = f.x.get<kernels::bf16_t>();
    if (impl == Impl::kSkinny)
      return LaunchSkinnyGemm(x, w, f.y.get(), true, m, s.n, s.k, 0.f, f.sms, f.stream, splits) ==
             cudaSuccess;
    if (impl == Impl::kWgmma) {
      // splits: 0 for the default plan, else WgmmaPlanOf's code; < 0: the
      // default plan's split planes.
      const kernels::WgmmaGemmPlan plan = WgmmaPlanOf(splits > 0 ? splits : 0);
      const bool planes = splits < 0;
      return LaunchWgmmaGemm(x, w, f.y.get(), true, m, s.n, s.k, 0.f, {f.wgmma_ws.get(), f.sms},
                             f.stream, -1, planes, plan) == cudaSuccess;
    }
    if (impl == Impl::kWgmmaArgmax)
      return LaunchWgmmaGemmArgmax(x, w, f.y.get<float>(), f.store.get<int32_t>(), m, s.n, s.k,
                                   f.best.get(), f.picks.get<int32_t>(), f.sms, f.stream,
                                   WgmmaPlanOf(splits)) == cudaSuccess;
    if (impl == Impl::kPromptArgmax)
      return kernels::LaunchPromptGemmArgmax(x, w, f.y.get<float>(), f.store.get<int32_t>(), m, s.n,
                                             s.k, f.best.get(), f.picks.get<int32_t>(), f.sms,
                                             f.stream) == cudaSuccess;
    if (impl == Impl::kPromptAdd)
      return dev::LaunchPromptGemmAdd(x, w, f.y.get<float>(), m, s.n, s.k, f.sms, f.stream) ==
             cudaSuccess;
    if (impl == Impl::kPrompt || impl == Impl::kPromptGated)
      return kernels::LaunchPromptGemm(x, w, f.y.get<kernels::bf16_t>(), m, s.n, s.k,
                                       impl == Impl::kPromptGated ? 0 : -1, f.sms,
                                       f.stream) == cudaSuccess;
    if (impl == Impl::kGemv)
      return kernels::LaunchGemv(x, w, f.y.get(), true, m, s.n, s.k, 0.f, f.sms, f.stream) ==
             cudaSuccess;
    const float alpha = 1.f;
    if (impl == Impl::kLt)
      return cublasLtMatmul(f.lt, f.op, &alpha, w, f.la, x, f.lb, &beta, f.y.get(), f.lc, f.y.get(),
                            f.lc, &f.algo, f.ws.get(), f.ws.bytes(),
                            f.stream) == CUBLAS_STATUS_SUCCESS;
    if (cublasGemmEx(f.cublas, CUBLAS_OP_T, CUBLAS_OP_N, s.n, m, s.k, &alpha, w, CUDA_R_16BF, s.k,
                     x, CUDA_R_16BF, s.k, &beta, f.y.get(), out_f32 ? CUDA_R_32F : CUDA_R_16BF, s.n,
                     CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS)
      return false;
    if (impl == Impl::kCublasGated)
      return kernels::LaunchGatedAct(f.y.get<kernels::bf16_t>(), f.act.get<kernels::bf16_t>(), m,
                                     s.n / 2, 0, f.stream) == cudaSuccess;
    return impl != Impl::kCublasArgmax ||
           kernels::LaunchArgmax(f.y.get<float>(), m, s.n, f.picks.get<int32_t>(), f.best.get(),
                                 f.stream) == cudaSuccess;
  };
  for (size_t i = 0; i < copies; ++i) launch();  // lazy loading, clocks
  cudaGraph_t graph = nullptr;
  bool ok = cudaStreamBeginCapture(f.stream, cudaStreamCaptureModeThreadLocal) == cudaSuccess;
  for (int i = 0; i < kLaunches && ok; ++i) ok = launch();
  ok = cudaStreamEndCapture(f.stream, &graph) == cudaSuccess && ok;
  ok = ok && cudaGraphInstantiate(&f.exec, graph, 0) == cudaSuccess;
  if (graph != nullptr) cudaGraphDestroy(graph);
  if (!ok || cudaStreamSynchronize(f.stream) != cudaSuccess) {
    state.SkipWithError("launch or capture failed");
    return;
  }
  for (auto _ : state) {
    cudaEventRecord(f.ev[0], f.stream);
    cudaGraphLaunch(f.exec, f.stream);
    cudaEventRecord(f.ev[1], f.stream);
    cudaEventSynchronize(f.ev[1]);
    float ms = 0;
    cudaEventElapsedTime(&ms, f.ev[0], f.ev[1]);
    state.SetIterationTime(ms / 1e3 / kLaunches);
  }
  state.counters["weight_GBps"] = benchmark::Counter(static_cast<double>(wbytes),
                                                     benchmark::Counter::kIsIterationInvariantRate);
  state.counters["TFLOPs"] =
      benchmark::Counter(2e-12 * m * s.n * s.k, benchmark::Counter::kIsIterationInvariantRate);
  if (impl == Impl::kWgmma) {
    const kernels::WgmmaGemmPlan p =
        splits > 0 ? WgmmaPlanOf(splits) : kernels::WgmmaGemmPlanFor(s.n, s.k, f.sms);
    state.counters["planes"] = splits < 0;
    state.counters["tile"] = p.tile;
    state.counters["splits"] = p.splits;
    state.counters["k128"] = p.k128;
  }
  if (impl == Impl::kSkinny)
    state.counters["splits"] = splits > 0 ? splits : SkinnyGemmSplits(s.n, s.k, f.sms);
}

bool WgmmaDevice() {
  cudaDeviceProp prop{};
  return cudaGetDeviceProperties(&prop, 0) == cudaSuccess && prop.major == 9 && prop.minor == 0;
}

int Register() {
  for (const Shape& s : kShapes) {
    for (int m : {1, 8, 16, 32, 64, 128, 256}) {
      // (128 and 256 rows: only the LM head's argmax forms.)
      if (m > 64 && std::string(s.name) != "lm_head") continue;
      const std::string base = std::string(s.name) + "/m" + std::to_string(m);
      auto reg = [&](const std::string& name, Impl impl, int splits) {
        benchmark::RegisterBenchmark(name.c_str(),
                                     [=](benchmark::State& st) { Run(st, s, m, impl, splits); })
            ->UseManualTime()
            ->Iterations(20)
            ->Unit(benchmark::kMicrosecond);
      };
      if (SkinnyGemmSupported(m, s.n, s.k)) reg(base + "/skinny", Impl::kSkinny, 0);
      for (int sp : {1, 2, 4, 8})
        if (SkinnyGemmSupported(m, s.n, s.k) && sp <= s.k / 128)
          reg(base + "/skinny_split" + std::to_string(sp), Impl::kSkinny, sp);
      reg(base + "/cublas", Impl::kCublas, 0);
      if (kernels::WgmmaGemmSupported(m, s.n, s.k) && WgmmaDevice()) {
        reg(base + "/wgmma", Impl::kWgmma, 0);
        reg(base + "/wgmma_planes", Impl::kWgmma, -1);
        for (int tile : {64, 128})
          for (int sp : {1, 2, 4, 8, 16})
            for (int k128 : {0, 1})
              if (s.n % tile == 0)
                reg(base + "/wgmma_t" + std::to_string(tile) + "_s" + std::to_string(sp) +
                        (k128 ? "_k128" : ""),
                    Impl::kWgmma, tile * 1000 + sp * 10 + k128);
      }
      if (std::string(s.name) == "lm_head") {
        reg(base + "/cublas_argmax", Impl::kCublasArgmax, 0);
        if (m >= 8 && kernels::PromptGemmSupported(m, s.n, s.k))
          reg(base + "/prompt_argmax", Impl::kPromptArgmax, 0);
        if (kernels::WgmmaGemmSupported(m, s.n, s.k) && WgmmaDevice()) {
          reg(base + "/wgmma_argmax", Impl::kWgmmaArgmax, 0);
          reg(base + "/wgmma_argmax_t128", Impl::kWgmmaArgmax, 128 * 1000 + 10 + 1);
        }
      }
      for (int a = 0; a < 24; ++a) reg(base + "/lt" + std::to_string(a), Impl::kLt, a);
      if (kernels::GemvSupported(m, s.k)) reg(base + "/gemv", Impl::kGemv, 0);
    }
    // A full prompt step's GEMMs (8,192 rows): is cuBLAS's default choice
    // the fastest of its heuristic's candidates?
    if (std::string(s.name) == "lm_head") continue;
    for (int m : {128, 256, 512, 2048, 8192}) {
      const std::string base = std::string("prefill/") + s.name + "/m" + std::to_string(m);
      auto reg = [&](const std::string& name, Impl impl, int splits) {
        benchmark::RegisterBenchmark(
            name.c_str(), [=](benchmark::State& st) { Run(st, s, m, impl, splits, true); })
            ->UseManualTime()
            ->Iterations(5)
            ->Unit(benchmark::kMicrosecond);
      };
      // (Under 2,048 rows only gate_up's two forms: where the backend
      // switches from cuBLAS and the activation kernel to the prompt GEMM.)
      if (m < 2048) {
        if (std::string(s.name) != "gate_up") continue;
        reg(base + "/cublas_gated", Impl::kCublasGated, 0);
        if (kernels::PromptGemmSupported(m, s.n, s.k))
          reg(base + "/prompt_gated", Impl::kPromptGated, 0);
        continue;
      }
      reg(base + "/cublas", Impl::kCublas, 0);
      const bool bf16_out = std::string(s.name) == "qkv" || std::string(s.name) == "gate_up";
      if (kernels::PromptGemmSupported(m, s.n, s.k))
        reg(base + "/prompt", bf16_out ? Impl::kPrompt : Impl::kPromptAdd, 0);
      if (std::string(s.name) == "gate_up") {
        reg(base + "/cublas_gated", Impl::kCublasGated, 0);
        if (kernels::PromptGemmSupported(m, s.n, s.k))
          reg(base + "/prompt_gated", Impl::kPromptGated, 0);
      }
      for (int a = 0; a < 24; ++a) reg(base + "/lt" + std::to_string(a), Impl::kLt, a);
    }
  }
  return 0;
}
const int registered = Register();

}  // namespace
}  // namespace agentkv::backend::cuda
#endif  // AGENTKV_HAVE_CUDA
