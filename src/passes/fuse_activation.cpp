// conv/linear/add -> activation  ==>  producer with an "activation" attribute,
// applied in the producer's epilogue instead of a separate pass over memory.
#include "passes/pass.hpp"

namespace kiln {

namespace {
bool can_carry_activation(Op op) { return op == Op::Conv2d || op == Op::Linear || op == Op::Add; }
}  // namespace

int fuse_activation(Graph& g) {
  auto matches = [](const Graph& g, const Node& act) {
    if (act.op != Op::Activation) return false;
    const int x = act.inputs[0];
    const int p = g.values[x].producer;
    return p >= 0 && can_carry_activation(g.nodes[p].op) && g.nodes[p].activation() == Activation::None && single_use(g, x) &&
           same_precision(g.nodes[p], act);
  };
  auto rewrite = [](Graph& g, size_t i) {
    const Node& act = g.nodes[i];
    const int p = g.values[act.inputs[0]].producer;
    g.nodes[p].attrs["activation"] = act.attr_str("activation");
    g.hand_over_outputs(static_cast<int>(i), p);
  };
  return rewrite_each(g, matches, rewrite);
}

}  // namespace kiln
