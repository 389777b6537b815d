// Error checking for CUDA, cuDNN and cuBLASLt calls: every failure becomes a
// kiln::Error(Runtime) naming the call, the library's message and the place.
#pragma once
#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include "core/error.hpp"

namespace kiln::cuda {

[[noreturn]] inline void throw_cuda(cudaError_t e, const char* what, const char* file, int line) {
  if (e == cudaErrorMemoryAllocation) cudaGetLastError();  // clear the sticky-free OOM so the context stays usable
  fail_runtime("CUDA error ", cudaGetErrorName(e), " (", cudaGetErrorString(e), ") in ", what, " at ", file, ":", line);
}
[[noreturn]] inline void throw_cudnn(cudnnStatus_t s, const char* what, const char* file, int line) {
  fail_runtime("cuDNN error ", cudnnGetErrorString(s), " in ", what, " at ", file, ":", line);
}
[[noreturn]] inline void throw_cublas(cublasStatus_t s, const char* what, const char* file, int line) {
  fail_runtime("cuBLAS error ", static_cast<int>(s), " in ", what, " at ", file, ":", line);
}

}  // namespace kiln::cuda

#define KILN_CUDA_CHECK(expr)                                                      \
  do {                                                                             \
    cudaError_t kiln_e_ = (expr);                                                  \
    if (kiln_e_ != cudaSuccess) ::kiln::cuda::throw_cuda(kiln_e_, #expr, __FILE__, __LINE__); \
  } while (0)
#define KILN_CUDNN_CHECK(expr)                                                     \
  do {                                                                             \
    cudnnStatus_t kiln_s_ = (expr);                                                \
    if (kiln_s_ != CUDNN_STATUS_SUCCESS) ::kiln::cuda::throw_cudnn(kiln_s_, #expr, __FILE__, __LINE__); \
  } while (0)
#define KILN_CUBLAS_CHECK(expr)                                                    \
  do {                                                                             \
    cublasStatus_t kiln_s_ = (expr);                                               \
    if (kiln_s_ != CUBLAS_STATUS_SUCCESS) ::kiln::cuda::throw_cublas(kiln_s_, #expr, __FILE__, __LINE__); \
  } while (0)
