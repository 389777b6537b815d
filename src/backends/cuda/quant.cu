// 8-bit kernels of the CUDA backend (issue 13; docs/cuda-backend.md "FP8",
// "INT8"): quantize and dequantize (e4m3 or i8) with per-tensor or per-channel scales, the
// zero padding of FP8 rows to the 16-element multiples the FP8 GEMM and conv
// engines need, and the epilogue of a quantized layer applied to the raw f32
// sum the GEMM or conv engine wrote. Every formula is the CPU emulation's
// (quant/layer.hpp, backends/cpu/ref/quant.cpp) with contraction ruled out
// (__fmul_rn / __fadd_rn), so the only difference left is the engine's
// accumulation order and precision.
#include "backends/cuda/device_common.cuh"
#include "backends/cuda/kernels.hpp"
#include "backends/cuda/quant_int8.hpp"

namespace kiln::cuda {
namespace {

using dev::from_f32;
using dev::to_f32;

// A raw sum as f32: cuBLASLt/cuDNN f32 sums as they are; i8 engines' exact
// int32 sums rounded once to f32 (the CPU's f32(acc) of the exact sum).
__device__ __forceinline__ float acc_f32(float a) { return a; }
__device__ __forceinline__ float acc_f32(int32_t a) { return __int2float_rn(a); }

// The scale index of flat stored index i: (i / inner) % extent (extent 1: per tensor).
__device__ __forceinline__ int64_t scale_index(int64_t i, int64_t inner, int64_t extent) {
  return extent == 1 ? 0 : (i / inner) % extent;
}

// y = round_To(x * scales[...]) with one f32 multiply (no contraction):
// quantize (To e4m3, the inverse scales: code = encode(x * f32(1 / scale)),
// as the CPU's quantize_value) and dequantize (x the codes: f32(code *
// scale), then To's rounding) are the same map.
template <typename Ti, typename To>
__global__ void scale_map_kernel(const Ti* __restrict__ x, To* __restrict__ y, int64_t count, const float* __restrict__ scales,
                                 int64_t inner, int64_t extent) {
  dev::enter_grid();
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride)
    y[i] = from_f32<To>(__fmul_rn(to_f32(x[i]), scales[scale_index(i, inner, extent)]));
}

// Each thread keeps one column (dev::row_walk: no division per element;
// launched with detail::grid_rows), as the epilogue below.
__global__ void pad_rows_kernel(const uint8_t* __restrict__ x, int64_t rows, int cols, uint8_t* __restrict__ y,
                                int y_cols) {
  dev::enter_grid();
  dev::RowWalk w;
  if (!dev::row_walk(uint32_t(y_cols), w)) return;
  const int c = int(w.col);
  for (int64_t r = w.row; r < rows; r += w.step) y[r * y_cols + c] = c < cols ? x[r * cols + c] : uint8_t(0);
}

// A residual element's real value: wide as stored, e4m3 as f32(code * scale)
// (quant::LayerEpilogue::apply's residual_scale; 1 for wide residuals).
__device__ __forceinline__ float load_residual(const void* p, int64_t i, DType dt, float scale) {
  switch (dt) {
    case DType::F16: return to_f32(static_cast<const __half*>(p)[i]);
    case DType::BF16: return to_f32(static_cast<const __nv_bfloat16*>(p)[i]);
    case DType::F8E4M3: return __fmul_rn(to_f32(static_cast<const __nv_fp8_e4m3*>(p)[i]), scale);
    case DType::I8: return __fmul_rn(float(static_cast<const int8_t*>(p)[i]), scale);
    default: return static_cast<const float*>(p)[i];
  }
}

// y[r, c] = epilogue of acc[r * acc_ld + c] (quant/layer.hpp's LayerEpilogue::apply).
template <typename Acc, typename Out, Activation A>
__global__ void quant_epilogue_kernel(const Acc* __restrict__ acc, int acc_ld, QuantEpilogue e, const void* residual,
                                      DType rdt, Out* __restrict__ y, int64_t rows, int k) {
  dev::enter_grid();
  dev::RowWalk w;
  if (!dev::row_walk(uint32_t(k), w)) return;
  const int c = int(w.col);
  const float alpha = e.alpha[c], bias = e.bias[c];  // once per thread: its column is fixed
  for (int64_t r = w.row; r < rows; r += w.step) {
    const int64_t i = r * k + c;
    float v = fmaf(acc_f32(acc[r * acc_ld + c]), alpha, bias);
    if (residual) v = __fadd_rn(v, __fmul_rn(load_residual(residual, i, rdt, e.residual_scale), e.residual_mul));
    v = dev::act<A>(v);
    if (e.scale_after) v = __fmul_rn(v, e.inv_out_scale);
    y[i] = from_f32<Out>(v);
  }
}

}  // namespace

