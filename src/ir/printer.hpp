#pragma once
#include <string>

#include "ir/graph.hpp"

namespace kiln {
// One line per node:  %v = op "name"(%a, %b) {attrs} : dtype[shape]
std::string print_graph(const Graph& g);
std::string attr_to_string(const AttrValue& v);
}  // namespace kiln
