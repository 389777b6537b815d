// Marks the gate (mul) of every squeeze-excitation block: global pool ->
// pointwise conv + bias (+ act) -> pointwise conv + bias + sigmoid -> mul,
// fusion mark squeeze_excitation (ir/fusion_marks.hpp). The CUDA backend runs
// the two small convs (and, with switch fuse_se_mul, the gate) as one step.
#include "ir/fusion_marks.hpp"
#include "passes/pass.hpp"

namespace kiln {

int fuse_squeeze_excitation(Graph& g) {
  int marked = 0;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    Node& n = g.nodes[i];
    if (n.op != Op::Mul || n.has_attr(kMarkSqueezeExcitation) || !squeeze_excitation_at(g, i)) continue;
    n.attrs[kMarkSqueezeExcitation] = int64_t{1};
    ++marked;
  }
  return marked;
}

}  // namespace kiln
