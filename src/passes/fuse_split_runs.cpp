// Marks runs of consecutive channel slices of one input (Res2Net's chunks):
// fusion mark split_run = N on the first (ir/fusion_marks.hpp). The CUDA
// backend may write the whole run in one launch (it decides per batch: the
// launch pays while the copies are small).
#include "ir/fusion_marks.hpp"
#include "passes/pass.hpp"

namespace kiln {

int fuse_split_runs(Graph& g) {
  int marked = 0;
  auto channel_slice = [&](size_t i) { return g.nodes[i].op == Op::Slice && g.nodes[i].attr_int("axis", -1) == 1; };
  for (size_t i = 0; i < g.nodes.size();) {
    if (!channel_slice(i)) {
      ++i;
      continue;
    }
    size_t end = i + 1;
    while (end < g.nodes.size() && channel_slice(end) && g.nodes[end].inputs[0] == g.nodes[i].inputs[0]) ++end;
    if (end - i >= 2 && !g.nodes[i].has_attr(kMarkSplitRun)) {
      g.nodes[i].attrs[kMarkSplitRun] = static_cast<int64_t>(end - i);
      ++marked;
    }
    i = end;
  }
  return marked;
}

}  // namespace kiln
