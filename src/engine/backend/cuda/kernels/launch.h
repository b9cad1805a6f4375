// What every kernel launcher of this folder shares. The launchers sit
// behind plain functions (one header per op family, named after its .cu
// file) so that host code (the backend, tests) needs no CUDA compiler.
// Every pointer is a device pointer unless said otherwise; bf16 values
// travel as uint16_t (the raw bfloat16 bits). Each launcher enqueues as its
// LaunchConfig says and returns the launch error (not the kernel's outcome:
// that shows at the next synchronisation). None allocates, so all may be
// captured in CUDA graphs. Kernel choices made for comparison (CudaTuning)
// come in as arguments, programmatic dependent launch among them
// (LaunchConfig::pdl). The CPU references are
// engine/backend/cpu/cpu_kernels.h.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace agentkv::backend::cuda::kernels {

using bf16_t = uint16_t;

// Where and how a launcher launches: on `stream`, with programmatic
// dependent launch (pdl.cuh) where `pdl` is set and the device has it
// (sm_90+; elsewhere plainly). A stream alone converts to a config with pdl
// on, so tests and benchmarks pass their stream; the backend passes
// CudaTuning::pdl with its stream. A captured graph keeps the launches it
// was captured with.
struct LaunchConfig {
  // (Implicit: a stream is a complete config.)
  LaunchConfig(cudaStream_t s = nullptr, bool p = true) : stream(s), pdl(p) {}  // NOLINT
  cudaStream_t stream;
  bool pdl;
};

}  // namespace agentkv::backend::cuda::kernels
