#include "backends/cuda/se_plan.hpp"

#include "ir/attrs.hpp"
#include "ir/quant_form.hpp"

namespace kiln::cuda {

bool is_pointwise_with_bias(const Graph& g, const Node& n) {
  const Shape& ws = g.values[n.inputs[1]].shape;
  const ConvAttrs a = conv_attrs(n);
  return n.inputs.size() == 3 && ws.size() == 4 && ws[2] == 1 && ws[3] == 1 && a.groups == 1 && a.stride_h == 1 &&
         a.stride_w == 1 && a.pad_t == 0 && a.pad_l == 0 && a.pad_b == 0 && a.pad_r == 0;
}

SePlan plan_squeeze_excitation(const Graph& g, bool fuse_mul) {
  SePlan p;
  for (size_t mul = 0; mul < g.nodes.size(); ++mul) {
    if (g.nodes[mul].attr_int(kMarkSqueezeExcitation, 0) != 1) continue;
    const auto se = squeeze_excitation_at(g, mul);
    if (!se) continue;  // the verifier refuses such a mark; never fuse what is not there
    // The SE kernels compute in 16/32-bit floats: a quantized conv of the
    // block runs its own FP8 lowering, the block unfused.
    if (is_quantized_layer(g, g.nodes[se->reduce]) || is_quantized_layer(g, g.nodes[se->expand])) continue;
    // se_mlp keeps the hidden vector (cr floats) in shared memory: 48 KiB at most.
    const int64_t cr = g.values[g.nodes[se->reduce].outputs[0]].shape[1];
    if (cr * 4 > 48 * 1024) continue;
    const int pooled = g.nodes[se->reduce].inputs[0];
    p.fused_away.push_back(se->reduce);
    // A gate that writes codes (the project conv reads them) runs as its own mul_channel step.
    if (fuse_mul && g.values[g.nodes[mul].inputs[0]].shape.size() == 4 && !writes_codes(g, g.nodes[mul])) {
      // The gate is applied in the same step: the second conv's output is never stored.
      p.fused_away.push_back(se->expand);
      p.scale_at[mul] = *se;
      p.live_until[pooled] = static_cast<int>(mul);
      continue;
    }
    p.mlp_at[se->expand] = *se;
    p.live_until[pooled] = static_cast<int>(se->expand);
  }
  return p;
}

}  // namespace kiln::cuda
