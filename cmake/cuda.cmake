# ---- CUDA backend (issue 7) --------------------------------------------------
# Included from CMakeLists.txt once the libraries it links exist (backend
# interface, model, cache, util). Finds nvcc on
# its own (CUDACXX, PATH, or /usr/local/cuda/bin/nvcc); without a toolkit, or
# with -DAGENTKV_CUDA=OFF, src/engine/backend/cuda is not built and
# `--device cuda` says the build has no CUDA backend.
# Sanitizer builds default to no CUDA (AUTO), to keep their compile time down.
#
# With CUDA: the .cu kernels (src/engine/backend/cuda/kernels) form
# agentkv_cuda_kernels (built for sm_90 by default, CMAKE_CUDA_ARCHITECTURES
# overrides) and agentkv_cuda_sm90a (the wgmma kernels); the host code in
# src/engine/backend/cuda/*.cc is agentkv_backend_cuda, which links cudart,
# cublas, cublasLt and nccl dynamically from the toolkit and defines
# AGENTKV_HAVE_CUDA for everything that links it.
set(AGENTKV_CUDA AUTO CACHE STRING "Build the CUDA backend: AUTO, ON or OFF")
set_property(CACHE AGENTKV_CUDA PROPERTY STRINGS AUTO ON OFF)

set(AGENTKV_HAVE_CUDA OFF)
set(_agentkv_want_cuda ON)
if(AGENTKV_CUDA STREQUAL "OFF")
  set(_agentkv_want_cuda OFF)
elseif(AGENTKV_CUDA STREQUAL "AUTO" AND (AGENTKV_SANITIZE OR AGENTKV_TSAN))
  set(_agentkv_want_cuda OFF)
endif()

if(_agentkv_want_cuda)
  if(NOT CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX})
    find_program(_agentkv_nvcc nvcc PATHS /usr/local/cuda/bin NO_CACHE)
    if(_agentkv_nvcc)
      set(CMAKE_CUDA_COMPILER ${_agentkv_nvcc})
    endif()
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES 90)
    endif()
    set(CMAKE_CUDA_STANDARD 17)  # CMake 3.25 knows no CUDA20 flags for nvcc; kernels need C++17
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    set(CMAKE_CUDA_RUNTIME_LIBRARY Shared)
    if(CCACHE_PROGRAM)
      set(CMAKE_CUDA_COMPILER_LAUNCHER ${CCACHE_PROGRAM})
    endif()
    enable_language(CUDA)
    find_package(CUDAToolkit)
    if(CUDAToolkit_FOUND)
      set(AGENTKV_HAVE_CUDA ON)
    endif()
  endif()
  if(NOT AGENTKV_HAVE_CUDA AND AGENTKV_CUDA STREQUAL "ON")
    message(FATAL_ERROR "AGENTKV_CUDA=ON but no CUDA toolkit was found")
  endif()
endif()

