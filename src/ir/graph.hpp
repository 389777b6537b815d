// Graph IR: values (tensors with dtype, shape, optional constant data) and
// nodes (op, attributes, inputs, outputs, a readable name taken from the
// checkpoint such as "layer2.1.conv2"). Nodes are kept in topological order.
#pragma once
#include <map>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "core/activation.hpp"
#include "core/dtype.hpp"
#include "core/tensor.hpp"
#include "ir/op.hpp"

namespace kiln {

using AttrValue = std::variant<int64_t, double, std::string, std::vector<int64_t>>;
using Attrs = std::map<std::string, AttrValue>;

struct Value {
  std::string name;
  DType dtype = DType::F32;
  Shape shape;
  std::optional<HostTensor> constant;  // weights; dtype/shape mirror the fields above
  int producer = -1;                   // node index, -1 for graph inputs and constants
};

struct Node {
  Op op = Op::Activation;
  std::string name;
  std::vector<int> inputs;
  std::vector<int> outputs;
  Attrs attrs;

  bool has_attr(const std::string& key) const { return attrs.count(key) != 0; }
  int64_t attr_int(const std::string& key) const;
  int64_t attr_int(const std::string& key, int64_t fallback) const;
  double attr_float(const std::string& key, double fallback) const;
  const std::string& attr_str(const std::string& key) const;
  std::vector<int64_t> attr_ints(const std::string& key) const;
  Activation activation() const;  // "activation" attr, None when absent
};

class Graph {
 public:
  std::vector<Value> values;
  std::vector<Node> nodes;
  std::vector<int> inputs;
  std::vector<int> outputs;

  int add_input(const std::string& name, DType dtype, const Shape& shape);
  int add_constant(const std::string& name, HostTensor tensor);
  // Appends a node, infers its output's dtype and shape, returns the output value id.
  int add_node(Op op, const std::string& name, const std::vector<int>& node_inputs, Attrs attrs = {});
  void mark_output(int value_id);

  bool is_constant(int value_id) const { return values.at(value_id).constant.has_value(); }
  // Nodes (indices) that read value_id.
  std::vector<int> consumers(int value_id) const;
  bool is_graph_output(int value_id) const;
  int count_ops(Op op) const;
  const Node* find_node(const std::string& name) const;

  // Recomputes producer links, sorts nodes topologically (stable: keeps the
  // existing order where dependencies allow), and drops values nothing refers to.
  void canonicalize();
  // Re-runs shape inference over all nodes (after changing input shapes).
  void infer_shapes();
};

// Shape and dtype rule of one node given its inputs; throws naming the node.
void infer_node(const Graph& g, const Node& n, DType* dtype, Shape* shape);

}  // namespace kiln
