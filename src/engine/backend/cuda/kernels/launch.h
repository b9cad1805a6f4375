// What every kernel launcher of this folder shares. The launchers sit
// behind plain functions (one header per op family, named after its .cu
// file) so that host code (the backend, tests) needs no CUDA compiler.
// Every pointer is a device pointer unless said otherwise; bf16 values
// travel as uint16_t (the raw bfloat16 bits). Each launcher enqueues on
// `stream` and returns the launch error (not the kernel's outcome: that
// shows at the next synchronisation). None allocates, so all may be
// captured in CUDA graphs. Kernel choices made for comparison (CudaTuning)
// come in as arguments, except programmatic dependent launch
// (SetPdlLaunches). The CPU references are
// engine/backend/cpu/cpu_kernels.h.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace agentkv::cuda {

using bf16_t = uint16_t;

// Whether launchers launch with programmatic dependent launch (pdl.cuh)
// where the device has it (sm_90+): on until set otherwise. Process-wide,
// for every launcher (CudaBackend::Create sets it from CudaTuning::pdl);
// launches read it as they are made, graphs keep what they were captured
// with. Thread-safe.
void SetPdlLaunches(bool on);

}  // namespace agentkv::cuda
