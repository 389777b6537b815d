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

std::string print_graph(const Graph& g) {
  std::ostringstream os;
  auto ref = [&](int v) {
    const Value& val = g.values[v];
    return val.constant ? "@" + val.name : "%" + std::to_string(v);
  };
  for (int v : g.inputs)
    os << "input %" << v << " \"" << g.values[v].name << "\" : " << dtype_name(g.values[v].dtype)
       << shape_str(g.values[v].shape) << "\n";
  for (const Node& n : g.nodes) {
    const Value& out = g.values[n.outputs[0]];
    os << "%" << n.outputs[0] << " = " << op_name(n.op) << " \"" << n.name << "\"(";
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
    os << " : " << dtype_name(out.dtype) << shape_str(out.shape) << "\n";
  }
  for (int v : g.outputs) os << "output %" << v << " \"" << g.values[v].name << "\"\n";
  return os.str();
}

}  // namespace kiln
