// A producer kernel for the tests of the fence before an all-reduce from a
// symmetric window (nccl_windows_test.cc): the worst case of a kernel an
// NCCL symmetric all-reduce can follow. Built only into the tests that
// link agentkv_test_late_fill (CUDA builds).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "engine/backend/cuda/kernels/launch.h"

namespace agentkv::testing {

// x[i] = value for i < n, stored ~delay_ns nanoseconds after the kernel
// starts, by a kernel that lets its dependents launch at its start and
// waits for the kernel before it (as every backend kernel does,
// kernels/pdl.cuh), in few blocks so that a dependent's blocks fit beside
// it while it waits.
cudaError_t LaunchLateFill(float* x, int64_t n, float value, uint32_t delay_ns,
                           backend::cuda::kernels::LaunchConfig launch);

}  // namespace agentkv::testing
