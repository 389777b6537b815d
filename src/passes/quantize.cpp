// quantize: applies a recipe's selection and the calibrated scales (issue 13;
// docs/quantization.md "Graph form"). Runs on the f32 graph after
// fold_batchnorm and the activation / residual fusions, before set_precision.
//
// For every selected conv2d / linear:
//   - the weight (BatchNorm already folded in) becomes 8-bit codes with one
//     scale per output channel (amax / code_max, quant::weight_quant);
//   - its input x is read as 8-bit codes with x's static per-tensor scale:
//     either x's producer is itself a selected layer whose every reader is a
//     selected layer reading it as its input (then the producer writes codes:
//     the output quantize folded into its epilogue, out_dtype = the code
//     type), or a quantize node is inserted after x (one per value, shared by
//     all its quantized readers);
//   - its output is wide (out_dtype = x's old type: the dequantize folded
//     into the epilogue, alpha = s_x * s_w) unless it is folded as above.
// With residuals_8bit (the recipe's default) a producer also writes codes when
// some of its selected readers take the value as their residual (the skip of
// a ResNet block: the next block's conv1 reads it as x, its conv3 as the
// residual its epilogue adds, code * scale): one 8-bit tensor, no quantize
// kernel, half the bytes of the skip. A residual whose producer does not write
// codes stays wide (no quantize node is made for a residual alone).
// Then every quantize whose input comes from a max_pool2d, mul, add (none or
// ReLU), concat or slice that nothing else reads moves into that producer
// (out_dtype = the code type, the quantize's one scale on its output): the
// stem's pool, the squeeze-excitation gate, Res2Net's chunk slices, chain
// adds and concat write codes from their own kernel (fold_into_producers below).
// Node names are kept; a quantize node is named "<value>.quantize".
#include <algorithm>
#include <map>
#include <set>

#include "core/error.hpp"
#include "ir/quant_form.hpp"
#include "passes/pass.hpp"
#include "quant/fp8.hpp"
#include "quant/layer.hpp"
#include "quant/recipe.hpp"

