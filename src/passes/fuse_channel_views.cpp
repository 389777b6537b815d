// Marks channel views (ir/fusion_marks.hpp): every channel slice that can be
// a window of its input gets channel_view, then every channel concat lists in
// in_place the inputs its producers can write straight into its output. The
// graph is unchanged otherwise; runtime/views.cpp turns the marks into the
// ChannelViews the memory plans, the CPU backend, the CUDA backend and
// `kiln inspect` use.
//
// Slices come first and win: a value some slice is a window of keeps its own
// buffer rather than going in place (its windows would move with it).
// Concats go in node order: a value two concats read is in place in the
// first only. One value read twice by a concat is copied to both places:
// the old planner put it in place at the first, which the backends (who tell
// an in-place input by its value) took for both, leaving the second unwritten.
// Marks already present are kept and respected, so the pass is idempotent and
// may run on a marked graph.
#include "ir/fusion_marks.hpp"
#include "passes/pass.hpp"

namespace kiln {

int fuse_channel_views(Graph& g) {
  int marked = mark_each(g, Op::Slice, kMarkChannelView, [&](size_t i) { return channel_view_problem(g, i).empty(); });
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    if (g.nodes[i].op != Op::Concat || g.nodes[i].has_attr(kMarkInPlace) || !on_channel_axis(g, g.nodes[i])) continue;
    std::vector<int64_t> in_place;
    for (size_t k = 0; k < g.nodes[i].inputs.size(); ++k)
      if (in_place_input_problem(g, i, k).empty()) in_place.push_back(static_cast<int64_t>(k));
    if (in_place.empty()) continue;
    g.nodes[i].attrs[kMarkInPlace] = std::move(in_place);
    ++marked;
  }
  return marked;
}

}  // namespace kiln
