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

// Highest rank a value may have (transformer graphs need 5-6; 8 is headroom).
// Rank 0 (a scalar) is allowed. Checked by the verifier and the graph.json reader.
inline constexpr size_t kMaxRank = 8;

// How a value is quantized: real = code * scale, per tensor (one scale,
// axis -1) or per channel along `axis` (one scale per index of that axis).
// `dtype` is the code type it quantizes to (f8e4m3, i8, ...); the value's own
// dtype may still be the wide one before a pass lowers it.
struct QuantParams {
  std::vector<float> scales;
  int axis = -1;
  DType dtype = DType::F8E4M3;
  bool operator==(const QuantParams&) const = default;
};

struct Value {
  std::string name;
  DType dtype = DType::F32;
  Shape shape;
  std::optional<HostTensor> constant;  // weights; dtype/shape mirror the fields above
  int producer = -1;                   // node index, -1 for graph inputs and constants
  std::optional<QuantParams> quant;    // FP8/int8 recipes: scales chosen at build time
};

// Why `q` cannot describe value `v`, or "" when it can: scales positive and
// finite, one scale (axis -1) or one per index of `axis`.
std::string quant_problem(const Value& v, const QuantParams& q);

// A node has as many outputs as its op's rule gives, within ops.def's bounds
// (top_k: values and indices); each output value names the node as producer.
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
  // Appends a node, infers its outputs' dtypes and shapes, returns the first
  // output's value id (all an op with one output has).
  int add_node(Op op, const std::string& name, const std::vector<int>& node_inputs, Attrs attrs = {});
  // The same, returning every output's value id in output order. Output 0 is
  // named like the node, output k > 0 "<node>:k" (output_value_name).
  std::vector<int> add_node_multi(Op op, const std::string& name, const std::vector<int>& node_inputs, Attrs attrs = {});
  void mark_output(int value_id);

  bool is_constant(int value_id) const { return values.at(value_id).constant.has_value(); }
  // Nodes (indices, ascending, each once) that read value_id. Served from the
  // use-list, so passes that ask per node stay linear.
  std::vector<int> consumers(int value_id) const;

  // Use-list upkeep. The use-list (value -> reader node indices) is a cache
  // built on the first consumers() call. The methods above and below keep it
  // exact; code that edits `nodes`, `values` or node inputs directly must call
  // invalidate_uses() (the next consumers() rebuilds it, O(n)). A maintained
  // cache rather than a mandatory index because the members are public and
  // older code (families, tests, set_precision's prologue) edits them in place:
  // a stale cache is caught by the verifier (uses_are_current), a missing one
  // just costs a rebuild.
  void invalidate_uses() const { uses_valid_ = false; }
  // Replaces node `node`'s inputs, updating the use-list.
  void set_node_inputs(int node, const std::vector<int>& new_inputs);
  // Moves node `from`'s outputs to node `to` (which now produces them) and
  // detaches `from`: no inputs, no outputs. Detached nodes are dropped by
  // canonicalize(); until then they read nothing and produce nothing. `to`'s
  // own outputs are dropped, so fusions call it only where `from` is the sole
  // reader of all of them and both ops have as many outputs (the verifier
  // checks every node's output count against its op).
  void hand_over_outputs(int from, int to);
  // False when the cached use-list disagrees with the nodes (someone edited
  // them without invalidate_uses()); true when it matches or is not built.
  bool uses_are_current() const;
  bool is_graph_output(int value_id) const;
  int count_ops(Op op) const;
  const Node* find_node(const std::string& name) const;

  // Recomputes producer links, sorts nodes topologically (stable: keeps the
  // existing order where dependencies allow), and drops values nothing refers to.
  void canonicalize();
  // Re-runs shape inference over all nodes (after changing input shapes),
  // setting every output's dtype and shape.
  void infer_shapes();

 private:
  void build_uses() const;
  void add_use(int value_id, int node);
  void drop_use(int value_id, int node);
  mutable std::vector<std::vector<int>> uses_;  // per value: reader node per input slot
  mutable bool uses_valid_ = false;
};

// The dtype and shape of one value, as a shape rule gives it.
struct ValueType {
  DType dtype = DType::F32;
  Shape shape;
  bool operator==(const ValueType&) const = default;
};

// Shape and dtype rule of one node given its inputs: one ValueType per output
// the op produces (a count within ops.def's bounds); throws naming the node.
std::vector<ValueType> infer_outputs(const Graph& g, const Node& n);

// Name add_node gives output k of node `node`: the node's name for k = 0
// (graph outputs and checkpoint names stay as they were), "<node>:k" after.
std::string output_value_name(const std::string& node, size_t k);

}  // namespace kiln
