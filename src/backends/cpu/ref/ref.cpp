// Dispatch of the plain reference over the op table, and the graph walk.
#include "backends/cpu/ref/ref.hpp"

#include <cmath>

#include "core/error.hpp"
#include "core/half.hpp"
#include "ir/quant_form.hpp"
#include "quant/fp8.hpp"

// The reference must know every op and activation: a new enumerator without
// a case here is a compile error (-Wswitch-enum warns despite the defaults,
// which catch corrupt values at run time).
#pragma GCC diagnostic push
#pragma GCC diagnostic error "-Wswitch-enum"

namespace kiln::ref {

double activate(Activation a, double x) {
  switch (a) {
    case Activation::None: return x;
    case Activation::Relu: return x > 0 ? x : 0;
    case Activation::Relu6: return x < 0 ? 0 : (x > 6 ? 6 : x);
    case Activation::Silu: return x / (1 + std::exp(-x));
    case Activation::Sigmoid: return 1 / (1 + std::exp(-x));
    case Activation::Gelu: return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0)));  // exact (erf) GELU
    default: fail_runtime("reference: unknown activation ", static_cast<int>(a));
  }
}

std::vector<Buffer> run_reference(const Graph& g, const Node& n, const std::vector<Buffer>& inputs) {
  if (inputs.size() != n.inputs.size())
    fail_runtime(n.name, ": reference got ", inputs.size(), " inputs, the node has ", n.inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i)
    if (static_cast<int64_t>(inputs[i].size()) != shape_numel(g.values[n.inputs[i]].shape))
      fail_runtime(n.name, ": reference input ", i, " has ", inputs[i].size(), " values for shape ",
                   shape_str(g.values[n.inputs[i]].shape));
  const OpArgs a{g, n, inputs};
  std::vector<Buffer> ys;
  switch (n.op) {
    case Op::Conv2d: ys.push_back(conv2d(a)); break;
    case Op::BatchNorm: ys.push_back(batch_norm(a)); break;
    case Op::Activation: ys.push_back(activation(a)); break;
    case Op::Add: ys.push_back(add(a)); break;
    case Op::Mul: ys.push_back(mul(a)); break;
    case Op::MaxPool2d: ys.push_back(max_pool2d(a)); break;
    case Op::AvgPool2d: ys.push_back(avg_pool2d(a)); break;
    case Op::GlobalAvgPool: ys.push_back(global_avg_pool(a)); break;
    case Op::Flatten: ys.push_back(flatten(a)); break;
    case Op::Linear: ys.push_back(linear(a)); break;
    case Op::Concat: ys.push_back(concat(a)); break;
    case Op::Slice: ys.push_back(slice(a)); break;
    case Op::Cast: ys.push_back(cast(a)); break;
    case Op::TopK: ys = top_k(a); break;
    case Op::LayerNorm: ys.push_back(layer_norm(a)); break;
    case Op::Softmax: ys.push_back(softmax(a)); break;
    case Op::MatMul: ys.push_back(matmul(a)); break;
    case Op::Transpose: ys.push_back(transpose(a)); break;
    case Op::Reshape: ys.push_back(reshape(a)); break;
    case Op::UpsampleNearest: ys.push_back(upsample_nearest(a)); break;
    case Op::Gather: ys.push_back(gather(a)); break;
    case Op::InverseSigmoid: ys.push_back(inverse_sigmoid(a)); break;
    case Op::MsDeformAttn: ys.push_back(ms_deform_attn(a)); break;
    case Op::Attention: ys.push_back(attention(a)); break;
    case Op::Quantize: ys.push_back(quantize(a)); break;
    case Op::Dequantize: ys.push_back(dequantize(a)); break;
    default: fail_runtime(n.name, ": the reference has no implementation of op ", static_cast<int>(n.op));
  }
  if (ys.size() != n.outputs.size())
    fail_runtime(n.name, ": reference ", op_name(n.op), " produced ", ys.size(), " outputs, the node has ", n.outputs.size());
  for (size_t k = 0; k < ys.size(); ++k) {
    const Value& out = g.values[n.outputs[k]];
    if (static_cast<int64_t>(ys[k].size()) != shape_numel(out.shape))
      fail_runtime(n.name, ": reference ", op_name(n.op), " produced ", ys[k].size(), " values for ", shape_str(out.shape));
    if (writes_codes(g, n)) {
      // A producer that writes codes: its f32 result encoded once, as quantize does (ir/quant_form.hpp).
      if (!out.quant || out.quant->scales.size() != 1)
        fail_input(n.name, ": ", op_name(n.op), " writing codes needs one scale on '", out.name, "'");
      const float scale = out.quant->scales[0];
      for (float& v : ys[k]) v = quant::decode(out.dtype, quant::quantize_value(v, scale, out.dtype, quant::Int8Range::Full));
    } else {
      for (float& v : ys[k]) v = round_to_storage(out.dtype, v);
    }
  }
  return ys;
}
#pragma GCC diagnostic pop

std::vector<Buffer> run_reference_graph(const Graph& g, const std::vector<Buffer>& inputs) {
  if (inputs.size() != g.inputs.size()) fail_runtime("reference: ", inputs.size(), " inputs for ", g.inputs.size());
  std::vector<Buffer> values(g.values.size());
  std::vector<char> ready(g.values.size(), 0);
  for (size_t k = 0; k < g.inputs.size(); ++k) {
    // An engine stores its inputs in the input value's type; so does the reference.
    values[g.inputs[k]] = inputs[k];
    for (float& x : values[g.inputs[k]]) x = round_to_storage(g.values[g.inputs[k]].dtype, x);
    ready[g.inputs[k]] = 1;
  }
  for (size_t v = 0; v < g.values.size(); ++v)
    if (g.values[v].constant) values[v] = g.values[v].constant->to_f32(), ready[v] = 1;
  for (const Node& n : g.nodes) {
    std::vector<Buffer> args;
    for (int v : n.inputs) {
      if (!ready[v]) fail_runtime(n.name, ": reference reads value '", g.values[v].name, "' before it is computed");
      args.push_back(values[v]);
    }
    auto outs = run_reference(g, n, args);
    for (size_t k = 0; k < n.outputs.size(); ++k) values[n.outputs[k]] = std::move(outs[k]), ready[n.outputs[k]] = 1;
  }
  std::vector<Buffer> result;
  for (int v : g.outputs) result.push_back(values[v]);
  return result;
}

}  // namespace kiln::ref
