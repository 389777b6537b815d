// conv -> batch_norm  ==>  conv with scaled weights and a shifted bias.
// Folding is computed in double so an fp32 engine matches the reference
// within rounding of the final weights.
#include <cmath>

#include "core/error.hpp"
#include "passes/pass.hpp"

namespace kiln {

namespace {

bool matches(const Graph& g, const Node& bn) {
  if (bn.op != Op::BatchNorm) return false;
  int x = bn.inputs[0];
  int p = g.values[x].producer;
  if (p < 0 || g.nodes[p].op != Op::Conv2d || !single_use(g, x)) return false;
  const Node& conv = g.nodes[p];
  if (conv.inputs.size() > 3 || conv.activation() != Activation::None) return false;  // no residual/act yet
  for (size_t i = 1; i < conv.inputs.size(); ++i)
    if (!g.is_constant(conv.inputs[i])) return false;
  for (size_t i = 1; i < 5; ++i)
    if (!g.is_constant(bn.inputs[i])) return false;
  return true;
}

void rewrite(Graph& g, size_t bn_index) {
  const Node bn = g.nodes[bn_index];
  const int conv_index = g.values[bn.inputs[0]].producer;
  const Node& conv = g.nodes[conv_index];
  const HostTensor& w = *g.values[conv.inputs[1]].constant;  // valid until the first add_constant below
  const Shape w_shape = w.shape;
  const int64_t out_ch = w.shape[0];
  const int64_t per_out = w.numel() / out_ch;
  std::vector<float> wv = w.to_f32();
  std::vector<float> bias(static_cast<size_t>(out_ch), 0.f);
  if (conv.inputs.size() > 2) bias = g.values[conv.inputs[2]].constant->to_f32();
  auto gamma = g.values[bn.inputs[1]].constant->to_f32();
  auto beta = g.values[bn.inputs[2]].constant->to_f32();
  auto mean = g.values[bn.inputs[3]].constant->to_f32();
  auto var = g.values[bn.inputs[4]].constant->to_f32();
  const double eps = bn.attr_float("eps", 1e-5);
  for (int64_t o = 0; o < out_ch; ++o) {
    double s = gamma[o] / std::sqrt(static_cast<double>(var[o]) + eps);
    for (int64_t k = 0; k < per_out; ++k) wv[o * per_out + k] = static_cast<float>(wv[o * per_out + k] * s);
    bias[o] = static_cast<float>((bias[o] - static_cast<double>(mean[o])) * s + beta[o]);
  }
  const int new_w = g.add_constant(conv.name + ".weight", HostTensor::from_f32(w_shape, wv));
  const int new_b = g.add_constant(conv.name + ".bias", HostTensor::from_f32({out_ch}, bias));
  // nodes are untouched by add_constant, so `conv` is still valid
  g.set_node_inputs(conv_index, {conv.inputs[0], new_w, new_b});
  // The conv now produces what the batch norm produced; the BN is detached.
  g.hand_over_outputs(static_cast<int>(bn_index), conv_index);
}

}  // namespace

int fold_batchnorm(Graph& g) { return rewrite_each(g, matches, rewrite); }

}  // namespace kiln
