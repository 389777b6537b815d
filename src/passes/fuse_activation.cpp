// conv/linear/add -> activation  ==>  producer with an "activation" attribute,
// applied in the producer's epilogue instead of a separate pass over memory.
#include "passes/pass.hpp"

namespace kiln {

namespace {
bool can_carry_activation(Op op) { return op == Op::Conv2d || op == Op::Linear || op == Op::Add; }
}  // namespace

int fuse_activation(Graph& g) {
  int count = 0;
  for (size_t i = 0; i < g.nodes.size();) {
    const Node& act = g.nodes[i];
    int x = act.inputs.empty() ? -1 : act.inputs[0];
    int p = x >= 0 ? g.values[x].producer : -1;
    if (act.op == Op::Activation && p >= 0 && can_carry_activation(g.nodes[p].op) &&
        g.nodes[p].activation() == Activation::None && single_use(g, x)) {
      Node& prod = g.nodes[p];
      prod.attrs["activation"] = act.attr_str("activation");
      prod.outputs = act.outputs;
      g.nodes.erase(g.nodes.begin() + static_cast<long>(i));
      g.canonicalize();
      ++count;
    } else {
      ++i;
    }
  }
  return count;
}

}  // namespace kiln
