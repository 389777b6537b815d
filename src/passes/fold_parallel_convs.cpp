// add(conv_a(x), conv_b(x))  ==>  conv(x) with the two kernels summed
// (RepVGG re-parameterization: RT-DETR's CSPRep blocks run BN(3x3 conv) +
// BN(1x1 conv) on one input; after fold_batchnorm both are biased convs, and
// the 1x1 kernel is the 3x3 kernel's centre tap). Convolution is linear in
// its weights, so conv(x, Wa) + conv(x, Wb) = conv(x, Wa + pad(Wb)) when both
// read x with the same stride and their windows share a centre: the smaller
// (odd) kernel is zero-padded to the larger, its padding must be the larger
// one's minus the extra margin on every side. Exact in real arithmetic; in
// f32 the summed weights round once instead of the two outputs.
#include "ir/attrs.hpp"
#include "passes/pass.hpp"

namespace kiln {
namespace {

// The plain biased conv producing `value` that only the add reads, or -1.
int plain_conv(const Graph& g, int value) {
  const int p = g.values[value].producer;
  if (p < 0 || !single_use(g, value)) return -1;
  const Node& c = g.nodes[p];
  if (c.op != Op::Conv2d || c.inputs.size() > 3 || c.activation() != Activation::None) return -1;
  for (size_t k = 1; k < c.inputs.size(); ++k)
    if (!g.is_constant(c.inputs[k])) return -1;
  return p;
}

// The two convs of a foldable add, larger kernel first; {-1, -1} when it is not one.
std::pair<int, int> foldable(const Graph& g, const Node& add) {
  if (add.op != Op::Add || add.inputs.size() != 2 || add.inputs[0] == add.inputs[1]) return {-1, -1};
  int a = plain_conv(g, add.inputs[0]), b = plain_conv(g, add.inputs[1]);
  if (a < 0 || b < 0 || g.nodes[a].inputs[0] != g.nodes[b].inputs[0]) return {-1, -1};
  const Shape& wa = g.values[g.nodes[a].inputs[1]].shape;
  const Shape& wb = g.values[g.nodes[b].inputs[1]].shape;
  if (wa[2] < wb[2] || wa[3] < wb[3]) std::swap(a, b);
  const Shape& big = g.values[g.nodes[a].inputs[1]].shape;
  const Shape& small = g.values[g.nodes[b].inputs[1]].shape;
  const ConvAttrs x = conv_attrs(g.nodes[a]), y = conv_attrs(g.nodes[b]);
  const int64_t mh = big[2] - small[2], mw = big[3] - small[3];
  if (big[0] != small[0] || big[1] != small[1] || small[2] > big[2] || small[3] > big[3] || mh % 2 || mw % 2) return {-1, -1};
  if (x.groups != y.groups || x.stride_h != y.stride_h || x.stride_w != y.stride_w || x.dil_h != 1 || x.dil_w != 1 ||
      y.dil_h != 1 || y.dil_w != 1)
    return {-1, -1};
  if (y.pad_t != x.pad_t - mh / 2 || y.pad_b != x.pad_b - mh / 2 || y.pad_l != x.pad_l - mw / 2 || y.pad_r != x.pad_r - mw / 2)
    return {-1, -1};
  if (g.values[g.nodes[a].outputs[0]].shape != g.values[g.nodes[b].outputs[0]].shape) return {-1, -1};
  if (g.values[g.nodes[a].inputs[1]].dtype != DType::F32 || g.values[g.nodes[b].inputs[1]].dtype != DType::F32) return {-1, -1};
  return {a, b};
}

}  // namespace

int fold_parallel_convs(Graph& g) {
  auto matches = [](const Graph& g, const Node& add) { return foldable(g, add).first >= 0; };
  auto rewrite = [](Graph& g, size_t i) {
    const Node add = g.nodes[i];
    const auto [a, b] = foldable(g, add);
    const Node& big = g.nodes[a];
    const Node& small = g.nodes[b];
    const Shape ws = g.values[big.inputs[1]].shape, vs = g.values[small.inputs[1]].shape;
    std::vector<float> w = g.values[big.inputs[1]].constant->to_f32();
    const std::vector<float> v = g.values[small.inputs[1]].constant->to_f32();
    const int64_t oh = (ws[2] - vs[2]) / 2, ow = (ws[3] - vs[3]) / 2;
    for (int64_t o = 0; o < ws[0]; ++o)
      for (int64_t c = 0; c < ws[1]; ++c)
        for (int64_t r = 0; r < vs[2]; ++r)
          for (int64_t s = 0; s < vs[3]; ++s)
            w[((o * ws[1] + c) * ws[2] + r + oh) * ws[3] + s + ow] += v[((o * vs[1] + c) * vs[2] + r) * vs[3] + s];
    std::vector<float> bias(static_cast<size_t>(ws[0]), 0.f);
    for (const Node* n : {&big, &small})
      if (n->inputs.size() > 2) {
        const std::vector<float> bb = g.values[n->inputs[2]].constant->to_f32();
        for (size_t k = 0; k < bias.size(); ++k) bias[k] += bb[k];
      }
    const std::string name = big.name;
    const int x = big.inputs[0];
    const int wv = g.add_constant(name + ".weight_folded", HostTensor::from_f32(ws, w));
    const int bv = g.add_constant(name + ".bias_folded", HostTensor::from_f32({ws[0]}, bias));
    g.set_node_inputs(a, {x, wv, bv});
    if (add.activation() != Activation::None) g.nodes[a].attrs["activation"] = add.attr_str("activation");
    g.hand_over_outputs(static_cast<int>(i), a);
  };
  return rewrite_each(g, matches, rewrite);
}

}  // namespace kiln
