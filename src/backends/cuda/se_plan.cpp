#include "backends/cuda/se_plan.hpp"

#include "ir/attrs.hpp"

namespace kiln::cuda {

bool is_pointwise_with_bias(const Graph& g, const Node& n) {
  const Shape& ws = g.values[n.inputs[1]].shape;
  const ConvAttrs a = conv_attrs(n);
  return n.inputs.size() == 3 && ws.size() == 4 && ws[2] == 1 && ws[3] == 1 && a.groups == 1 && a.stride_h == 1 &&
         a.stride_w == 1 && a.pad_t == 0 && a.pad_l == 0 && a.pad_b == 0 && a.pad_r == 0;
}

SePlan plan_squeeze_excitation(const Graph& g, bool fuse_mul) {
  SePlan p;
  for (size_t ia = 0; ia + 1 < g.nodes.size(); ++ia) {
    const Node& a = g.nodes[ia];
    const Node& b = g.nodes[ia + 1];
    if (a.op != Op::Conv2d || b.op != Op::Conv2d || !is_pointwise_with_bias(g, a) || !is_pointwise_with_bias(g, b)) continue;
    const int pooled = a.inputs[0];
    const int prod = g.values[pooled].producer;
    if (prod < 0 || g.nodes[prod].op != Op::GlobalAvgPool || g.consumers(pooled).size() != 1 || g.is_graph_output(pooled)) continue;
    if (b.inputs[0] != a.outputs[0] || g.consumers(a.outputs[0]).size() != 1 || g.is_graph_output(a.outputs[0])) continue;
    if (b.activation() != Activation::Sigmoid) continue;
    const auto readers = g.consumers(b.outputs[0]);
    if (readers.size() != 1 || g.nodes[readers[0]].op != Op::Mul || g.nodes[readers[0]].inputs[1] != b.outputs[0]) continue;
    // se_mlp keeps the hidden vector (cr floats) in shared memory: 48 KiB at most.
    const int64_t cr = g.values[a.outputs[0]].shape[1];
    if (cr * 4 > 48 * 1024) continue;
    p.fused_away.push_back(ia);
    const size_t mul = static_cast<size_t>(readers[0]);
    if (fuse_mul && g.values[g.nodes[mul].inputs[0]].shape.size() == 4) {
      // The gate is applied in the same step: the second conv's output is never stored.
      p.fused_away.push_back(ia + 1);
      p.scale_at[mul] = ia;
      p.live_until[pooled] = static_cast<int>(mul);
      continue;
    }
    p.mlp_at[ia + 1] = ia;
    p.live_until[pooled] = static_cast<int>(ia + 1);
  }
  return p;
}

}  // namespace kiln::cuda