namespace kiln {

namespace {

// Whether producer p may take over quantize node q (q its only reader): an op
// that can write codes (ir/quant_form.hpp), not writing them already, one
// scale for the tensor; an add only with no activation or ReLU (every backend
// computes those exactly in f32, so the CPU emulation stays bit-exact).
bool producer_takes_quantize(const Graph& g, const Node& p, const Node& q) {
  if (!can_write_codes(p.op) || p.has_attr("out_dtype") || p.outputs.size() != 1) return false;
  if (p.op == Op::Add && p.activation() != Activation::None && p.activation() != Activation::Relu) return false;
  for (int in : p.inputs)
    if (!is_wide_float(g.values[in].dtype)) return false;
  const auto& s = g.values[q.outputs[0]].quant;
  return s && s->axis < 0 && s->scales.size() == 1;
}

int fold_into_producers(Graph& g) {
  int folded = 0;
  for (size_t qi = 0; qi < g.nodes.size(); ++qi) {
    const Node& q = g.nodes[qi];
    if (q.op != Op::Quantize || q.inputs.size() != 1) continue;
    const int x = q.inputs[0], p = g.values[x].producer;
    if (p < 0 || !single_use(g, x) || !producer_takes_quantize(g, g.nodes[p], q)) continue;
    const std::string code = q.attr_str("dtype");
    g.hand_over_outputs(static_cast<int>(qi), p);  // p now writes the codes its reader reads; x is dropped
    g.nodes[p].attrs["out_dtype"] = code;
    ++folded;
  }
  return folded;
}

}  // namespace

int quantize_layers(Graph& g, const std::vector<int>& nodes, const quant::ActivationScales& scales, bool residuals_8bit) {
  const DType code = scales.precision;
  if (!is_8bit(code)) fail_usage("quantize: precision ", dtype_name(code), " is not fp8 (f8e4m3) or int8");
  const std::set<int> selected(nodes.begin(), nodes.end());
  for (int i : nodes) {
    if (i < 0 || static_cast<size_t>(i) >= g.nodes.size()) fail_runtime("quantize: node index ", i, " out of range");
    const Node& n = g.nodes[i];
    if (!quant::is_quantization_candidate(g, n)) fail_usage("quantize: ", n.name, " is not a conv2d or linear with a constant weight");
    if (!is_wide_float(g.values[n.inputs[0]].dtype))
      fail_usage("quantize: ", n.name, " reads ", dtype_name(g.values[n.inputs[0]].dtype), " (run before set_precision, on a float graph)");
    const Shape& ws = g.values[n.inputs[1]].shape;
    if (shape_numel(ws) / std::max<int64_t>(1, ws[0]) >= quant::kMaxExactReduction)
      fail_usage("quantize: ", n.name, " reduces over more than ", quant::kMaxExactReduction, " products; exclude it from the recipe");
  }
  // Which selected layers write codes: every reader selected, reading the
  // value once, as its input (or, with residuals_8bit, as its residual: conv2d input 3).
  std::set<int> folded;
  for (int i : nodes) {
    const int y = g.nodes[i].outputs[0];
    const std::vector<int> readers = g.consumers(y);
    bool ok = !readers.empty() && !g.is_graph_output(y);
    for (int r : readers) {
      const Node& c = g.nodes[r];
      const bool as_x = c.inputs[0] == y;
      const bool as_residual = residuals_8bit && c.op == Op::Conv2d && c.inputs.size() > 3 && c.inputs[3] == y;
      ok = ok && selected.count(r) && (as_x || as_residual) && std::count(c.inputs.begin(), c.inputs.end(), y) == 1;
    }
    if (ok) folded.insert(i);
  }
  const std::string code_name = dtype_name(code);
  int rewrites = 0;
  // Weights: codes with per-output-channel scales. A weight another node also reads gets its own copy.
  for (int i : nodes) {
    const int w = g.nodes[i].inputs[1];
    Value& wv = g.values[w];
    const HostTensor real = HostTensor::from_f32(wv.shape, wv.constant->to_f32());
    const QuantParams q = quant::weight_quant(real, code);
    HostTensor codes = quant::quantize_tensor(real, q, quant::Int8Range::Narrow);
    if (g.consumers(w).size() == 1) {
      wv.constant = std::move(codes);
      wv.dtype = code;
      wv.quant = q;
    } else {
      const int copy = g.add_constant(wv.name + "." + code_name, std::move(codes));
      g.values[copy].quant = q;
      std::vector<int> ins = g.nodes[i].inputs;
      ins[1] = copy;
      g.set_node_inputs(i, ins);
    }
  }
  // Inputs: codes from a folded producer, or from a quantize node shared per value.
  std::map<int, int> quantized_of;  // wide value -> its quantize node's output
  for (int i : nodes) {
    const int x = g.nodes[i].inputs[0];
    const int p = g.values[x].producer;
    const float s = scales.scale(g.values[x].name);
    if (p >= 0 && folded.count(p)) continue;  // the producer writes codes (below)
    auto it = quantized_of.find(x);
    if (it == quantized_of.end()) {
      const std::string name = g.values[x].name + ".quantize";
      const int q = g.add_node(Op::Quantize, name, {x}, {{"dtype", code_name}});
      g.values[q].quant = QuantParams{{s}, -1, code};
      it = quantized_of.emplace(x, q).first;
      ++rewrites;
    }
    std::vector<int> ins = g.nodes[i].inputs;
    ins[0] = it->second;
    g.set_node_inputs(i, ins);
  }
  // Outputs: codes (folded) or the wide type the layer had.
  for (int i : nodes) {
    Node& n = g.nodes[i];
    const int y = n.outputs[0];
    if (folded.count(i)) {
      n.attrs["out_dtype"] = code_name;
      g.values[y].quant = QuantParams{{scales.scale(g.values[y].name)}, -1, code};
    } else {
      n.attrs["out_dtype"] = std::string(dtype_name(g.values[y].dtype));
    }
    ++rewrites;
  }
  rewrites += fold_into_producers(g);
  g.canonicalize();  // quantize nodes were appended: back into topological order
  g.infer_shapes();  // code dtypes through the rules
  for (const Node& n : g.nodes)
    if (const std::string why = quant_node_problem(g, n); !why.empty()) fail_runtime("quantize: ", why);
  return rewrites;
}

}  // namespace kiln
