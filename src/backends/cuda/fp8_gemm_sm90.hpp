// kiln's own 8-bit GEMM for Hopper (sm_90a), FP8 and (session 17) INT8: y[m, n] = epilogue(x[m, k] .
// w[n, k]^T) in one kernel, the quantized layer's whole epilogue (per-channel
// alpha and bias, residual, ReLU, output scale, e4m3 or f16 store) applied to
// the accumulators before the only store. Built on CUTLASS 3.x (TMA,
// warp-specialized wgmma mainloop, an epilogue visitor tree): cuBLASLt's FP8
// GEMM writes at most a bias + ReLU epilogue with one scale per tensor, not
// per-channel alphas, so with it the layer costs a second kernel over an f32
// scratch (quant.cpp's quant_epilogue) — that pass is what this removes.
//
// x and w are codes of one type (each configuration multiplies one: e4m3 with
// f32 accumulation, or i8 with exact int32 sums), row-major, k a multiple of
// 16; n a multiple of 16 (the TMA store's alignment); residual [m, n] f16 or
// codes of that type (decoded as f32(code * residual_scale)) or null; y f16 or
// codes (e4m3 saturating; i8 rounded half to even and clamped to [-128, 127]).
// Every epilogue operation is quant_epilogue's (no contraction): for e4m3 only
// the accumulation order differs, for i8 nothing (the int32 sum is exact). Without CUTLASS's headers at build
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

// Whether the current device is compute capability 9.0, the only one kiln's
// sm_90a kernels (wgmma, setmaxnreg: this GEMM and conv_sm90.hpp's conv) run on.
bool device_is_sm90();

// Tile configurations compiled in (0 without CUTLASS), their names
// ("cutlass sm90 fp8 128x128x128 c1x1 coop", ...: the tactic names) and codes.
int fp8_gemm_sm90_configs();
const char* fp8_gemm_sm90_config_name(int cfg);
DType fp8_gemm_sm90_config_code(int cfg);  // f8e4m3 or i8
// "" when configuration cfg runs this problem (codes `code`) on the current
// device, otherwise why not (codes, shape, dtype, activation or device).
std::string fp8_gemm_sm90_unsupported(int cfg, DType code, int64_t m, int n, int k, bool residual, DType rdt, DType ydt,
                                      Activation act);
size_t fp8_gemm_sm90_workspace(int cfg, int m, int n, int k);
void fp8_gemm_sm90(int cfg, DType code, const void* x, const void* w, const QuantEpilogue& e, const void* residual, DType rdt,
                   void* y, DType ydt, int m, int n, int k, void* workspace, size_t workspace_bytes, cudaStream_t stream);

}  // namespace kiln::cuda
