#include "ir/serialize.hpp"

#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "core/float_text.hpp"
#include "ir/verifier.hpp"

namespace kiln {

using nlohmann::json;

namespace {

constexpr size_t kAlign = 64;
constexpr int64_t kMaxValueElements = int64_t{1} << 40;

json attr_to_json(const AttrValue& v) {
  if (auto p = std::get_if<int64_t>(&v)) return *p;
  if (auto d = std::get_if<double>(&v)) return *d;
  if (auto s = std::get_if<std::string>(&v)) return *s;
  return std::get<std::vector<int64_t>>(v);
}

AttrValue attr_from_json(const json& j, const std::string& where) {
  if (j.is_number_integer()) return j.get<int64_t>();
  if (j.is_number_float()) return j.get<double>();
  if (j.is_string()) return j.get<std::string>();
  if (j.is_array()) {
    std::vector<int64_t> r;
    for (const auto& e : j) {
      if (!e.is_number_integer()) fail_input(where, ": attribute lists must hold integers");
      r.push_back(e.get<int64_t>());
    }
    return r;
  }
  fail_input(where, ": unsupported attribute value");
}

const json& need(const json& obj, const char* key, const std::string& where) {
  if (!obj.is_object() || !obj.contains(key)) fail_input(where, ": missing key '", key, "'");
  return obj.at(key);
}

int64_t need_int(const json& obj, const char* key, const std::string& where) {
  const json& v = need(obj, key, where);
  if (!v.is_number_integer()) fail_input(where, ": key '", key, "' must be an integer");
  return v.get<int64_t>();
}

std::vector<int> need_ids(const json& obj, const char* key, const std::string& where, size_t nvalues) {
  const json& v = need(obj, key, where);
  if (!v.is_array()) fail_input(where, ": key '", key, "' must be a list");
  std::vector<int> ids;
  for (const auto& e : v) {
    if (!e.is_number_integer() || e.get<int64_t>() < 0 || e.get<uint64_t>() >= nvalues)
      fail_input(where, ": '", key, "' holds a value id out of range");
    ids.push_back(e.get<int>());
  }
  return ids;
}

// Optional "quant": {"scales": [floats], "axis": int, "dtype": name}; strict,
// since a wrong scale silently scales a whole layer.
QuantParams quant_from_json(const json& jq, const Value& v, const std::string& where) {
  QuantParams q;
  const json& scales = need(jq, "scales", where);
  if (!scales.is_array()) fail_input(where, ": quant scales must be a list");
  for (const auto& s : scales) {
    if (!s.is_number()) fail_input(where, ": quant scales must be numbers");
    q.scales.push_back(s.get<float>());
  }
  q.axis = static_cast<int>(need_int(jq, "axis", where));
  const json& dt = need(jq, "dtype", where);
  auto t = dt.is_string() ? dtype_from_name(dt.get<std::string>()) : std::nullopt;
  if (!t) fail_input(where, ": unknown quant dtype");
  q.dtype = *t;
  const std::string why = quant_problem(v, q);
  if (!why.empty()) fail_input(where, ": ", why);
  return q;
}

}  // namespace

json quant_to_json(const QuantParams& q) {
  return {{"scales", shortest_f32(q.scales)}, {"axis", q.axis}, {"dtype", dtype_name(q.dtype)}};
}

SerializedGraph serialize_graph(const Graph& g) {
  SerializedGraph out;
  json values = json::array();
  for (const Value& v : g.values) {
    json jv = {{"name", v.name}, {"dtype", dtype_name(v.dtype)}, {"shape", v.shape}};
    if (v.constant) {
      size_t off = (out.weights.size() + kAlign - 1) / kAlign * kAlign;
      out.weights.resize(off, 0);
      const size_t nbytes = v.constant->nbytes();
      out.weights.insert(out.weights.end(), v.constant->blob.data, v.constant->blob.data + nbytes);
      jv["data"] = {{"offset", off}, {"nbytes", nbytes}};
    }
    if (v.quant)
      jv["quant"] = quant_to_json(*v.quant);
    values.push_back(std::move(jv));
  }
  json nodes = json::array();
  for (const Node& n : g.nodes) {
    json attrs = json::object();
    for (const auto& [k, v] : n.attrs) attrs[k] = attr_to_json(v);
    nodes.push_back({{"op", op_name(n.op)}, {"name", n.name}, {"inputs", n.inputs}, {"outputs", n.outputs}, {"attrs", attrs}});
  }
  json j = {{"format", kGraphFormat}, {"values", values}, {"nodes", nodes}, {"inputs", g.inputs}, {"outputs", g.outputs}};
  // Compact: graph.json is read by machines (kiln inspect --graph prints it for people), and
  // indentation was a fifth to a third of a quantized bundle's graph.json (a line per scale).
  out.graph_json = j.dump();
  return out;
}

Graph deserialize_graph(const std::string& graph_json, const Blob& weights, const std::string& source) {
  json j = json::parse(graph_json, nullptr, false);
  if (j.is_discarded() || !j.is_object()) fail_input(source, ": not a JSON object");
  if (need_int(j, "format", source) != kGraphFormat)
    fail_input(source, ": graph format ", j["format"].dump(), " is not supported (expected ", kGraphFormat, ")");
  Graph g;
  const json& values = need(j, "values", source);
  if (!values.is_array()) fail_input(source, ": 'values' must be a list");
  for (size_t i = 0; i < values.size(); ++i) {
    const json& jv = values[i];
    std::string where = cat(source, ": value ", i);
    Value v;
    const json& name = need(jv, "name", where);
    if (!name.is_string()) fail_input(where, ": name must be a string");
    v.name = name.get<std::string>();
    where = cat(source, ": value '", v.name, "'");
    const json& dt = need(jv, "dtype", where);
    auto t = dt.is_string() ? dtype_from_name(dt.get<std::string>()) : std::nullopt;
    if (!t) fail_input(where, ": unknown dtype");
    v.dtype = *t;
    const json& shape = need(jv, "shape", where);
    if (!shape.is_array()) fail_input(where, ": shape must be a list");
    if (shape.size() > kMaxRank) fail_input(where, ": rank ", shape.size(), " is more than ", kMaxRank);
    for (const auto& d : shape) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0 || d.get<int64_t>() > (int64_t{1} << 31))
        fail_input(where, ": bad shape");
      v.shape.push_back(d.get<int64_t>());
    }
    // Bounded dims alone still multiply past int64 (three of 2^31); every
    // size computed from a shape (numel, bytes, arena offsets) relies on this.
    int64_t numel = 1;
    for (int64_t d : v.shape)
      if (__builtin_mul_overflow(numel, d, &numel) || numel > kMaxValueElements)
        fail_input(where, ": shape ", shape_str(v.shape), " has more than 2^40 elements");
    if (jv.contains("data")) {
      const json& data = jv["data"];
      int64_t off = need_int(data, "offset", where), nbytes = need_int(data, "nbytes", where);
      HostTensor t{v.dtype, v.shape, {}};
      if (off < 0 || nbytes < 0 || static_cast<uint64_t>(off) > weights.size ||
          static_cast<uint64_t>(nbytes) > weights.size - static_cast<uint64_t>(off))
        fail_input(where, ": data lies outside weights.bin (", weights.size, " bytes)");
      if (static_cast<size_t>(nbytes) != t.nbytes())
        fail_input(where, ": ", nbytes, " bytes of data for ", dtype_name(v.dtype), shape_str(v.shape));
      t.blob.owner = weights.owner;
      t.blob.data = weights.data + off;
      t.blob.size = static_cast<size_t>(nbytes);
      v.constant = std::move(t);
    }
    if (jv.contains("quant")) v.quant = quant_from_json(jv["quant"], v, where);
    g.values.push_back(std::move(v));
  }
  const json& nodes = need(j, "nodes", source);
  if (!nodes.is_array()) fail_input(source, ": 'nodes' must be a list");
  for (size_t i = 0; i < nodes.size(); ++i) {
    const json& jn = nodes[i];
    std::string where = cat(source, ": node ", i);
    Node n;
    const json& op = need(jn, "op", where);
    auto o = op.is_string() ? op_from_name(op.get<std::string>()) : std::nullopt;
    if (!o) fail_input(where, ": unknown op ", op.dump());
    n.op = *o;
    const json& name = need(jn, "name", where);
    if (!name.is_string()) fail_input(where, ": name must be a string");
    n.name = name.get<std::string>();
    where = cat(source, ": node '", n.name, "'");
    n.inputs = need_ids(jn, "inputs", where, g.values.size());
    n.outputs = need_ids(jn, "outputs", where, g.values.size());
    if (const std::string why = output_count_problem(n.op, n.outputs.size()); !why.empty()) fail_input(where, ": ", why);
    const json& attrs = need(jn, "attrs", where);
    if (!attrs.is_object()) fail_input(where, ": attrs must be an object");
    for (const auto& [k, v] : attrs.items()) n.attrs[k] = attr_from_json(v, where);
    if (const std::string why = input_count_problem(n.op, n.inputs.size()); !why.empty()) fail_input(where, ": ", why);
    for (int o : n.outputs) {
      Value& out = g.values[o];
      if (out.constant) fail_input(where, ": output '", out.name, "' is a constant");
      if (out.producer != -1)
        fail_input(where, ": output '", out.name, "' is already produced by node '",
                   out.producer == static_cast<int>(i) ? n.name : g.nodes[out.producer].name, "'");
      out.producer = static_cast<int>(i);
    }
    g.nodes.push_back(std::move(n));
  }
  g.inputs = need_ids(j, "inputs", source, g.values.size());
  g.outputs = need_ids(j, "outputs", source, g.values.size());
  try {
    verify_graph(g, "load");
  } catch (const Error& e) {
    fail_input(source, ": ", e.what());
  }
  return g;
}

}  // namespace kiln
