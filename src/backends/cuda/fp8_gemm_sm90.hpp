// kiln's own FP8 GEMM for Hopper (sm_90a): y[m, n] = epilogue(x[m, k] .
// w[n, k]^T) in one kernel, the quantized layer's whole epilogue (per-channel
// alpha and bias, residual, ReLU, output scale, e4m3 or f16 store) applied to
// the accumulators before the only store. Built on CUTLASS 3.x (TMA,
// warp-specialized wgmma mainloop, an epilogue visitor tree): cuBLASLt's FP8
// GEMM writes at most a bias + ReLU epilogue with one scale per tensor, not
// per-channel alphas, so with it the layer costs a second kernel over an f32
// scratch (quant.cpp's quant_epilogue) — that pass is what this removes.
//
// x and w are e4m3 codes, row-major, k a multiple of 16; n a multiple of 16
// (the TMA store's alignment); residual [m, n] f16 or e4m3 codes (decoded as
// f32(code * residual_scale)) or null; y f16 or e4m3 (saturating). Every
// epilogue operation is quant_epilogue's (no contraction): only the
// accumulation order differs. Without CUTLASS's headers at build
// (KILN_HAVE_CUTLASS) or off sm_90 there are no configurations.
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "backends/cuda/quant_epilogue.hpp"
#include "core/activation.hpp"
#include "core/dtype.hpp"

namespace kiln::cuda {

// Tile configurations compiled in (0 without CUTLASS) and their names
// ("cutlass sm90 fp8 128x128x128 c1x1 coop", ...), the tactic names.
int fp8_gemm_sm90_configs();
const char* fp8_gemm_sm90_config_name(int cfg);
// "" when configuration cfg runs this problem on the current device,
// otherwise why not (shape, dtype, activation or device).
std::string fp8_gemm_sm90_unsupported(int cfg, int64_t m, int n, int k, bool residual, DType rdt, DType ydt,
                                      Activation act);
size_t fp8_gemm_sm90_workspace(int cfg, int m, int n, int k);
void fp8_gemm_sm90(int cfg, const void* x, const void* w, const QuantEpilogue& e, const void* residual, DType rdt, void* y,
                   DType ydt, int m, int n, int k, void* workspace, size_t workspace_bytes, cudaStream_t stream);

}  // namespace kiln::cuda
