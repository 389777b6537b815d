// Removes nodes none of whose results anybody reads (and none is a graph
// output); repeats until nothing changes since removing one can orphan its
// inputs. A node with several outputs (top_k) stays while any one is read:
// its unread outputs are still written, and the memory planner gives them a
// lifetime of that node alone.
#include <algorithm>

#include "passes/pass.hpp"

namespace kiln {

int eliminate_dead_nodes(Graph& g) {
  int count = 0;
  bool changed = true;
  while (changed) {
    changed = false;
    std::vector<char> read(g.values.size(), 0);
    for (const auto& n : g.nodes)
      for (int in : n.inputs) read[in] = 1;
    for (int o : g.outputs) read[o] = 1;
    for (size_t i = g.nodes.size(); i-- > 0;) {
      const auto& outs = g.nodes[i].outputs;
      if (std::none_of(outs.begin(), outs.end(), [&](int o) { return read[o] != 0; })) {
        g.nodes.erase(g.nodes.begin() + static_cast<long>(i));
        ++count;
        changed = true;
      }
    }
  }
  g.canonicalize();
  return count;
}

}  // namespace kiln
