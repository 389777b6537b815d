#include "ir/graph.hpp"

#include <algorithm>
#include <cmath>
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

std::string quant_problem(const Value& v, const QuantParams& q) {
  if (q.scales.empty()) return "has no quantization scales";
  for (float s : q.scales)
    if (!std::isfinite(s) || s <= 0) return cat("has quantization scale ", s, " (scales must be positive and finite)");
  if (q.axis == -1) return q.scales.size() == 1 ? "" : cat("has ", q.scales.size(), " per-tensor scales (axis -1 takes one)");
  if (q.axis < 0 || static_cast<size_t>(q.axis) >= v.shape.size())
    return cat("has quantization axis ", q.axis, " outside its shape ", shape_str(v.shape));
  if (static_cast<int64_t>(q.scales.size()) != v.shape[q.axis])
    return cat("has ", q.scales.size(), " scales for axis ", q.axis, " of extent ", v.shape[q.axis]);
  return "";
}

int Graph::add_input(const std::string& name, DType dtype, const Shape& shape) {
  Value v;
  v.name = name;
  v.dtype = dtype;
  v.shape = shape;
  values.push_back(std::move(v));
  if (uses_valid_) uses_.emplace_back();
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
  if (uses_valid_) uses_.emplace_back();
  return static_cast<int>(values.size()) - 1;
}

int Graph::add_node(Op op, const std::string& name, const std::vector<int>& node_inputs, Attrs attrs) {
  return add_node_multi(op, name, node_inputs, std::move(attrs)).at(0);
}

std::string output_value_name(const std::string& node, size_t k) { return k == 0 ? node : cat(node, ":", k); }

std::vector<int> Graph::add_node_multi(Op op, const std::string& name, const std::vector<int>& node_inputs, Attrs attrs) {
  Node n;
  n.op = op;
  n.name = name;
  n.inputs = node_inputs;
  n.attrs = std::move(attrs);
  for (int in : n.inputs)
    if (in < 0 || in >= static_cast<int>(values.size())) fail_runtime("node '", name, "': bad input id ", in);
  const std::vector<ValueType> types = infer_outputs(*this, n);
  const int index = static_cast<int>(nodes.size());
  for (size_t k = 0; k < types.size(); ++k) {
    Value out;
    out.name = output_value_name(name, k);
    out.dtype = types[k].dtype;
    out.shape = types[k].shape;
    out.producer = index;
    values.push_back(std::move(out));
    if (uses_valid_) uses_.emplace_back();
    n.outputs.push_back(static_cast<int>(values.size()) - 1);
  }
  nodes.push_back(std::move(n));
  for (int in : nodes.back().inputs) add_use(in, index);
  return nodes.back().outputs;
}

void Graph::mark_output(int value_id) { outputs.push_back(value_id); }

void Graph::build_uses() const {
  uses_.assign(values.size(), {});
  for (size_t i = 0; i < nodes.size(); ++i)
    for (int in : nodes[i].inputs)
      if (in >= 0 && in < static_cast<int>(values.size())) uses_[in].push_back(static_cast<int>(i));
  uses_valid_ = true;
}

void Graph::add_use(int value_id, int node) {
  if (!uses_valid_) return;
  if (uses_.size() < values.size()) uses_.resize(values.size());
  uses_.at(value_id).push_back(node);
}

void Graph::drop_use(int value_id, int node) {
  if (!uses_valid_) return;
  auto& u = uses_.at(value_id);
  auto it = std::find(u.begin(), u.end(), node);
  if (it == u.end()) {  // the cache was stale: forget it rather than guess
    uses_valid_ = false;
    return;
  }
  u.erase(it);
}

std::vector<int> Graph::consumers(int value_id) const {
  if (!uses_valid_ || uses_.size() != values.size()) build_uses();
  std::vector<int> r = uses_.at(value_id);
  std::sort(r.begin(), r.end());
  r.erase(std::unique(r.begin(), r.end()), r.end());
  return r;
}

bool Graph::uses_are_current() const {
  if (!uses_valid_) return true;
  if (uses_.size() != values.size()) return true;  // consumers() rebuilds it before any use
  std::vector<std::vector<int>> fresh(values.size());
  for (size_t i = 0; i < nodes.size(); ++i)
    for (int in : nodes[i].inputs)
      if (in >= 0 && in < static_cast<int>(values.size())) fresh[in].push_back(static_cast<int>(i));
  for (size_t v = 0; v < values.size(); ++v) {
    std::vector<int> cached = uses_[v];
    std::sort(cached.begin(), cached.end());
    if (cached != fresh[v]) return false;
  }
  return true;
}

void Graph::set_node_inputs(int node, const std::vector<int>& new_inputs) {
  Node& n = nodes.at(node);
  for (int in : new_inputs)
    if (in < 0 || in >= static_cast<int>(values.size())) fail_runtime("node '", n.name, "': bad input id ", in);
  for (int in : n.inputs) drop_use(in, node);
  n.inputs = new_inputs;
  for (int in : n.inputs) add_use(in, node);
}

void Graph::hand_over_outputs(int from, int to) {
  Node& src = nodes.at(from);
  Node& dst = nodes.at(to);
  dst.outputs = std::move(src.outputs);
  src.outputs.clear();
  for (int o : dst.outputs) values.at(o).producer = to;
  set_node_inputs(from, {});
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
  // Detached nodes (hand_over_outputs) go first; indices shift, so the
  // use-list is rebuilt on demand.
  invalidate_uses();
  nodes.erase(std::remove_if(nodes.begin(), nodes.end(), [](const Node& n) { return n.inputs.empty() && n.outputs.empty(); }),
              nodes.end());
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
    const std::vector<ValueType> types = infer_outputs(*this, n);
    if (types.size() != n.outputs.size())
      fail_runtime(n.name, ": ", op_name(n.op), " gives ", types.size(), " outputs, the node has ", n.outputs.size());
    for (size_t k = 0; k < types.size(); ++k) {
      Value& out = values[n.outputs[k]];
      out.dtype = types[k].dtype;
      out.shape = types[k].shape;
    }
  }
}

}  // namespace kiln
