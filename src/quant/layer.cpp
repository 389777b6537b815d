#include "quant/layer.hpp"

#include <cmath>

#include "core/activation.hpp"
#include "core/error.hpp"
#include "ir/quant_form.hpp"

namespace kiln::quant {

float LayerEpilogue::apply(int64_t oc, double acc, const float* residual) const {
  const size_t c = static_cast<size_t>(oc);
  float y = std::fma(static_cast<float>(acc), alpha[c], bias[c]);
  if (residual) y += (*residual * residual_scale) * residual_mul;
  y = apply_activation(act, y);
  if (!is_8bit(out)) return y;
  if (!folded) y *= inv_out_scale;
  return decode(out, encode(out, y, Int8Range::Full));
}

LayerEpilogue layer_epilogue(const Graph& g, const Node& n, const float* bias) {
  if (const std::string why = quant_node_problem(g, n); !why.empty()) fail_input(why);
  const Value& x = g.values.at(n.inputs.at(0));
  const Value& w = g.values.at(n.inputs.at(1));
  const Value& y = g.values.at(n.outputs.at(0));
  const int64_t channels = w.shape.at(0);
  const int64_t reduction = shape_numel(w.shape) / std::max<int64_t>(1, channels);
  if (reduction >= kMaxExactReduction)
    fail_input(n.name, ": quantized layer reduces over ", reduction, " products (the exact CPU emulation takes fewer than ",
               kMaxExactReduction, ")");
  LayerEpilogue e;
  e.out = y.dtype;
  e.act = n.activation();
  e.alpha.resize(static_cast<size_t>(channels));
  e.bias.assign(static_cast<size_t>(channels), 0.f);
  const float s_x = x.quant->scales[0];
  for (int64_t c = 0; c < channels; ++c) {
    const float s_w = w.quant->scales[w.quant->axis < 0 ? 0 : static_cast<size_t>(c)];
    e.alpha[static_cast<size_t>(c)] = s_x * s_w;
    if (bias) e.bias[static_cast<size_t>(c)] = bias[c];
  }
  if (n.inputs.size() > 3 && is_8bit(g.values.at(n.inputs[3]).dtype)) e.residual_scale = g.values.at(n.inputs[3]).quant->scales[0];
  if (is_8bit(y.dtype)) {
    e.inv_out_scale = 1.f / y.quant->scales[0];
    e.folded = e.act == Activation::None || e.act == Activation::Relu;
    if (e.folded) {
      e.residual_mul = e.inv_out_scale;
      for (size_t c = 0; c < e.alpha.size(); ++c) e.alpha[c] *= e.inv_out_scale, e.bias[c] *= e.inv_out_scale;
    }
  }
  return e;
}

}  // namespace kiln::quant
