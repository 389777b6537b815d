// The constants of a quantized conv2d / linear's epilogue on the device
// (quant/layer.hpp's LayerEpilogue): per output channel c < k,
// v = fma(acc, alpha[c], bias[c]) (+ residual * residual_mul), act(v),
// (* inv_out_scale when scale_after), stored in the output type (e4m3: RNE,
// saturating; i8: RNE, clamped). Its own header so the CUTLASS GEMM's
// translation units (fp8_gemm_sm90_impl.hpp), minutes each to compile, do
// not depend on kernels.hpp.
#pragma once

#include "core/activation.hpp"

namespace kiln::cuda {

struct QuantEpilogue {
  const float* alpha = nullptr;  // device, [k]
  const float* bias = nullptr;   // device, [k] (zeros without a bias)
  float residual_mul = 1.f;
  float residual_scale = 1.f;  // an 8-bit residual: its scale (added as f32(code * scale) * residual_mul)
  float inv_out_scale = 1.f;
  bool scale_after = false;
  Activation act = Activation::None;
};

}  // namespace kiln::cuda
