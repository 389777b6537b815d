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

}  // namespace

int fuse_residual_add(Graph& g) {
  int count = 0;
  for (size_t i = 0; i < g.nodes.size();) {
    const Node& add = g.nodes[i];
    if (add.op != Op::Add) {
      ++i;
      continue;
    }
    // Prefer the first operand: builders emit add(main_path, shortcut).
    int which = fusable_conv(g, add.inputs[0]) ? 0 : (fusable_conv(g, add.inputs[1]) ? 1 : -1);
    if (which < 0) {
      ++i;
      continue;
    }
    const int conv_out = add.inputs[which];
    const int skip = add.inputs[1 - which];
    const int p = g.values[conv_out].producer;
    const std::string act = add.has_attr("activation") ? add.attr_str("activation") : "none";
    const std::vector<int> add_outputs = add.outputs;
    if (g.nodes[p].inputs.size() == 2) {
      // The fused form needs a bias slot before the residual slot.
      const auto& w = g.values[g.nodes[p].inputs[1]];
      int zero = g.add_constant(g.nodes[p].name + ".bias",
                                HostTensor::from_f32_as(w.dtype, {w.shape[0]}, std::vector<float>(w.shape[0], 0.f)));
      g.nodes[p].inputs.push_back(zero);
    }
    Node& conv = g.nodes[p];
    conv.inputs.push_back(skip);
    if (act != "none") conv.attrs["activation"] = act;
    conv.outputs = add_outputs;
    g.nodes.erase(g.nodes.begin() + static_cast<long>(i));
    g.canonicalize();  // the skip may be produced after the conv: re-sort
    ++count;
  }
  return count;
}

}  // namespace kiln
