// quantize and dequantize, the definition: per element, with the scale of its
// channel (Value::quant, per tensor or per index of its axis). Buffers of
// 8-bit values hold the codes' values in code units (e4m3: the decoded
// number, i8: the integer). quantize: code = encode(x * f32(1 / scale)), RNE,
// e4m3 saturating at 448, i8 clamped to [-128, 127] (quant/fp8.hpp);
// dequantize: code * scale, one f32 rounding (the product of two floats is
// exact in double), then the storage rounding of run_reference.
#include "backends/cpu/ref/ref.hpp"
#include "core/error.hpp"
#include "ir/attrs.hpp"
#include "quant/fp8.hpp"

namespace kiln::ref {

namespace {

// The scale of flat index i of a value of shape s under q.
struct ScaleAt {
  const QuantParams& q;
  AxisSplit split;
  ScaleAt(const QuantParams& q, const Shape& s) : q(q), split(q.axis < 0 ? AxisSplit{} : split_at(s, q.axis)) {}
  float operator()(size_t i) const {
    return q.axis < 0 ? q.scales[0] : q.scales[(i / static_cast<size_t>(split.inner)) % static_cast<size_t>(split.extent)];
  }
};

const QuantParams& scales_of(const OpArgs& a, const Value& v) {
  if (!v.quant) fail_input(a.n.name, ": value '", v.name, "' has no quantization scales");
  return *v.quant;
}

}  // namespace

Buffer quantize(const OpArgs& a) {
  const Value& y = a.g.values.at(a.n.outputs.at(0));
  const QuantParams& q = scales_of(a, y);
  const ScaleAt scale(q, y.shape);
  Buffer out(a.in[0].size());
  for (size_t i = 0; i < out.size(); ++i)
    out[i] = quant::decode(y.dtype, quant::quantize_value(a.in[0][i], scale(i), y.dtype, quant::Int8Range::Full));
  return out;
}

Buffer dequantize(const OpArgs& a) {
  const Value& x = a.g.values.at(a.n.inputs.at(0));
  const QuantParams& q = scales_of(a, x);
  const ScaleAt scale(q, x.shape);
  Buffer out(a.in[0].size());
  for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<float>(double(a.in[0][i]) * double(scale(i)));
  return out;
}

}  // namespace kiln::ref
