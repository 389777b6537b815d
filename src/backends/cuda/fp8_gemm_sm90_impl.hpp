// Internal to the sm90 FP8 GEMM (fp8_gemm_sm90.hpp): the table of tile
// configurations that the CUTLASS translation units (fp8_gemm_sm90_*.cu, built
// for sm_90a only when CUTLASS's headers are there: KILN_HAVE_CUTLASS) define and
// the dispatcher (fp8_gemm_sm90.cpp) walks. Plain C++, no CUTLASS.
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "backends/cuda/quant_epilogue.hpp"  // not kernels.hpp: see quant_epilogue.hpp
#include "core/dtype.hpp"

namespace kiln::cuda::fp8sm90 {

// One call, checked by the dispatcher (shape, dtypes, activation) before it
// reaches a configuration.
struct Problem {
  const void* x = nullptr;         // [m, k] e4m3
  const void* w = nullptr;         // [n, k] e4m3
  const QuantEpilogue* e = nullptr;
  const void* residual = nullptr;  // [m, n] in rdt, or null
  DType rdt = DType::F16;
  void* y = nullptr;               // [m, n] in ydt
  DType ydt = DType::F16;
  int m = 0, n = 0, k = 0;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  cudaStream_t stream = nullptr;
};

struct Config {
  const char* name;
  DType code;  // the codes of x and w (and of an 8-bit residual or output): f8e4m3 or i8
  // The largest workspace any of the configuration's kernels (residual x
  // output dtype) asks for this shape.
  size_t (*workspace)(int m, int n, int k);
  // Runs the kernel for p's dtypes; throws (fail_runtime) naming the config.
  void (*run)(const Problem& p);
};

#if defined(KILN_HAVE_CUTLASS)
extern const Config kConfig128x128;
extern const Config kConfig128x64;
extern const Config kConfig128x256;
extern const Config kConfig128x128k64;
extern const Config kConfig128x64k64;
extern const Config kConfig128x256k64;
extern const Config kConfig128x64StreamK;
extern const Config kConfig128x128StreamK;
extern const Config kConfigI8x128x128;
extern const Config kConfigI8x128x64;
#endif

}  // namespace kiln::cuda::fp8sm90
