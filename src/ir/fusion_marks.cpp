#include "ir/fusion_marks.hpp"

#include "core/error.hpp"
#include "ir/attrs.hpp"
#include "ir/quant_form.hpp"

namespace kiln {

namespace {

bool read_only_by(const Graph& g, int value, size_t node) {
  const auto readers = g.consumers(value);
  return readers.size() == 1 && static_cast<size_t>(readers[0]) == node && !g.is_graph_output(value);
}

bool pointwise_with_bias(const Graph& g, const Node& n) {
  if (n.op != Op::Conv2d || n.inputs.size() != 3) return false;
  const Shape& ws = g.values[n.inputs[1]].shape;
  const ConvAttrs a = conv_attrs(n);
  return ws.size() == 4 && ws[2] == 1 && ws[3] == 1 && a.groups == 1 && a.stride_h == 1 && a.stride_w == 1 && a.pad_t == 0 &&
         a.pad_l == 0 && a.pad_b == 0 && a.pad_r == 0;
}

int mark_int(const Node& n, const char* key) {
  auto it = n.attrs.find(key);
  if (it == n.attrs.end()) return 0;
  const int64_t* v = std::get_if<int64_t>(&it->second);
  return v ? static_cast<int>(*v) : -1;  // -1: present but not an integer
}

}  // namespace

std::string input_add_problem(const Graph& g, size_t conv) {
  const Node& c = g.nodes[conv];
  if (c.op != Op::Conv2d) return cat(c.name, ": ", kMarkInputAdd, " on a ", op_name(c.op), " (only conv2d)");
  const int x = c.inputs[0];
  const int p = g.values[x].producer;
  if (p < 0 || g.nodes[p].op != Op::Add) return cat(c.name, ": its input is not an add's output");
  const Node& add = g.nodes[p];
  if (add.activation() != Activation::None) return cat(c.name, ": its input add ", add.name, " has an activation");
  if (is_8bit(g.values[x].dtype)) return cat(c.name, ": its input add ", add.name, " writes ", dtype_name(g.values[x].dtype), " codes (an 8-bit layer reads them stored)");
  if (!read_only_by(g, x, conv)) return cat(c.name, ": ", add.name, "'s output has other readers or is a graph output");
  for (size_t k = 1; k < c.inputs.size(); ++k)
    if (c.inputs[k] == x) return cat(c.name, ": reads ", add.name, "'s output as more than its input");
  const Shape& s = g.values[x].shape;
  for (int in : add.inputs) {
    if (g.is_constant(in)) return cat(c.name, ": ", add.name, " has a constant operand");
    if (g.values[in].shape != s) return cat(c.name, ": ", add.name, "'s operands differ in shape");
  }
  return "";
}

int input_add_of(const Graph& g, size_t conv) {
  const Node& c = g.nodes[conv];
  if (c.op != Op::Conv2d || mark_int(c, kMarkInputAdd) != 1) return -1;
  return g.values[c.inputs[0]].producer;
}

std::optional<SqueezeExcitation> squeeze_excitation_at(const Graph& g, size_t mul, std::string* why) {
  auto no = [&](const std::string& s) -> std::optional<SqueezeExcitation> {
    if (why) *why = cat(g.nodes[mul].name, ": ", s);
    return std::nullopt;
  };
  const Node& m = g.nodes[mul];
  if (m.op != Op::Mul) return no(cat(kMarkSqueezeExcitation, " on a ", op_name(m.op), " (only mul)"));
  const int gate = m.inputs[1];
  const int ie = g.values[gate].producer;
  if (ie < 0 || !pointwise_with_bias(g, g.nodes[ie]) || g.nodes[ie].activation() != Activation::Sigmoid)
    return no("its gate is not a pointwise conv with bias and sigmoid");
  if (!read_only_by(g, gate, mul)) return no("its gate has other readers");
  const Node& e = g.nodes[ie];
  const int ir = g.values[e.inputs[0]].producer;
  if (ir < 0 || !pointwise_with_bias(g, g.nodes[ir])) return no(cat(e.name, " does not read a pointwise conv with bias"));
  if (!read_only_by(g, e.inputs[0], ie)) return no(cat(g.nodes[ir].name, "'s output has other readers"));
  const Node& r = g.nodes[ir];
  const int ip = g.values[r.inputs[0]].producer;
  if (ip < 0 || g.nodes[ip].op != Op::GlobalAvgPool) return no(cat(r.name, " does not read a global average pool"));
  if (!read_only_by(g, r.inputs[0], ir)) return no(cat(g.nodes[ip].name, "'s output has other readers"));
  return SqueezeExcitation{static_cast<size_t>(ip), static_cast<size_t>(ir), static_cast<size_t>(ie), mul};
}

std::string split_run_problem(const Graph& g, size_t first, int64_t count) {
  const Node& a = g.nodes[first];
  if (count < 2) return cat(a.name, ": ", kMarkSplitRun, " must be at least 2, got ", count);
  if (static_cast<int64_t>(g.nodes.size() - first) < count)
    return cat(a.name, ": ", kMarkSplitRun, " ", count, " runs past the last node");
  for (int64_t k = 0; k < count; ++k) {
    const Node& s = g.nodes[first + k];
    if (s.op != Op::Slice || s.inputs[0] != a.inputs[0] || s.attr_int("axis", -1) != 1)
      return cat(a.name, ": ", kMarkSplitRun, " ", count, ": node ", s.name, " is not a channel slice of the same input");
  }
  return "";
}

std::vector<size_t> split_run_at(const Graph& g, size_t first) {
  const int count = g.nodes[first].op == Op::Slice ? mark_int(g.nodes[first], kMarkSplitRun) : 0;
  std::vector<size_t> run = {first};
  for (int k = 1; k < count; ++k) run.push_back(first + k);
  return run;
}

bool on_channel_axis(const Graph& g, const Node& n) {
  return n.attr_int("axis", -1) == 1 && g.values[n.outputs[0]].shape.size() == 4;
}

bool is_channel_view(const Node& n) { return n.op == Op::Slice && mark_int(n, kMarkChannelView) == 1; }

std::vector<int64_t> in_place_inputs(const Node& n) {
  if (n.op != Op::Concat) return {};
  auto it = n.attrs.find(kMarkInPlace);
  if (it == n.attrs.end()) return {};
  const auto* list = std::get_if<std::vector<int64_t>>(&it->second);
  return list ? *list : std::vector<int64_t>{};
}

namespace {

// The concat (other than entry `skip_k` of node `skip`) that lists value `v`
// in its in_place, or -1.
int concat_writing_in_place(const Graph& g, int v, size_t skip, size_t skip_k) {
  for (int c : g.consumers(v)) {
    const Node& n = g.nodes[c];
    for (int64_t k : in_place_inputs(n))
      if (k >= 0 && static_cast<size_t>(k) < n.inputs.size() && n.inputs[k] == v &&
          (static_cast<size_t>(c) != skip || static_cast<size_t>(k) != skip_k))
        return c;
  }
  return -1;
}

}  // namespace

std::string channel_view_problem(const Graph& g, size_t slice) {
  const Node& s = g.nodes[slice];
  if (s.op != Op::Slice) return cat(s.name, ": ", kMarkChannelView, " on a ", op_name(s.op), " (only slice)");
  if (!on_channel_axis(g, s)) return cat(s.name, ": ", kMarkChannelView, " on a slice that is not along axis 1 of a 4-D value");
  if (g.is_graph_output(s.outputs[0])) return cat(s.name, ": ", kMarkChannelView, " on a slice whose output is a graph output");
  // Constants live outside the activation arena (the CUDA backend's weights
  // are their own buffers), so a window of one has no arena address.
  if (g.is_constant(s.inputs[0])) return cat(s.name, ": ", kMarkChannelView, " on a slice of a constant");
  if (g.values[s.outputs[0]].dtype != g.values[s.inputs[0]].dtype)
    return cat(s.name, ": ", kMarkChannelView, " on a slice that writes ", dtype_name(g.values[s.outputs[0]].dtype), " codes (it converts)");
  // The concat side (in_place_input_problem) states these two as well; here
  // they keep fuse_channel_views from marking a slice against an existing
  // in_place mark.
  for (const int v : {s.inputs[0], s.outputs[0]})
    if (const int c = concat_writing_in_place(g, v, g.nodes.size(), 0); c >= 0)
      return cat(s.name, ": ", kMarkChannelView, " on a slice whose ", v == s.inputs[0] ? "input" : "output", " '",
                 g.values[v].name, "' ", g.nodes[c].name, " writes in place (", kMarkInPlace, ")");
  return "";
}

std::string in_place_input_problem(const Graph& g, size_t concat, size_t k) {
  const Node& n = g.nodes[concat];
  const int v = n.inputs[k];
  auto no = [&](const std::string& why) { return cat(n.name, ": ", kMarkInPlace, " input ", k, " ('", g.values[v].name, "') ", why); };
  if (g.is_constant(v)) return no("is a constant");
  const int p = g.values[v].producer;
  if (p < 0) return no("is a graph input");
  if (g.is_graph_output(v)) return no("is a graph output");
  if (is_channel_view(g.nodes[p])) return no(cat("is a view (", g.nodes[p].name, " is a channel_view)"));
  if (g.values[v].dtype != g.values[n.outputs[0]].dtype)
    return no(cat("is ", dtype_name(g.values[v].dtype), ", the concat writes ", dtype_name(g.values[n.outputs[0]].dtype),
                  " (it converts: not in place)"));
  // The backends tell an in-place input by its value (parent == the concat's
  // output), so a value the concat reads twice cannot be in place at one
  // position and copied to the other: it is copied to both.
  for (size_t j = 0; j < n.inputs.size(); ++j)
    if (j != k && n.inputs[j] == v) return no(cat("is also input ", j, " of ", n.name, " (a value read twice is copied)"));
  if (const int c = concat_writing_in_place(g, v, concat, k); c >= 0)
    return no(cat("is also written in place into ", g.nodes[c].name));
  for (int r : g.consumers(v))
    if (is_channel_view(g.nodes[r])) return no(cat("has a window: ", g.nodes[r].name, " is a channel_view of it"));
  // The old planner also refused an input that is the root of the concat's
  // own output: in a graph in topological order (the verifier's) it never is.
  return "";
}

namespace {

std::string in_place_problem(const Graph& g, size_t concat) {
  const Node& n = g.nodes[concat];
  if (n.op != Op::Concat) return cat(n.name, ": ", kMarkInPlace, " on a ", op_name(n.op), " (only concat)");
  const auto it = n.attrs.find(kMarkInPlace);
  const auto* list = std::get_if<std::vector<int64_t>>(&it->second);
  if (!list || list->empty()) return cat(n.name, ": mark ", kMarkInPlace, " must be a non-empty list of input indices");
  if (!on_channel_axis(g, n)) return cat(n.name, ": ", kMarkInPlace, " on a concat that is not along axis 1 of a 4-D value");
  for (size_t j = 0; j < list->size(); ++j) {
    const int64_t k = (*list)[j];
    if (k < 0 || k >= static_cast<int64_t>(n.inputs.size()))
      return cat(n.name, ": ", kMarkInPlace, " input ", k, " is out of range (", n.inputs.size(), " inputs)");
    if (j > 0 && k <= (*list)[j - 1]) return cat(n.name, ": ", kMarkInPlace, " must list input indices in ascending order, once each");
    if (std::string why = in_place_input_problem(g, concat, static_cast<size_t>(k)); !why.empty()) return why;
  }
  return "";
}

}  // namespace

std::string fusion_mark_problem(const Graph& g, size_t i) {
  const Node& n = g.nodes[i];
  for (const char* key : {kMarkInputAdd, kMarkSqueezeExcitation, kMarkChannelView}) {
    const int v = mark_int(n, key);
    if (v == 0 && !n.has_attr(key)) continue;
    if (v != 1) return cat(n.name, ": mark ", key, " must be the integer 1");
  }
  if (n.has_attr(kMarkInputAdd)) {
    const std::string why = input_add_problem(g, i);
    if (!why.empty()) return why;
  }
  if (n.has_attr(kMarkSqueezeExcitation)) {
    std::string why;
    if (!squeeze_excitation_at(g, i, &why)) return why;
  }
  if (n.has_attr(kMarkChannelView)) {
    const std::string why = channel_view_problem(g, i);
    if (!why.empty()) return why;
  }
  if (n.has_attr(kMarkInPlace)) {
    const std::string why = in_place_problem(g, i);
    if (!why.empty()) return why;
  }
  if (n.has_attr(kMarkSplitRun)) {
    const int v = mark_int(n, kMarkSplitRun);
    if (v < 0) return cat(n.name, ": mark ", kMarkSplitRun, " must be an integer");
    if (n.op != Op::Slice) return cat(n.name, ": ", kMarkSplitRun, " on a ", op_name(n.op), " (only slice)");
    return split_run_problem(g, i, v);
  }
  return "";
}

}  // namespace kiln