namespace {

// code = encode(x * inv_scale) into Code (e4m3 or i8), x any float type.
template <typename Code>
void launch_quantize(const char* op, const void* x, DType xdt, void* y, int64_t count, const float* inv_scales, int64_t inner,
                     int64_t extent, cudaStream_t stream) {
  if (count <= 0) return;
  detail::dispatch_float(xdt, op, [&](auto t) {
    using T = decltype(t);
    detail::launch(op, scale_map_kernel<T, Code>, detail::grid_for(count), detail::kThreads, 0, stream, static_cast<const T*>(x),
                   static_cast<Code*>(y), count, inv_scales, inner, extent);
  });
}

// y = f32(code * scale) rounded to ydt.
template <typename Code>
void launch_dequantize(const char* op, const void* x, void* y, DType ydt, int64_t count, const float* scales, int64_t inner,
                       int64_t extent, cudaStream_t stream) {
  if (count <= 0) return;
  detail::dispatch_float(ydt, op, [&](auto t) {
    using T = decltype(t);
    detail::launch(op, scale_map_kernel<Code, T>, detail::grid_for(count), detail::kThreads, 0, stream,
                   static_cast<const Code*>(x), static_cast<T*>(y), count, scales, inner, extent);
  });
}

}  // namespace

void quantize_e4m3(const void* x, DType xdt, void* y, int64_t count, const float* inv_scales, int64_t inner,
                   int64_t extent, cudaStream_t stream) {
  launch_quantize<__nv_fp8_e4m3>("quantize_e4m3", x, xdt, y, count, inv_scales, inner, extent, stream);
}

void dequantize_e4m3(const void* x, void* y, DType ydt, int64_t count, const float* scales, int64_t inner, int64_t extent,
                     cudaStream_t stream) {
  launch_dequantize<__nv_fp8_e4m3>("dequantize_e4m3", x, y, ydt, count, scales, inner, extent, stream);
}

void pad_rows_u8(const void* x, int64_t rows, int cols, void* y, int y_cols, cudaStream_t stream) {
  if (rows <= 0) return;
  if (cols > y_cols) fail_runtime("cuda pad_rows_u8: ", cols, " columns do not fit in ", y_cols);
  detail::launch("pad_rows_u8", pad_rows_kernel, detail::grid_rows(rows, y_cols), detail::kThreads, 0, stream,
                 static_cast<const uint8_t*>(x), rows, cols, static_cast<uint8_t*>(y), y_cols);
}

namespace {


template <typename Acc>
void launch_quant_epilogue(const char* op, const Acc* acc, int acc_ld, const QuantEpilogue& e, const void* residual, DType rdt,
                           void* y, DType ydt, int64_t rows, int k, cudaStream_t stream) {
  if (rows <= 0 || k <= 0) return;
  if (acc_ld < k) fail_runtime("cuda ", op, ": leading dimension ", acc_ld, " below ", k, " channels");
  if (residual && !(rdt == DType::F32 || rdt == DType::F16 || rdt == DType::BF16 || rdt == DType::F8E4M3 || rdt == DType::I8))
    fail_runtime("cuda ", op, ": residual of ", dtype_name(rdt), " (f32, f16, bf16, or e4m3 / i8 codes)");
  detail::dispatch_storage(ydt, op, [&](auto t) {  // the wide floats, e4m3 and i8 codes
    using Out = decltype(t);
    detail::dispatch_act(e.act, [&](auto a) {
      detail::launch(op, quant_epilogue_kernel<Acc, Out, decltype(a)::value>, detail::grid_rows(rows, k), detail::kThreads, 0,
                     stream, acc, acc_ld, e, residual, rdt, static_cast<Out*>(y), rows, k);
    });
  });
}

}  // namespace

void quant_epilogue(const float* acc, int acc_ld, const QuantEpilogue& e, const void* residual, DType rdt, void* y,
                    DType ydt, int64_t rows, int k, cudaStream_t stream) {
  launch_quant_epilogue("quant_epilogue", acc, acc_ld, e, residual, rdt, y, ydt, rows, k, stream);
}

void quant_epilogue_i32(const int32_t* acc, int acc_ld, const QuantEpilogue& e, const void* residual, DType rdt, void* y,
                        DType ydt, int64_t rows, int k, cudaStream_t stream) {
  launch_quant_epilogue("quant_epilogue_i32", acc, acc_ld, e, residual, rdt, y, ydt, rows, k, stream);
}

void quantize_i8(const void* x, DType xdt, void* y, int64_t count, const float* inv_scales, int64_t inner, int64_t extent,
                 cudaStream_t stream) {
  launch_quantize<int8_t>("quantize_i8", x, xdt, y, count, inv_scales, inner, extent, stream);
}

void dequantize_i8(const void* x, void* y, DType ydt, int64_t count, const float* scales, int64_t inner, int64_t extent,
                   cudaStream_t stream) {
  launch_dequantize<int8_t>("dequantize_i8", x, y, ydt, count, scales, inner, extent, stream);
}

}  // namespace kiln::cuda
