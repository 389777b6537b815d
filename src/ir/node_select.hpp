// Selecting nodes by glob: "layer2.*", "conv2d", "*.se.*". A pattern matches a
// node when it matches the node's name or its op's name (fnmatch rules: *, ?,
// [...]). Build options that act on some layers (--reference today, FP8
// recipes next) select them this way.
#pragma once
#include <string>
#include <vector>

#include "ir/graph.hpp"

namespace kiln {

// "a,b,c" -> {"a", "b", "c"}; empty items dropped.
std::vector<std::string> split_patterns(const std::string& list);
bool node_matches(const Node& n, const std::vector<std::string>& patterns);
// One flag per node of g. Throws Error(Usage) naming the first pattern that
// matches no node (a typo must not silently select nothing); `what` names the option.
std::vector<char> select_nodes(const Graph& g, const std::vector<std::string>& patterns, const std::string& what);

}  // namespace kiln
