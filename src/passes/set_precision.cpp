// f32 graph ==> f16/bf16 graph: constants are rounded once (RNE), every float
// activation is stored in the narrow type, and casts at the graph boundary
// keep the engine's inputs and outputs f32 (the pixel_values contract).
#include "core/error.hpp"
#include "passes/pass.hpp"

namespace kiln {

int set_precision(Graph& g, DType dtype) {
  if (dtype == DType::F32) return 0;
  if (dtype != DType::F16 && dtype != DType::BF16) fail_usage("precision ", dtype_name(dtype), " is not supported");
  int count = 0;
  for (auto& v : g.values) {
    if (v.constant && v.dtype == DType::F32) {
      v.constant = HostTensor::from_f32_as(dtype, v.shape, v.constant->to_f32());
      v.dtype = dtype;
      ++count;
    }
  }
  const std::vector<int> old_inputs = g.inputs;
  const std::vector<int> old_outputs = g.outputs;
  // Narrow every f32 activation first (every output of every node; integer
  // results such as top_k's indices keep their type), then re-widen the
  // graph boundary.
  for (auto& n : g.nodes) {
    for (int o : n.outputs)
      if (g.values[o].dtype == DType::F32) g.values[o].dtype = dtype;
    // Quantized layers and dequantize name their wide output type: it narrows too.
    for (const char* key : {"out_dtype", "dtype"})
      if (n.op != Op::Cast && n.op != Op::Quantize && n.has_attr(key) && n.attr_str(key) == "f32")
        n.attrs[key] = std::string(dtype_name(dtype));
  }
  std::vector<Node> prologue;
  for (int in : old_inputs) {
    if (g.values[in].dtype != DType::F32) continue;
    Value cast_out{g.values[in].name + ".cast", dtype, g.values[in].shape, std::nullopt, -1, std::nullopt};
    g.values.push_back(cast_out);
    int nv = static_cast<int>(g.values.size()) - 1;
    replace_uses(g, in, nv);
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
