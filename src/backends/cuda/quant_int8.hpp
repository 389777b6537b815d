// INT8 kernels of the CUDA backend (issue 13; docs/cuda-backend.md "INT8"),
// beside the FP8 ones of kernels.hpp: quantize / dequantize of i8 codes and
// the quantized layer's epilogue over the exact int32 sums that cuBLASLt's
// and cuDNN's i8 engines write. Every formula is the CPU emulation's
// (quant/layer.hpp): the sums are exact integers rounded once to f32, so an
// INT8 layer gives the CPU's bits wherever its activation is computed with
// the same f32 operations (none, ReLU).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "backends/cuda/kernels.hpp"

namespace kiln::cuda {

// code = encode_i8(x * inv_scale): round half to even, clamp [-128, 127], NaN -> 0
// (activations' full range); scales walked as quantize_e4m3's.
void quantize_i8(const void* x, DType xdt, void* y, int64_t count, const float* inv_scales, int64_t inner, int64_t extent,
                 cudaStream_t stream);
// y = f32(code * scale), rounded to ydt.
void dequantize_i8(const void* x, void* y, DType ydt, int64_t count, const float* scales, int64_t inner, int64_t extent,
                   cudaStream_t stream);
// quant_epilogue over int32 raw sums (acc [rows, acc_ld]); y f32/f16/bf16,
// e4m3 or i8 codes; an i8 residual enters as f32(code * residual_scale).
void quant_epilogue_i32(const int32_t* acc, int acc_ld, const QuantEpilogue& e, const void* residual, DType rdt, void* y,
                        DType ydt, int64_t rows, int k, cudaStream_t stream);

}  // namespace kiln::cuda
