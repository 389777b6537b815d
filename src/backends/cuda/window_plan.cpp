#include "backends/cuda/window_plan.hpp"

#include <algorithm>

#include "core/error.hpp"
#include "ir/attrs.hpp"

namespace kiln::cuda {

namespace {

int as_int(int64_t v) { return static_cast<int>(v); }

bool touches_view(const ChannelViews& cv, const Node& n) {
  bool t = cv.is_view(n.outputs[0]);
  for (int in : n.inputs) t |= cv.is_view(in);
  return t;
}

std::string conv_refusal(const Graph& g, const ChannelViews& cv, const Node& n, int x, int x_add) {
  if (n.inputs.size() > 3) return cat(n.name, ": has a residual input");
  if (g.values[n.outputs[0]].shape.size() != 4) return cat(n.name, ": not 4-D");
  const std::string why = window_conv_unsupported(g.values[n.outputs[0]].dtype, window_conv_shape(g, cv, n, x, x_add));
  return why.empty() ? "" : cat(n.name, ": ", why);
}

}  // namespace

int pixel_stride(const Graph& g, const ChannelViews& cv, int v) {
  return as_int(g.values[cv.is_view(v) ? cv.root(v) : v].shape[1]);
}

WindowConvShape window_conv_shape(const Graph& g, const ChannelViews& cv, const Node& n, int x, int x_add) {
  const Shape& xs = g.values[x].shape;
  const Shape& ws = g.values[n.inputs[1]].shape;
  const Shape& ys = g.values[n.outputs[0]].shape;
  const ConvAttrs a = conv_attrs(n);
  WindowConvShape s{};
  s.n = as_int(xs[0]), s.c = as_int(xs[1]), s.h = as_int(xs[2]), s.w = as_int(xs[3]);
  s.k = as_int(ws[0]), s.r = as_int(ws[2]), s.s = as_int(ws[3]);
  s.out_h = as_int(ys[2]), s.out_w = as_int(ys[3]);
  s.stride_h = a.stride_h, s.stride_w = a.stride_w, s.pad_t = a.pad_t, s.pad_l = a.pad_l;
  s.dil_h = a.dil_h, s.dil_w = a.dil_w;
  s.x_stride = pixel_stride(g, cv, x);
  s.x_add_stride = x_add >= 0 ? pixel_stride(g, cv, x_add) : s.c;
  s.y_stride = pixel_stride(g, cv, n.outputs[0]);
  // Grouped convs are not this kernel's: say so through the channel check.
  if (a.groups != 1) s.c = -1;
  return s;
}

WindowPlan plan_window_convs(const Graph& g, const ChannelViews& cv) {
  WindowPlan p;
  auto refuse = [&](std::string why) {
    p.convs.clear(), p.fused_adds.clear();
    p.why_not = why.empty() ? "no view-touching conv" : std::move(why);
    return p;
  };
  std::map<size_t, size_t> add_feeding;  // conv -> add
  for (size_t ni = 0; ni < g.nodes.size(); ++ni) {
    const Node& n = g.nodes[ni];
    if (n.op != Op::Add || !touches_view(cv, n) || n.activation() != Activation::None || cv.is_view(n.outputs[0]) ||
        g.is_graph_output(n.outputs[0]))
      continue;
    const auto readers = g.consumers(n.outputs[0]);
    if (readers.size() != 1) continue;
    const Node& c = g.nodes[readers[0]];
    if (c.op != Op::Conv2d || c.inputs[0] != n.outputs[0] || g.values[n.inputs[0]].shape != g.values[n.inputs[1]].shape)
      continue;
    if (!conv_refusal(g, cv, c, n.inputs[0], n.inputs[1]).empty()) continue;
    add_feeding[static_cast<size_t>(readers[0])] = ni;
  }
  for (size_t ni = 0; ni < g.nodes.size(); ++ni) {
    const Node& n = g.nodes[ni];
    const auto fed = add_feeding.find(ni);
    if (!touches_view(cv, n) && fed == add_feeding.end()) continue;
    switch (n.op) {
      case Op::Slice:
      case Op::Concat:
      case Op::AvgPool2d:
      case Op::MaxPool2d:
        break;
      case Op::Add:
        if (g.values[n.inputs[0]].shape != g.values[n.inputs[1]].shape || g.values[n.inputs[0]].shape.size() != 4)
          return refuse(cat(n.name, ": broadcasting add on a view"));
        break;
      case Op::Conv2d: {
        const size_t add = fed == add_feeding.end() ? kNoAdd : fed->second;
        const int x = add == kNoAdd ? n.inputs[0] : g.nodes[add].inputs[0];
        const int x_add = add == kNoAdd ? -1 : g.nodes[add].inputs[1];
        std::string why = conv_refusal(g, cv, n, x, x_add);
        if (!why.empty()) return refuse(why);
        p.convs[ni] = add;
        if (add != kNoAdd) p.fused_adds.insert(add);
        const Shape& ys = g.values[n.outputs[0]].shape;
        p.max_rows = std::max(p.max_rows, ys[0] * ys[2] * ys[3]);
        break;
      }
      default:
        return refuse(cat(n.name, ": ", op_name(n.op), " on a channel view"));
    }
  }
  if (p.convs.empty()) return refuse("");
  for (size_t ci = 0; ci < g.nodes.size(); ++ci) {
    const Node& cat_node = g.nodes[ci];
    if (cat_node.op != Op::Concat) continue;
    const int out = cat_node.outputs[0];
    int at = 0;
    for (size_t k = 0; k < cat_node.inputs.size(); ++k) {
      const int in = cat_node.inputs[k];
      const int c = static_cast<int>(g.values[in].shape[1]);
      const int here = at;
      at += c;
      if (cv.parent[in] == out || !cv.is_view(in) || c % 2 || pixel_stride(g, cv, in) % 2 || pixel_stride(g, cv, out) % 2)
        continue;
      // The last window conv before the concat that writes into it, with no copy yet.
      size_t best = kNoAdd;
      for (const auto& [conv, add] : p.convs)
        if (conv < ci && cv.parent[g.nodes[conv].outputs[0]] == out && !p.copies.count(conv) &&
            g.values[g.nodes[conv].outputs[0]].shape[0] == g.values[in].shape[0])
          best = conv;
      if (best == kNoAdd) continue;
      p.copies[best] = {in, out, here};
      p.copied_inputs.insert({ci, k});
    }
  }
  return p;
}

}  // namespace kiln::cuda
