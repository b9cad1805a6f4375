// CUDA and cuBLAS errors as Status values: what they map to and what the
// message names. Needs the CUDA runtime library, not a GPU.
#include "test_util.h"

#ifdef AGENTKV_HAVE_CUDA

namespace agentkv::backend::cuda {
namespace {

TEST(CudaStatus, OutOfMemoryIsResourceExhausted) {
  const Status s = cuda::CudaStatus(cudaErrorMemoryAllocation, "cudaMalloc(&p, n)", "f.cc", 7);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("cudaErrorMemoryAllocation"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find("cudaMalloc(&p, n) at f.cc:7"), std::string::npos) << s.ToString();
}

TEST(CudaStatus, OtherErrorsAreInternal) {
  EXPECT_EQ(cuda::CudaStatus(cudaErrorInvalidValue, "x", "f.cc", 1).code(), StatusCode::kInternal);
  EXPECT_EQ(cuda::CublasStatus(CUBLAS_STATUS_EXECUTION_FAILED, "x", "f.cc", 1).code(),
            StatusCode::kInternal);
}

}  // namespace
}  // namespace agentkv::backend::cuda

#else
TEST(CudaStatus, Skipped) { GTEST_SKIP() << "built without CUDA (no toolkit found)"; }
#endif
