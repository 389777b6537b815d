#include "ir/quant_form.hpp"

#include "core/error.hpp"

namespace kiln {

bool is_quantized_layer(const Graph& g, const Node& n) {
  return (n.op == Op::Conv2d || n.op == Op::Linear) && !n.inputs.empty() && is_8bit(g.values.at(n.inputs[0]).dtype);
}

bool can_write_codes(Op op) {
  return op == Op::MaxPool2d || op == Op::Mul || op == Op::Add || op == Op::Concat || op == Op::Slice;
}

bool writes_codes(const Graph& g, const Node& n) {
  return can_write_codes(n.op) && !n.outputs.empty() && is_8bit(g.values.at(n.outputs[0]).dtype) && n.has_attr("out_dtype");
}

namespace {

// What a value's scales may be: one (per tensor); one, or one per index of
// axis 0 (weights: per output channel); one, or one per index of any axis.
enum class Scales { Tensor, TensorOrAxis0, Any };

// Value v holds codes of its dtype with scales of the kind `kind` allows.
std::string scales_problem(const Node& n, const Value& v, Scales kind) {
  if (!v.quant) return cat(n.name, ": 8-bit value '", v.name, "' (", dtype_name(v.dtype), ") has no quantization scales");
  if (v.quant->dtype != v.dtype)
    return cat(n.name, ": value '", v.name, "' is ", dtype_name(v.dtype), " but its scales are for ", dtype_name(v.quant->dtype));
  if (const std::string why = quant_problem(v, *v.quant); !why.empty()) return cat(n.name, ": value '", v.name, "' ", why);
  const bool per_tensor = v.quant->axis < 0 && v.quant->scales.size() == 1;
  if (per_tensor || kind == Scales::Any || (kind == Scales::TensorOrAxis0 && v.quant->axis == 0)) return "";
  return cat(n.name, ": value '", v.name, "' needs ",
             kind == Scales::Tensor ? "one scale (per tensor)" : "one scale or one per output channel (axis 0)");
}

}  // namespace

std::string quant_node_problem(const Graph& g, const Node& n) {
  auto val = [&](int id) -> const Value& { return g.values.at(id); };
  switch (n.op) {
    case Op::Quantize: return scales_problem(n, val(n.outputs.at(0)), Scales::Any);
    case Op::Dequantize: return scales_problem(n, val(n.inputs.at(0)), Scales::Any);
    case Op::Conv2d:
    case Op::Linear: {
      if (!is_quantized_layer(g, n)) break;
      if (std::string why = scales_problem(n, val(n.inputs[0]), Scales::Tensor); !why.empty()) return why;
      const Value& w = val(n.inputs.at(1));
      if (!w.constant) return cat(n.name, ": the weight '", w.name, "' of a quantized layer must be a constant");
      if (std::string why = scales_problem(n, w, Scales::TensorOrAxis0); !why.empty()) return why;
      if (n.inputs.size() > 3 && is_8bit(val(n.inputs[3]).dtype)) {
        // An 8-bit residual holds codes of x's type with one scale (the epilogue adds code * scale).
        const Value& r = val(n.inputs[3]);
        if (r.dtype != val(n.inputs[0]).dtype)
          return cat(n.name, ": residual '", r.name, "' is ", dtype_name(r.dtype), " but the layer reads ",
                     dtype_name(val(n.inputs[0]).dtype), " codes (an 8-bit residual has the input's code type)");
        if (std::string why = scales_problem(n, r, Scales::Tensor); !why.empty()) return why;
      }
      const Value& y = val(n.outputs.at(0));
      if (is_8bit(y.dtype)) return scales_problem(n, y, Scales::Tensor);
      return "";
    }
    case Op::MaxPool2d:
    case Op::Mul:
    case Op::Add:
    case Op::Concat:
    case Op::Slice:
      if (writes_codes(g, n)) return scales_problem(n, val(n.outputs.at(0)), Scales::Tensor);
      break;
    default: break;
  }
  // Any other node reads no quantized codes (8-bit values with scales): they
  // mean code * scale, which only dequantize and the quantized layers apply.
  // (An 8-bit value without scales is plain storage, as the IR allows.)
  for (int v : n.inputs)
    if (is_8bit(val(v).dtype) && val(v).quant && !(n.op == Op::Conv2d || n.op == Op::Linear))
      return cat(n.name, ": ", op_name(n.op), " reads quantized value '", val(v).name,
                 "' (only quantized conv2d/linear and dequantize read codes with scales)");
  return "";
}

}  // namespace kiln
