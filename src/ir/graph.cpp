#include "ir/graph.hpp"

#include <algorithm>
#include <queue>

#include "core/error.hpp"

namespace kiln {

int64_t Node::attr_int(const std::string& key) const {
  auto it = attrs.find(key);
  if (it == attrs.end()) fail_runtime("node '", name, "': missing attribute '", key, "'");
  if (auto p = std::get_if<int64_t>(&it->second)) return *p;
  fail_runtime("node '", name, "': attribute '", key, "' is not an integer");
}
int64_t Node::attr_int(const std::string& key, int64_t fallback) const {
  return has_attr(key) ? attr_int(key) : fallback;
}
double Node::attr_float(const std::string& key, double fallback) const {
  auto it = attrs.find(key);
  if (it == attrs.end()) return fallback;
  if (auto p = std::get_if<double>(&it->second)) return *p;
  if (auto p = std::get_if<int64_t>(&it->second)) return static_cast<double>(*p);
  fail_runtime("node '", name, "': attribute '", key, "' is not a number");
}
const std::string& Node::attr_str(const std::string& key) const {
  auto it = attrs.find(key);
  if (it == attrs.end()) fail_runtime("node '", name, "': missing attribute '", key, "'");
  if (auto p = std::get_if<std::string>(&it->second)) return *p;
  fail_runtime("node '", name, "': attribute '", key, "' is not a string");
}
std::vector<int64_t> Node::attr_ints(const std::string& key) const {
  auto it = attrs.find(key);
  if (it == attrs.end()) fail_runtime("node '", name, "': missing attribute '", key, "'");
  if (auto p = std::get_if<std::vector<int64_t>>(&it->second)) return *p;
  fail_runtime("node '", name, "': attribute '", key, "' is not an integer list");
}
Activation Node::activation() const {
  if (!has_attr("activation")) return Activation::None;
  auto a = activation_from_name(attr_str("activation"));
  if (!a) fail_runtime("node '", name, "': unknown activation '", attr_str("activation"), "'");
  return *a;
}

int Graph::add_input(const std::string& name, DType dtype, const Shape& shape) {
  Value v;
  v.name = name;
  v.dtype = dtype;
  v.shape = shape;
  values.push_back(std::move(v));
  inputs.push_back(static_cast<int>(values.size()) - 1);
  return inputs.back();
}

int Graph::add_constant(const std::string& name, HostTensor tensor) {
  Value v;
  v.name = name;
  v.dtype = tensor.dtype;
  v.shape = tensor.shape;
  v.constant = std::move(tensor);
  values.push_back(std::move(v));
  return static_cast<int>(values.size()) - 1;
}

int Graph::add_node(Op op, const std::string& name, const std::vector<int>& node_inputs, Attrs attrs) {
  Node n;
  n.op = op;
  n.name = name;
  n.inputs = node_inputs;
  n.attrs = std::move(attrs);
  for (int in : n.inputs)
    if (in < 0 || in >= static_cast<int>(values.size())) fail_runtime("node '", name, "': bad input id ", in);
  Value out;
  out.name = name;
  infer_node(*this, n, &out.dtype, &out.shape);
  out.producer = static_cast<int>(nodes.size());
  values.push_back(std::move(out));
  n.outputs = {static_cast<int>(values.size()) - 1};
  nodes.push_back(std::move(n));
  return nodes.back().outputs[0];
}

void Graph::mark_output(int value_id) { outputs.push_back(value_id); }

std::vector<int> Graph::consumers(int value_id) const {
  std::vector<int> r;
  for (size_t i = 0; i < nodes.size(); ++i)
    for (int in : nodes[i].inputs)
      if (in == value_id) {
        r.push_back(static_cast<int>(i));
        break;
      }
  return r;
}

bool Graph::is_graph_output(int value_id) const {
  return std::find(outputs.begin(), outputs.end(), value_id) != outputs.end();
}

int Graph::count_ops(Op op) const {
  return static_cast<int>(std::count_if(nodes.begin(), nodes.end(), [op](const Node& n) { return n.op == op; }));
}

const Node* Graph::find_node(const std::string& name) const {
  for (const auto& n : nodes)
    if (n.name == name) return &n;
  return nullptr;
}

void Graph::canonicalize() {
  // Topological order (Kahn), taking ready nodes in their current order so
  // the printed graph stays close to the checkpoint's layer order.
  const size_t nn = nodes.size();
  std::vector<int> producer_of(values.size(), -1);
  for (size_t i = 0; i < nn; ++i)
    for (int o : nodes[i].outputs) producer_of[o] = static_cast<int>(i);
  std::vector<int> pending(nn, 0);
  std::vector<std::vector<int>> users(nn);
  for (size_t i = 0; i < nn; ++i)
    for (int in : nodes[i].inputs)
      if (producer_of[in] >= 0) {
        ++pending[i];
        users[producer_of[in]].push_back(static_cast<int>(i));
      }
  std::priority_queue<int, std::vector<int>, std::greater<int>> ready;
  for (size_t i = 0; i < nn; ++i)
    if (!pending[i]) ready.push(static_cast<int>(i));
  std::vector<int> order;
  while (!ready.empty()) {
    int i = ready.top();
    ready.pop();
    order.push_back(i);
    for (int u : users[i])
      if (--pending[u] == 0) ready.push(u);
  }
  if (order.size() != nn) fail_runtime("graph has a cycle");
  std::vector<Node> sorted;
  sorted.reserve(nn);
  for (int i : order) sorted.push_back(std::move(nodes[i]));
  nodes = std::move(sorted);

  // Drop values that no node, input or output refers to; renumber.
  std::vector<char> used(values.size(), 0);
  for (int v : inputs) used[v] = 1;
  for (int v : outputs) used[v] = 1;
  for (const auto& n : nodes) {
    for (int v : n.inputs) used[v] = 1;
    for (int v : n.outputs) used[v] = 1;
  }
  std::vector<int> remap(values.size(), -1);
  std::vector<Value> kept;
  for (size_t v = 0; v < values.size(); ++v)
    if (used[v]) {
      remap[v] = static_cast<int>(kept.size());
      kept.push_back(std::move(values[v]));
    }
  values = std::move(kept);
  auto fix = [&](std::vector<int>& ids) {
    for (int& id : ids) id = remap[id];
  };
  fix(inputs);
  fix(outputs);
  for (auto& v : values) v.producer = -1;
  for (size_t i = 0; i < nodes.size(); ++i) {
    fix(nodes[i].inputs);
    fix(nodes[i].outputs);
    for (int o : nodes[i].outputs) values[o].producer = static_cast<int>(i);
  }
}

void Graph::infer_shapes() {
  for (const auto& n : nodes) {
    Value& out = values[n.outputs[0]];
    infer_node(*this, n, &out.dtype, &out.shape);
  }
}

}  // namespace kiln
