// Marks convs whose input is an add they can compute while loading it (the
// Res2Net chain add: chain.i = chunk.i + out.{i-1} feeds conv.i): fusion mark
// input_add (ir/fusion_marks.hpp). The graph is unchanged otherwise; the CPU
// backend's conv and the CUDA backend's window conv read both operands and
// the add runs no step and stores nothing.
#include "ir/fusion_marks.hpp"
#include "passes/pass.hpp"

namespace kiln {

int mark_each(Graph& g, Op op, const char* mark, const std::function<bool(size_t)>& fits) {
  int marked = 0;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    Node& n = g.nodes[i];
    if (n.op != op || n.has_attr(mark) || !fits(i)) continue;
    n.attrs[mark] = int64_t{1};
    ++marked;
  }
  return marked;
}

int fuse_conv_input_add(Graph& g) {
  return mark_each(g, Op::Conv2d, kMarkInputAdd, [&](size_t i) { return input_add_problem(g, i).empty(); });
}

}  // namespace kiln
