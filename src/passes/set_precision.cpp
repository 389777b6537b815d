// f32 graph ==> f16/bf16 graph: constants are rounded once (RNE), every float
// activation is stored in the narrow type, and casts at the graph boundary
// keep the engine's inputs and outputs f32 (the pixel_values contract).
//
// f32 islands: a node with attribute precision = "f32" (set by a family where
// 16-bit storage is known to change results, e.g. RT-DETR's anchors and
// top-k scores) keeps its outputs and the constants only it reads in f32; a
// constant it shares with 16-bit nodes is duplicated in f32 for it, and a Cast
// is inserted wherever a value crosses between an island and the 16-bit rest.
// Without such nodes the result is exactly the plain narrowing above.
#include <map>

#include "core/error.hpp"
#include "passes/pass.hpp"

namespace kiln {

namespace {

// Island nodes reading `from` read `to` instead.
void rewire_islands(Graph& g, int from, int to) {
  for (auto& n : g.nodes)
    if (keeps_f32(n))
      for (int& in : n.inputs)
        if (in == from) in = to;
  g.invalidate_uses();
}

// The node reading `v` as dtype `to`: one Cast per (value, dtype), reused.
int cast_of(Graph& g, int v, DType to, std::map<std::pair<int, DType>, int>& made, std::vector<Node>& out_nodes) {
  const auto key = std::make_pair(v, to);
  if (auto it = made.find(key); it != made.end()) return it->second;
  const std::string name = g.values[v].name + (to == DType::F32 ? ".to_f32" : ".to_narrow");
  g.values.push_back(Value{name, to, g.values[v].shape, std::nullopt, -1, std::nullopt});
  const int nv = static_cast<int>(g.values.size()) - 1;
  Node c;
  c.op = Op::Cast;
  c.name = name;
  c.inputs = {v};
  c.outputs = {nv};
  c.attrs["dtype"] = std::string(dtype_name(to));
  out_nodes.push_back(std::move(c));
  made[key] = nv;
  return nv;
}

}  // namespace

int set_precision(Graph& g, DType dtype) {
  if (dtype == DType::F32) return 0;
  if (dtype != DType::F16 && dtype != DType::BF16) fail_usage("precision ", dtype_name(dtype), " is not supported");
  int count = 0;
  // Constants: narrowed unless only f32-island nodes read them; one shared
  // with 16-bit readers gets an f32 copy for its island readers.
  std::vector<char> island_reader(g.values.size(), 0), narrow_reader(g.values.size(), 0);
  for (const auto& n : g.nodes)
    for (int in : n.inputs) (keeps_f32(n) ? island_reader : narrow_reader)[static_cast<size_t>(in)] = 1;
  const size_t value_count = g.values.size();
  for (size_t v = 0; v < value_count; ++v) {
    if (!g.values[v].constant || g.values[v].dtype != DType::F32) continue;
    if (island_reader[v] && !narrow_reader[v]) continue;
    if (island_reader[v]) {
      Value copy = g.values[v];
      copy.name += ".f32";
      g.values.push_back(std::move(copy));
      rewire_islands(g, static_cast<int>(v), static_cast<int>(g.values.size()) - 1);
    }
    auto& val = g.values[v];
    val.constant = HostTensor::from_f32_as(dtype, val.shape, val.constant->to_f32());
    val.dtype = dtype;
    ++count;
  }
  const std::vector<int> old_inputs = g.inputs;
  const std::vector<int> old_outputs = g.outputs;
  // Narrow every f32 activation first (every output of every node; integer
  // results such as top_k's indices keep their type), then re-widen the
  // graph boundary.
  for (auto& n : g.nodes) {
    if (keeps_f32(n)) continue;
    for (int o : n.outputs)
      if (g.values[o].dtype == DType::F32) g.values[o].dtype = dtype;
    // Quantized layers and dequantize name their wide output type: it narrows too.
    for (const char* key : {"out_dtype", "dtype"})
      if (n.op != Op::Cast && n.op != Op::Quantize && n.has_attr(key) && n.attr_str(key) == "f32")
        n.attrs[key] = std::string(dtype_name(dtype));
  }
  // Island boundaries inside the graph: a float activation read in the other
  // precision goes through one Cast (set_precision's own casts come later).
  {
    std::map<std::pair<int, DType>, int> made;
    std::vector<Node> nodes;
    nodes.reserve(g.nodes.size());
    for (auto& n : g.nodes) {
      if (n.op != Op::Cast)
        for (int& in : n.inputs) {
          const Value& v = g.values[static_cast<size_t>(in)];
          const DType want = keeps_f32(n) ? DType::F32 : dtype;
          if (v.constant || v.producer < 0 || (v.dtype != DType::F32 && v.dtype != dtype) || v.dtype == want) continue;
          in = cast_of(g, in, want, made, nodes);
          ++count;
        }
      nodes.push_back(std::move(n));
    }
    g.nodes = std::move(nodes);
    g.invalidate_uses();
  }
  std::vector<Node> prologue;
  for (int in : old_inputs) {
    if (g.values[in].dtype != DType::F32) continue;
    Value cast_out{g.values[in].name + ".cast", dtype, g.values[in].shape, std::nullopt, -1, std::nullopt};
    g.values.push_back(cast_out);
    int nv = static_cast<int>(g.values.size()) - 1;
    replace_uses(g, in, nv);
    rewire_islands(g, nv, in);  // island nodes read the f32 input itself
    Node c;
    c.op = Op::Cast;
    c.name = g.values[in].name + ".cast";
    c.inputs = {in};
    c.outputs = {nv};
    c.attrs["dtype"] = std::string(dtype_name(dtype));
    prologue.push_back(std::move(c));
    ++count;
  }
  g.nodes.insert(g.nodes.begin(), prologue.begin(), prologue.end());
  g.invalidate_uses();  // node indices shifted
  for (size_t k = 0; k < old_outputs.size(); ++k) {
    int out = g.outputs[k];
    if (g.values[out].dtype != dtype) continue;  // not narrowed (indices): handed out as it is
    std::string name = g.values[out].name;
    // The graph output keeps its public name ("logits"); the narrow value is renamed.
    g.values[out].name = name + ".narrow";
    g.canonicalize();
    out = g.outputs[k];
    g.outputs.erase(g.outputs.begin() + static_cast<long>(k));
    int wide = g.add_node(Op::Cast, name, {out}, {{"dtype", std::string("f32")}});
    g.outputs.insert(g.outputs.begin() + static_cast<long>(k), wide);
    ++count;
  }
  g.canonicalize();
  return count;
}

}  // namespace kiln
