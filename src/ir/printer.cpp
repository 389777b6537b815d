#include "ir/printer.hpp"

#include <sstream>

namespace kiln {

std::string attr_to_string(const AttrValue& v) {
  std::ostringstream os;
  if (auto p = std::get_if<int64_t>(&v)) os << *p;
  else if (auto d = std::get_if<double>(&v)) os << *d;
  else if (auto s = std::get_if<std::string>(&v)) os << *s;
  else {
    os << "[";
    const auto& l = std::get<std::vector<int64_t>>(v);
    for (size_t i = 0; i < l.size(); ++i) os << (i ? "," : "") << l[i];
    os << "]";
  }
  return os.str();
}

namespace {
// " quant(f8e4m3, axis 0, 3 scales)" or " quant(i8, scale 0.5)"; "" without.
std::string quant_str(const Value& v) {
  if (!v.quant) return "";
  std::ostringstream os;
  os << " quant(" << dtype_name(v.quant->dtype);
  if (v.quant->axis < 0 && v.quant->scales.size() == 1) os << ", scale " << v.quant->scales[0];
  else os << ", axis " << v.quant->axis << ", " << v.quant->scales.size() << " scales";
  os << ")";
  return os.str();
}
}  // namespace

std::string print_graph(const Graph& g) {
  std::ostringstream os;
  auto ref = [&](int v) {
    const Value& val = g.values[v];
    return val.constant ? "@" + val.name : "%" + std::to_string(v);
  };
  for (int v : g.inputs)
    os << "input %" << v << " \"" << g.values[v].name << "\" : " << dtype_name(g.values[v].dtype)
       << shape_str(g.values[v].shape) << quant_str(g.values[v]) << "\n";
  for (const Value& v : g.values)  // only quantized constants: the rest print as @name where used
    if (v.constant && v.quant) os << "const @" << v.name << " : " << dtype_name(v.dtype) << shape_str(v.shape) << quant_str(v) << "\n";
  for (const Node& n : g.nodes) {
    // Every output, in order: "%5, %6 = top_k ... : f32[1,5], i64[1,5]".
    for (size_t k = 0; k < n.outputs.size(); ++k) os << (k ? ", %" : "%") << n.outputs[k];
    os << " = " << op_name(n.op) << " \"" << n.name << "\"(";
    for (size_t i = 0; i < n.inputs.size(); ++i) os << (i ? ", " : "") << ref(n.inputs[i]);
    os << ")";
    if (!n.attrs.empty()) {
      os << " {";
      bool first = true;
      for (const auto& [k, v] : n.attrs) {
        os << (first ? "" : ", ") << k << "=" << attr_to_string(v);
        first = false;
      }
      os << "}";
    }
    os << " :";
    for (size_t k = 0; k < n.outputs.size(); ++k) {
      const Value& out = g.values[n.outputs[k]];
      os << (k ? ", " : " ") << dtype_name(out.dtype) << shape_str(out.shape) << quant_str(out);
    }
    os << "\n";
  }
  for (int v : g.outputs) os << "output %" << v << " \"" << g.values[v].name << "\"\n";
  return os.str();
}

}  // namespace kiln
