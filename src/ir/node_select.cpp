#include "ir/node_select.hpp"

#include <fnmatch.h>

#include "core/error.hpp"

namespace kiln {

std::vector<std::string> split_patterns(const std::string& list) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= list.size()) {
    size_t end = list.find(',', start);
    if (end == std::string::npos) end = list.size();
    if (end > start) out.push_back(list.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

namespace {
bool matches(const std::string& pattern, const std::string& s) { return fnmatch(pattern.c_str(), s.c_str(), 0) == 0; }
}  // namespace

bool node_matches(const Node& n, const std::vector<std::string>& patterns) {
  for (const auto& p : patterns)
    if (matches(p, n.name) || matches(p, op_name(n.op))) return true;
  return false;
}

std::vector<char> select_nodes(const Graph& g, const std::vector<std::string>& patterns, const std::string& what) {
  std::vector<char> on(g.nodes.size(), 0);
  for (const auto& p : patterns) {
    bool any = false;
    for (size_t i = 0; i < g.nodes.size(); ++i)
      if (matches(p, g.nodes[i].name) || matches(p, op_name(g.nodes[i].op))) on[i] = 1, any = true;
    if (!any) fail_usage(what, " '", p, "' matches no layer name or op of this graph");
  }
  return on;
}

}  // namespace kiln
