// add(conv(x), skip) [+ activation]  ==>  conv(x, residual=skip) [+ activation]
// so the bottleneck's conv3 + bias + skip add + ReLU is one kernel. The conv
// must not carry an activation yet: act(conv) + skip is a different function.
#include "passes/pass.hpp"

namespace kiln {

namespace {

bool fusable_conv(const Graph& g, int value_id) {
  int p = g.values[value_id].producer;
  if (p < 0) return false;
  const Node& c = g.nodes[p];
  return c.op == Op::Conv2d && c.inputs.size() <= 3 && c.activation() == Activation::None && single_use(g, value_id);
}

// Which operand of the add is the conv to fuse into: the first when it
// qualifies (builders emit add(main_path, shortcut)), else the second, else -1.
int fusable_operand(const Graph& g, const Node& add) {
  // The skip is read as the conv's output shape: not a constant repeated per image.
  if (add.op != Op::Add || g.values[add.inputs[0]].shape != g.values[add.inputs[1]].shape) return -1;
  const auto ok = [&](int k) { return fusable_conv(g, add.inputs[k]) && same_precision(g.nodes[g.values[add.inputs[k]].producer], add); };
  return ok(0) ? 0 : (ok(1) ? 1 : -1);
}

}  // namespace

int fuse_residual_add(Graph& g) {
  auto matches = [](const Graph& g, const Node& add) { return fusable_operand(g, add) >= 0; };
  auto rewrite = [](Graph& g, size_t i) {
    const Node add = g.nodes[i];
    const int which = fusable_operand(g, add);
    const int p = g.values[add.inputs[which]].producer;
    std::vector<int> conv_in = g.nodes[p].inputs;
    if (conv_in.size() == 2) {
      // The fused form needs a bias slot before the residual slot.
      const Value& w = g.values[conv_in[1]];
      HostTensor zero = HostTensor::from_f32_as(w.dtype, {w.shape[0]}, std::vector<float>(w.shape[0], 0.f));
      conv_in.push_back(g.add_constant(g.nodes[p].name + ".bias", std::move(zero)));
    }
    conv_in.push_back(add.inputs[1 - which]);
    g.set_node_inputs(p, conv_in);
    if (add.activation() != Activation::None) g.nodes[p].attrs["activation"] = add.attr_str("activation");
    g.hand_over_outputs(static_cast<int>(i), p);  // rewrite_each re-sorts: the skip may come after the conv
  };
  return rewrite_each(g, matches, rewrite);
}

}  // namespace kiln
