#pragma once
#include <string>

#include "ir/graph.hpp"

namespace kiln {
// Checks the IR invariants: ids in range, every value produced exactly once
// and before use (topological order), unique node names, constants' data
// matching their dtype/shape, and every node's dtype/shape equal to what the
// op's rule infers. Throws Error(Runtime) naming the node and `stage` (the
// pass that just ran).
void verify_graph(const Graph& g, const std::string& stage);
}  // namespace kiln
