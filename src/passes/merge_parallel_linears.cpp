// linear(x, Wa, ba), linear(x, Wb, bb), ...  ==>  linear(x, [Wa; Wb; ...],
// [ba; bb; ...]) and one slice of it along the last axis per original result
// (named as the linear it replaces). Each row of the merged result holds the
// originals' rows side by side, so every slice is exactly what its linear
// computed (the same dot products over the same K). One GEMM instead of
// several: RT-DETR's q_proj and k_proj (both read x + pos), the decoder's
// sampling_offsets and attention_weights (both read query + pos), and the
// decoder layers' value_proj (all read the encoder memory).
//
// Merged only where no copy comes back: every reader of every original
// result is an attention (any input), or a reshape read only by
// ms_deform_attn as its value, offsets or logits. Those readers take a slice
// as a window of each row in place on CUDA (plan_row_windows); the CPU
// copies the windows (memcpy per row). Linears that are quantized (8-bit
// weights), carry an activation or other attributes, or differ in precision
// or bias are left alone; the pass runs after the quantize pass, so recipes
// still select the checkpoint's linears by name.
#include <algorithm>
#include <map>
#include <tuple>

#include "passes/pass.hpp"

namespace kiln {
namespace {

// Whether every reader of v reads rows that a slice of a wider row can give in place.
bool read_as_rows(const Graph& g, int v) {
  const auto readers = g.consumers(v);
  if (readers.empty() || g.is_graph_output(v)) return false;
  for (int r : readers) {
    const Node& n = g.nodes[r];
    if (n.op == Op::Attention) continue;
    if (n.op != Op::Reshape || g.is_graph_output(n.outputs[0])) return false;
    const int ro = n.outputs[0];
    const auto deform = g.consumers(ro);
    if (deform.empty()) return false;
    for (int d : deform) {
      const Node& m = g.nodes[d];
      if (m.op != Op::MsDeformAttn || m.inputs[1] == ro) return false;  // value, offsets or logits; not ref
    }
  }
  return true;
}

// A linear the pass may merge: float weights and bias (not quantized), no
// attribute but precision, its result read as rows.
bool mergeable(const Graph& g, const Node& n) {
  if (n.op != Op::Linear || n.inputs.size() < 2) return false;
  for (const auto& [key, value] : n.attrs)
    if (key != "precision") return false;
  for (size_t k = 1; k < n.inputs.size(); ++k) {
    const Value& c = g.values[n.inputs[k]];
    if (!c.constant || c.dtype != DType::F32) return false;
  }
  const Value& y = g.values[n.outputs[0]];
  return y.dtype == DType::F32 && !y.quant && read_as_rows(g, n.outputs[0]);
}

// "a.b.c.q_proj", "a.b.c.k_proj" -> "a.b.c.{q_proj,k_proj}".
std::string merged_name(const std::vector<std::string>& names) {
  size_t common = names[0].size();
  for (const std::string& s : names) {
    size_t i = 0;
    while (i < common && i < s.size() && s[i] == names[0][i]) ++i;
    common = i;
  }
  const size_t dot = common == 0 ? std::string::npos : names[0].rfind('.', common - 1);  // the shared part ends after a dot
  common = dot == std::string::npos ? 0 : dot + 1;
  std::string out = names[0].substr(0, common) + "{";
  for (size_t i = 0; i < names.size(); ++i) out += (i ? "," : "") + names[i].substr(common);
  return out + "}";
}

}  // namespace

int merge_parallel_linears(Graph& g) {
  // Groups by input, K, bias or not, precision; in node order.
  std::map<std::tuple<int, int64_t, bool, bool>, std::vector<size_t>> groups;
  std::vector<std::tuple<int, int64_t, bool, bool>> order;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    if (!mergeable(g, n)) continue;
    const auto key = std::make_tuple(n.inputs[0], g.values[n.inputs[1]].shape[1], n.inputs.size() > 2, keeps_f32(n));
    if (groups[key].empty()) order.push_back(key);
    groups[key].push_back(i);
  }
  int merged = 0;
  std::map<std::string, std::string> renames;  // slice's temporary name -> its linear's
  for (const auto& key : order) {
    const std::vector<size_t>& members = groups[key];
    if (members.size() < 2) continue;
    std::vector<std::string> names;
    std::vector<float> w, b;
    int64_t rows = 0;
    const int64_t k = std::get<1>(key);
    for (size_t i : members) {
      const Node& n = g.nodes[i];
      names.push_back(n.name);
      const std::vector<float> wi = g.values[n.inputs[1]].constant->to_f32();
      w.insert(w.end(), wi.begin(), wi.end());
      if (n.inputs.size() > 2) {
        const std::vector<float> bi = g.values[n.inputs[2]].constant->to_f32();
        b.insert(b.end(), bi.begin(), bi.end());
      }
      rows += g.values[n.inputs[1]].shape[0];
    }
    const Node first = g.nodes[members[0]];
    const std::string name = merged_name(names);
    std::vector<int> ins = {first.inputs[0], g.add_constant(name + ".weight", HostTensor::from_f32({rows, k}, w))};
    if (std::get<2>(key)) ins.push_back(g.add_constant(name + ".bias", HostTensor::from_f32({rows}, b)));
    Attrs precision;
    if (keeps_f32(first)) precision["precision"] = std::string("f32");
    const int y = g.add_node(Op::Linear, name, ins, precision);
    int64_t start = 0;
    for (size_t i : members) {
      const int old = g.nodes[i].outputs[0];
      const int64_t m = g.values[g.nodes[i].inputs[1]].shape[0];
      Attrs a = precision;
      a["axis"] = int64_t{-1}, a["start"] = start, a["end"] = start + m;
      const std::string temporary = g.nodes[i].name + "#merged";
      renames[temporary] = g.nodes[i].name;
      const int s = g.add_node(Op::Slice, temporary, {y}, a);
      replace_uses(g, old, s);
      start += m;
    }
    merged += static_cast<int>(members.size());
  }
  if (!merged) return 0;
  eliminate_dead_nodes(g);  // the original linears, read by nobody now
  for (Node& n : g.nodes)  // the slices take their linears' names
    if (const auto it = renames.find(n.name); it != renames.end()) n.name = it->second;
  return merged;
}

}  // namespace kiln
