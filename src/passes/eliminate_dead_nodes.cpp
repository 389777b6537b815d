// Removes nodes whose result nobody reads (and is not a graph output);
// repeats until nothing changes since removing one can orphan its inputs.
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
      if (!read[g.nodes[i].outputs[0]]) {
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
