// Internal to kiln's sm90 conv (conv_sm90.hpp): the table of tile
// configurations that the CUTLASS translation units (conv_sm90_<tile>.cu,
// built for sm_90a only with CUTLASS's headers: KILN_HAVE_CUTLASS) define and
// the dispatcher (conv_sm90.cpp) walks. Plain C++, no CUTLASS.
#pragma once
#include <cuda_runtime_api.h>

#include <string>

#include "backends/cuda/kernels.hpp"
#include "core/activation.hpp"

namespace kiln::cuda::convsm90 {

// One call, checked by the dispatcher (dtype, channels, activation, device)
// before it reaches a configuration.
struct Problem {
  IgemmConvShape s{};
  const void* x = nullptr;         // [n, h, w, c] f16
  const void* w = nullptr;         // [k, r, s, c] f16
  const void* bias = nullptr;      // [k] f16, or null
  const void* residual = nullptr;  // [n, out_h, out_w, k] f16, or null
  void* y = nullptr;               // [n, out_h, out_w, k] f16
  Activation act = Activation::None;
  cudaStream_t stream = nullptr;
  bool pdl = false;                // launch with programmatic stream serialization
};

struct Config {
  const char* name;  // the tactic name: "kiln sm90 conv 128x64x64"
  int tile_m, tile_n, tile_k;
  // "" when CUTLASS's can_implement takes p (with or without its residual), else why not.
  std::string (*unsupported)(const Problem& p);
  // Runs the kernel; throws (fail_runtime) naming the config.
  void (*run)(const Problem& p);
};

#if defined(KILN_HAVE_CUTLASS)
extern const Config kConv64x32x64;
extern const Config kConv64x64x64;
extern const Config kConv128x64x64;
extern const Config kConv64x128x64;
extern const Config kConv128x32x32;
extern const Config kConv128x64x32;
#endif

}  // namespace kiln::cuda::convsm90