if(AGENTKV_HAVE_CUDA)
  message(STATUS "agentkv: CUDA backend ON (nvcc ${CMAKE_CUDA_COMPILER_VERSION}, "
                 "architectures ${CMAKE_CUDA_ARCHITECTURES})")
  file(GLOB _agentkv_cu CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/src/engine/backend/cuda/kernels/*.cu)
  # Kernels with Hopper-only instructions (wgmma) are built for sm_90a alone,
  # in their own library; the backend calls them on compute capability 9.0.
  set(_agentkv_cu_sm90a ${_agentkv_cu})
  list(FILTER _agentkv_cu_sm90a INCLUDE REGEX "/wgmma_[^/]*\\.cu$")
  list(FILTER _agentkv_cu EXCLUDE REGEX "/wgmma_[^/]*\\.cu$")
  add_library(agentkv_cuda_kernels STATIC ${_agentkv_cu})
  # The directory's compile options (-mavx2, -Wall for g++) are not nvcc's:
  # replace them for the kernels.
  set_target_properties(agentkv_cuda_kernels PROPERTIES COMPILE_OPTIONS "")
  target_compile_options(agentkv_cuda_kernels PRIVATE
    -Xcompiler=-Wall,-Wextra -lineinfo --expt-relaxed-constexpr)
  target_include_directories(agentkv_cuda_kernels PUBLIC ${CMAKE_SOURCE_DIR}/src)
  target_link_libraries(agentkv_cuda_kernels PUBLIC CUDA::cudart)
  add_library(agentkv_cuda_sm90a STATIC ${_agentkv_cu_sm90a})
  set_target_properties(agentkv_cuda_sm90a PROPERTIES COMPILE_OPTIONS "" CUDA_ARCHITECTURES 90a)
  target_compile_options(agentkv_cuda_sm90a PRIVATE
    -Xcompiler=-Wall,-Wextra -lineinfo --expt-relaxed-constexpr)
  target_include_directories(agentkv_cuda_sm90a PUBLIC ${CMAKE_SOURCE_DIR}/src)
  target_link_libraries(agentkv_cuda_sm90a PUBLIC agentkv_cuda_kernels)
  # LaunchAttention (sm_90) dispatches prompt steps to the warpgroup
  # attention (sm_90a): the two static libraries refer to each other.
  target_link_libraries(agentkv_cuda_kernels PUBLIC agentkv_cuda_sm90a)
  # The host code (src/engine/backend/cuda/*.cc): CudaBackend over the kernels.
  file(GLOB _agentkv_cuda_host CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/src/engine/backend/cuda/*.cc)
  # (step_plan.cc and gemm_plan.cc are their own library, agentkv_cuda_step_plan,
  # built without CUDA too.)
  list(REMOVE_ITEM _agentkv_cuda_host ${CMAKE_SOURCE_DIR}/src/engine/backend/cuda/step_plan.cc
       ${CMAKE_SOURCE_DIR}/src/engine/backend/cuda/gemm_plan.cc)
  add_library(agentkv_backend_cuda STATIC ${_agentkv_cuda_host})
  target_include_directories(agentkv_backend_cuda PUBLIC ${CMAKE_SOURCE_DIR}/src)
  target_link_libraries(agentkv_backend_cuda PUBLIC agentkv_cuda_step_plan agentkv_backend agentkv_model agentkv_cache
                        agentkv_util agentkv_cuda_sm90a agentkv_cuda_kernels CUDA::cudart
                        CUDA::cublas CUDA::cublasLt)
  # NCCL (tensor parallelism over the GPUs of a host), where the toolkit or
  # the system has it: NVIDIA ships it apart from the toolkit, so without it
  # agentkv builds and runs one GPU, and --tensor-parallel > 1 says why not.
  find_library(AGENTKV_NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR})
  find_path(AGENTKV_NCCL_INCLUDE nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
  if(AGENTKV_NCCL_LIBRARY AND AGENTKV_NCCL_INCLUDE)
    target_include_directories(agentkv_backend_cuda PRIVATE ${AGENTKV_NCCL_INCLUDE})
    target_link_libraries(agentkv_backend_cuda PUBLIC ${AGENTKV_NCCL_LIBRARY})
    target_compile_definitions(agentkv_backend_cuda PRIVATE AGENTKV_HAVE_NCCL=1)
    message(STATUS "agentkv: NCCL ${AGENTKV_NCCL_LIBRARY} (tensor parallelism)")
  else()
    target_compile_definitions(agentkv_backend_cuda PRIVATE AGENTKV_HAVE_NCCL=0)
    message(STATUS "agentkv: no NCCL found: tensor parallelism off")
  endif()
  target_compile_definitions(agentkv_backend_cuda PUBLIC AGENTKV_HAVE_CUDA=1)
else()
  message(STATUS "agentkv: CUDA backend OFF")
endif()
# ---- end CUDA backend ---------------------------------------------------------
