// The arithmetic of a quantized conv2d / linear (issue 13; docs/quantization.md
// "CPU emulation"), shared by the plain reference and the optimized CPU
// kernels so both compute the same bits.
//
// acc = sum over the reduction (input channels x kernel taps) of code_x *
// code_w. Every e4m3 code is a multiple of 2^-9 below 2^9 and every i8 code an
// integer below 2^7 in magnitude, so each product is exact and so is the sum
// in double while the reduction is shorter than kMaxExactReduction: the sum
// is the exact real number whatever the order, rounded once to f32. Then,
// per output channel oc:
//   wide output:  y = act(fma(f32(acc), alpha[oc], bias[oc]) + residual)
//   (an 8-bit residual counts as f32(code * s_r), its real value)
//   8-bit output, act none/relu (the output scale folded, ReLU commutes with
//   a positive scale): y = encode(act(fma(f32(acc), alpha'[oc], bias'[oc]) +
//   residual * inv_s_y))
//   8-bit output, other act: y = encode(act(fma(...) + residual) * inv_s_y)
// with alpha = f32(s_x * s_w[oc]), inv_s_y = f32(1 / s_y), alpha' = f32(alpha
// * inv_s_y), bias' = f32(bias * inv_s_y); encode rounds to nearest even into
// e4m3 saturating at 448 (or i8, [-128, 127]). Activations in f32 (apply_activation).
#pragma once
#include <cstdint>
#include <vector>

#include "ir/graph.hpp"
#include "quant/fp8.hpp"

namespace kiln::quant {

// 2^17: with |code products| < 2^18 in units of 2^-18 (e4m3), a sum of fewer
// terms stays below 2^53 units, exact in double (i8: below 2^31 too, so it is
// also what an int32 accumulator holds).
inline constexpr int64_t kMaxExactReduction = int64_t{1} << 17;

struct LayerEpilogue {
  DType out = DType::F32;  // the node's output dtype: a wide float or the code type
  bool folded = false;     // output scale folded into alpha and bias
  Activation act = Activation::None;
  std::vector<float> alpha, bias;  // per output channel (bias 0 where the node has none)
  float inv_out_scale = 1.f;       // 8-bit output: f32(1 / s_y)
  float residual_mul = 1.f;        // inv_out_scale when folded, else 1
  float residual_scale = 1.f;      // an 8-bit residual's scale (its buffer holds codes), else 1
  // The stored value of output channel oc given the exact sum `acc` and the
  // residual as stored (null without one: the real value, or for an 8-bit
  // residual its code's value, times residual_scale in f32): the code's value in code units for
  // an 8-bit output, else the real value (the caller rounds to f16/bf16).
  float apply(int64_t oc, double acc, const float* residual) const;
};

// The epilogue of quantized layer n (ir/quant_form.hpp: its scales checked);
// `bias` the node's bias values at storage precision, or null. Throws
// Error(Input) naming the node when the reduction is too long to be exact.
LayerEpilogue layer_epilogue(const Graph& g, const Node& n, const float* bias);

}  // namespace kiln::quant
