// 8-bit codes and the scales that map them to real numbers (issue #13):
// real = code * scale, per tensor or per channel (ir/graph.hpp QuantParams).
// The bit-level fp8 conversions live in core/half (tensors and backends use
// them too); this module adds the code types, int8, scaled quantize and
// dequantize of values and buffers, and the weight scale rule.
// docs/quantization.md states every convention below with its source.
#pragma once
#include <cstdint>
#include <vector>

#include "core/dtype.hpp"
#include "core/tensor.hpp"
#include "ir/graph.hpp"

namespace kiln::quant {

// The code types a value may be quantized to: f8e4m3, f8e5m2, i8.
bool is_code_type(DType t);
// Largest finite magnitude of a code type: 448 (e4m3), 57344 (e5m2), 127 (i8).
// Throws Error(Usage) naming any other dtype.
float code_max(DType code);

// Symmetric int8 range. TensorRT quantizes weights to [-127, 127] and
// activations to [-128, 127] (its Q layer; ModelOpt's default narrow_range =
// false), always with scale = amax / 127; kiln follows it.
enum class Int8Range { Narrow, Full };  // [-127, 127], [-128, 127]
// The range a value's codes use: Narrow for constants (weights), Full otherwise.
Int8Range int8_range_for(const Value& v);

// x (already in code units) -> int8: round half to even, clamp to the range;
// NaN -> 0 (what PTX cvt.rni.sat.s8.f32 gives).
int8_t f32_to_i8(float x, Int8Range range);

// x in code units -> the code's bits (int8 codes as their two's complement
// byte): e4m3 saturates at +-448, e5m2 clamps to +-57344 first (a quantizer
// saturates; the raw e5m2 conversion would give inf), int8 as f32_to_i8.
uint8_t encode(DType code, float x, Int8Range range = Int8Range::Full);
// The code's value in code units (f8: exact; i8: the integer).
float decode(DType code, uint8_t bits);

// scale = amax / code_max(code): the scale that maps amax onto the largest
// code. amax == 0 (an all-zero tensor or channel) gives 1 (every value codes
// to 0 whatever the scale); tiny amax is floored at FLT_MIN so 1/scale stays
// finite. Throws for negative or non-finite amax.
float scale_for_amax(float amax, DType code);

// One value: code = encode(x * (1/scale)), with 1/scale rounded to f32 once,
// as GPU epilogues apply a quantize scale (cuBLASLt D_SCALE, cuDNN's scale_y
// are multipliers); dequantize = decode(code) * scale.
uint8_t quantize_value(float x, float scale, DType code, Int8Range range);
inline float dequantize_value(uint8_t bits, float scale, DType code) { return decode(code, bits) * scale; }
// dequantize(quantize(x)): what an 8-bit store followed by a widening load gives.
float fake_quantize(float x, float scale, DType code, Int8Range range);

// A dense row-major buffer of `shape` with q's scales (per tensor, or one per
// index of q.axis). Throws Error(Usage) naming the problem when q does not fit
// the shape (ir/graph.hpp quant_problem) or q.dtype is not a code type.
std::vector<uint8_t> quantize(const float* x, const Shape& shape, const QuantParams& q, Int8Range range);
std::vector<float> dequantize(const uint8_t* codes, const Shape& shape, const QuantParams& q);
// The same for tensors: the result's dtype is q.dtype (its bytes are the codes).
HostTensor quantize_tensor(const HostTensor& t, const QuantParams& q, Int8Range range);
std::vector<float> dequantize_tensor(const HostTensor& codes, const QuantParams& q);

// Largest |x| per index of `axis` (axis -1: one value over the whole buffer).
std::vector<float> amax_along(const float* x, const Shape& shape, int axis);

// The weight rule of a recipe: per output channel (axis 0 of a conv weight
// [O, C/g, kh, kw] or a linear weight [M, K]), scale = channel amax /
// code_max, taken from the (BatchNorm-folded) f32 kernel.
QuantParams weight_quant(const HostTensor& w, DType code);

}  // namespace kiln::quant
