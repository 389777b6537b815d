#include "quant/fp8.hpp"

#include <algorithm>
#include <cfloat>
#include <cmath>

#include "core/error.hpp"
#include "core/half.hpp"

namespace kiln::quant {

bool is_code_type(DType t) { return t == DType::F8E4M3 || t == DType::F8E5M2 || t == DType::I8; }

float code_max(DType code) {
  switch (code) {
    case DType::F8E4M3: return 448.0f;
    case DType::F8E5M2: return 57344.0f;
    case DType::I8: return 127.0f;
    default: fail_usage("quantization: ", dtype_name(code), " is not a code type (f8e4m3, f8e5m2 or i8)");
  }
}

Int8Range int8_range_for(const Value& v) { return v.constant ? Int8Range::Narrow : Int8Range::Full; }

int8_t f32_to_i8(float x, Int8Range range) {
  if (std::isnan(x)) return 0;
  const float lo = range == Int8Range::Narrow ? -127.0f : -128.0f;
  // nearbyint rounds half to even in the default rounding mode; clamping after
  // rounding equals clamping before, the bounds being integers.
  return static_cast<int8_t>(std::clamp(std::nearbyint(x), lo, 127.0f));
}

uint8_t encode(DType code, float x, Int8Range range) {
  switch (code) {
    case DType::F8E4M3: return f32_to_e4m3(x);
    case DType::F8E5M2: return f32_to_e5m2(std::isnan(x) ? x : std::clamp(x, -57344.0f, 57344.0f));
    case DType::I8: return static_cast<uint8_t>(f32_to_i8(x, range));
    default: fail_usage("quantization: cannot encode to ", dtype_name(code));
  }
}

float decode(DType code, uint8_t bits) {
  switch (code) {
    case DType::F8E4M3: return e4m3_to_f32(bits);
    case DType::F8E5M2: return e5m2_to_f32(bits);
    case DType::I8: return static_cast<float>(static_cast<int8_t>(bits));
    default: fail_usage("quantization: cannot decode ", dtype_name(code));
  }
}

float scale_for_amax(float amax, DType code) {
  if (!std::isfinite(amax) || amax < 0) fail_usage("quantization: amax ", amax, " (must be finite and >= 0)");
  if (amax == 0) return 1.0f;
  return std::max(amax / code_max(code), FLT_MIN);
}

uint8_t quantize_value(float x, float scale, DType code, Int8Range range) {
  return encode(code, x * (1.0f / scale), range);
}

float fake_quantize(float x, float scale, DType code, Int8Range range) {
  return dequantize_value(quantize_value(x, scale, code, range), scale, code);
}

namespace {

// outer x channels x inner view of a row-major shape split at `axis`
// (axis -1: one channel holding everything).
struct ChannelSplit {
  int64_t outer = 1, channels = 1, inner = 1;
};

ChannelSplit split_at(const Shape& shape, int axis) {
  ChannelSplit s;
  if (axis < 0) {
    s.inner = shape_numel(shape);
    return s;
  }
  for (int i = 0; i < axis; ++i) s.outer *= shape[i];
  s.channels = shape[axis];
  for (size_t i = static_cast<size_t>(axis) + 1; i < shape.size(); ++i) s.inner *= shape[i];
  return s;
}

// Calls f(element index, channel index) over the buffer in memory order.
template <typename F>
void for_each_channel(const Shape& shape, int axis, F&& f) {
  const ChannelSplit s = split_at(shape, axis);
  int64_t i = 0;
  for (int64_t o = 0; o < s.outer; ++o)
    for (int64_t c = 0; c < s.channels; ++c)
      for (int64_t k = 0; k < s.inner; ++k) f(i++, c);
}

void check_params(const Shape& shape, const QuantParams& q) {
  if (!is_code_type(q.dtype)) fail_usage("quantization: ", dtype_name(q.dtype), " is not a code type (f8e4m3, f8e5m2 or i8)");
  Value v;
  v.shape = shape;
  const std::string problem = quant_problem(v, q);
  if (!problem.empty()) fail_usage("quantization of a ", shape_str(shape), " buffer: ", problem);
}

}  // namespace

std::vector<uint8_t> quantize(const float* x, const Shape& shape, const QuantParams& q, Int8Range range) {
  check_params(shape, q);
  std::vector<float> inv(q.scales.size());
  for (size_t c = 0; c < inv.size(); ++c) inv[c] = 1.0f / q.scales[c];
  std::vector<uint8_t> out(static_cast<size_t>(shape_numel(shape)));
  for_each_channel(shape, q.axis, [&](int64_t i, int64_t c) { out[i] = encode(q.dtype, x[i] * inv[c], range); });
  return out;
}

std::vector<float> dequantize(const uint8_t* codes, const Shape& shape, const QuantParams& q) {
  check_params(shape, q);
  std::vector<float> out(static_cast<size_t>(shape_numel(shape)));
  for_each_channel(shape, q.axis, [&](int64_t i, int64_t c) { out[i] = decode(q.dtype, codes[i]) * q.scales[c]; });
  return out;
}

HostTensor quantize_tensor(const HostTensor& t, const QuantParams& q, Int8Range range) {
  const std::vector<float> x = t.to_f32();
  HostTensor out;
  out.dtype = q.dtype;
  out.shape = t.shape;
  out.blob = Blob::from_vector(quantize(x.data(), t.shape, q, range));
  return out;
}

std::vector<float> dequantize_tensor(const HostTensor& codes, const QuantParams& q) {
  if (codes.dtype != q.dtype)
    fail_usage("dequantize: a ", dtype_name(codes.dtype), " tensor with ", dtype_name(q.dtype), " parameters");
  return dequantize(codes.blob.data, codes.shape, q);
}

std::vector<float> amax_along(const float* x, const Shape& shape, int axis) {
  if (axis >= static_cast<int>(shape.size())) fail_usage("amax: axis ", axis, " outside shape ", shape_str(shape));
  std::vector<float> m(static_cast<size_t>(split_at(shape, axis).channels), 0.0f);
  for_each_channel(shape, axis, [&](int64_t i, int64_t c) {
    const float a = std::fabs(x[i]);
    if (!(a <= m[c])) m[c] = a;  // NaN propagates (scale_for_amax rejects it)
  });
  return m;
}

QuantParams weight_quant(const HostTensor& w, DType code) {
  if (w.shape.empty() || w.shape[0] == 0) fail_usage("weight quantization: weight of shape ", shape_str(w.shape));
  const std::vector<float> x = w.to_f32();
  QuantParams q;
  q.axis = 0;
  q.dtype = code;
  for (float a : amax_along(x.data(), w.shape, 0)) q.scales.push_back(scale_for_amax(a, code));
  return q;
}

}  // namespace kiln::quant
