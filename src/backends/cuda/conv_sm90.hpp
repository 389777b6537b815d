// kiln's sm90 conv (switch sm90_conv): a dense f16 NHWC conv
//   y = act(conv(x, w) + bias + residual)
// as one CUTLASS 3.x implicit-GEMM kernel for Hopper (sm_90a): TMA im2col
// loads of x, TMA loads of the KRSC filter, a warp-specialized wgmma mainloop
// with f32 accumulation, and the conv layer's whole epilogue (bias, residual,
// activation) on the accumulators before one TMA store.
//
// Why: at batch 1 a detector backbone's convs leave cuDNN 9.14 far from the
// GPU's bound (RT-DETR v2 r18vd's 3x3 convs each do 1.9 GFLOP in 7-14 us on
// the H100; its stem convs 16-23 us, docs/cuda-backend.md), and kiln's own
// mma.sync implicit GEMM (igemm_conv.cu) lost every one of them: beating
// cuDNN there needs wgmma and TMA, which CUTLASS provides. cuDNN's kernels also
// cannot start before the previous kernel ends; this one is launched with the
// programmatic-dependent-launch attribute like kiln's own kernels (its load
// warp waits before the first load), so its launch and prologue overlap the
// previous step's tail.
//
// Tiles (M = output pixels, N = output channels, K = one tap's channel chunk):
// 64x32x64, 64x64x64, 128x64x64, 64x128x64, and 128x32x32 /
// 128x64x32 for 32-channel inputs (the stem). Each is a candidate of the conv
// selector, timed beside cuDNN's engine configs, recorded by name ("kiln sm90
// conv 128x64x64"). Without CUTLASS's headers at build (KILN_HAVE_CUTLASS) or
// off compute capability 9.0 there are no configurations.
#pragma once
#include <cuda_runtime_api.h>

#include <string>

#include "backends/cuda/kernels.hpp"
#include "core/activation.hpp"
#include "core/dtype.hpp"

namespace kiln::cuda {

// Tile configurations compiled in (0 without CUTLASS) and their tactic names.
int conv_sm90_configs();
const char* conv_sm90_config_name(int cfg);
// The configuration recorded under `name`, or -1.
int conv_sm90_config_of(const std::string& name);
// "" when configuration cfg runs this conv on the current device, otherwise
// why not (dtype, groups, channels, strides, activation, device, or CUTLASS's
// own can_implement). s.x_stride / s.y_stride: pixel strides (0: dense).
std::string conv_sm90_unsupported(int cfg, DType dt, const IgemmConvShape& s, bool residual, Activation act);
// Runs it (the checks above first: a refused conv throws naming the config).
// pdl: launch with the programmatic-dependent-launch attribute.
void conv_sm90_nhwc(int cfg, const void* x, const void* w_krsc, const void* bias, const void* residual, void* y, DType dt,
                    const IgemmConvShape& s, Activation act, bool pdl, cudaStream_t stream);

}  // namespace kiln::cuda
