#include "backends/cuda/window_plan.hpp"

#include <algorithm>
#include <cstdio>

#include "core/error.hpp"
#include "ir/attrs.hpp"
#include "ir/fusion_marks.hpp"
#include "ir/quant_form.hpp"

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
  if (is_quantized_layer(g, n)) return cat(n.name, ": quantized (8-bit) conv");
  if (conv_attrs(n).groups != 1) return cat(n.name, ": grouped conv (groups ", conv_attrs(n).groups, ")");
  if (g.values[n.outputs[0]].shape.size() != 4) return cat(n.name, ": not 4-D");
  const std::string why = window_conv_unsupported(g.values[n.outputs[0]].dtype, window_conv_shape(g, cv, n, x, x_add));
  return why.empty() ? "" : cat(n.name, ": ", why);
}

// Same conv apart from where its windows sit.
bool same_conv(const WindowConvShape& a, const WindowConvShape& b) {
  return a.n == b.n && a.h == b.h && a.w == b.w && a.c == b.c && a.k == b.k && a.r == b.r && a.s == b.s &&
         a.out_h == b.out_h && a.out_w == b.out_w && a.stride_h == b.stride_h && a.stride_w == b.stride_w &&
         a.pad_t == b.pad_t && a.pad_l == b.pad_l && a.dil_h == b.dil_h && a.dil_w == b.dil_w &&
         a.x_stride == b.x_stride && a.y_stride == b.y_stride;
}

// Groups runs of consecutive, independent, same-shape convs (no fused add)
// whose inputs and outputs are evenly spaced windows of one buffer each.
void group_launches(const Graph& g, const ChannelViews& cv, WindowPlan& p) {
  std::vector<size_t> order;
  for (const auto& [conv, add] : p.convs) order.push_back(conv);
  for (size_t i = 0; i < order.size();) {
    const size_t lead = order[i];
    std::vector<size_t> run = {lead};
    const Node& a = g.nodes[lead];
    const int ax = a.inputs[0], ay = a.outputs[0];
    const bool groupable = p.convs.at(lead) == kNoNode && cv.is_view(ax) && cv.is_view(ay);
    const WindowConvShape sa = window_conv_shape(g, cv, a, ax, -1);
    int64_t dx = 0, dy = 0;
    for (size_t j = i + 1; groupable && j < order.size(); ++j) {
      const size_t ni = order[j];
      const Node& b = g.nodes[ni];
      const int bx = b.inputs[0], by = b.outputs[0];
      if (ni != run.back() + 1 || p.convs.at(ni) != kNoNode || !cv.is_view(bx) || !cv.is_view(by) ||
          cv.root(bx) != cv.root(ax) || cv.root(by) != cv.root(ay) || b.activation() != a.activation() ||
          b.inputs.size() != a.inputs.size() || !same_conv(sa, window_conv_shape(g, cv, b, bx, -1)))
        break;
      // Independent: b must not read what the run writes.
      if (cv.root(bx) == cv.root(ay)) break;
      const int64_t sx = cv.root_offset(bx) - cv.root_offset(g.nodes[run.back()].inputs[0]);
      const int64_t sy = cv.root_offset(by) - cv.root_offset(g.nodes[run.back()].outputs[0]);
      if (run.size() == 1) dx = sx, dy = sy;
      if (sx != dx || sy != dy || sx <= 0 || sy <= 0) break;
      run.push_back(ni);
    }
    for (size_t k = 1; k < run.size(); ++k) p.grouped.insert(run[k]);
    p.launches[lead] = run;
    i += run.size();
  }
}

// The launch leader before node `before` whose launch writes into `concat`'s
// buffer over `rows_like`'s pixel grid and has no side job yet; kNoNode if none.
size_t side_host(const Graph& g, const ChannelViews& cv, const WindowPlan& p, size_t before, int concat, int rows_like,
                 int src) {
  const Shape& rs = g.values[rows_like].shape;
  const int src_producer = g.values[cv.is_view(src) ? cv.root(src) : src].producer;
  size_t best = kNoNode;
  for (const auto& [lead, run] : p.launches) {
    if (lead >= before || p.sides.count(lead) || static_cast<int>(lead) <= src_producer) continue;
    const Shape& ys = g.values[g.nodes[lead].outputs[0]].shape;
    if (cv.root(g.nodes[lead].outputs[0]) != concat || ys[0] != rs[0] || ys[2] != rs[2] || ys[3] != rs[3]) continue;
    best = lead;
  }
  return best;
}

void plan_sides(const Graph& g, const ChannelViews& cv, WindowPlan& p) {
  for (size_t ci = 0; ci < g.nodes.size(); ++ci) {
    const Node& cn = g.nodes[ci];
    if (cn.op != Op::Concat) continue;
    const int out = cn.outputs[0];
    int at = 0;
    for (size_t k = 0; k < cn.inputs.size(); ++k) {
      const int in = cn.inputs[k];
      const int here = at;
      at += as_int(g.values[in].shape[1]);
      WindowPlan::Side side;
      if (cv.parent[in] == out) {
        const int prod = g.values[in].producer;
        if (prod < 0 || g.nodes[prod].op != Op::AvgPool2d || !cv.is_view(g.nodes[prod].inputs[0])) continue;
        side = {g.nodes[prod].inputs[0], in, 0, static_cast<size_t>(prod)};
      } else if (cv.is_view(in)) {
        side = {in, out, here, kNoNode};
      } else {
        continue;
      }
      const size_t host = side_host(g, cv, p, ci, cv.root(out), in, side.src);
      if (host == kNoNode) continue;
      const PoolShape ps = window_side_shape(g, cv, side);
      const WindowConvShape s = window_conv_shape(g, cv, g.nodes[host], g.nodes[host].inputs[0], -1);
      if (!window_conv_unsupported(g.values[out].dtype, s, &ps).empty()) continue;
      p.sides[host] = side;
      if (side.pool_node != kNoNode) p.side_pools.insert(side.pool_node);
      else p.copied_inputs.insert({ci, k});
    }
  }
}

}  // namespace

bool takes_channel_views(const Graph& g, const Node& n) {
  switch (n.op) {
    case Op::Slice:
    case Op::Concat:
    case Op::AvgPool2d:
    case Op::MaxPool2d:
      return true;
    case Op::Add:
      return g.values[n.inputs[0]].shape == g.values[n.inputs[1]].shape && g.values[n.inputs[0]].shape.size() == 4;
    default:
      return false;
  }
}

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
  return s;
}

PoolShape window_side_shape(const Graph& g, const ChannelViews& cv, const WindowPlan::Side& side) {
  const Shape& xs = g.values[side.src].shape;
  PoolShape s{};
  s.n = as_int(xs[0]), s.c = as_int(xs[1]), s.h = as_int(xs[2]), s.w = as_int(xs[3]);
  s.out_h = s.h, s.out_w = s.w, s.kh = s.kw = 1, s.stride_h = s.stride_w = 1, s.count_include_pad = true;
  if (side.pool_node != kNoNode) {
    const Node& pn = g.nodes[side.pool_node];
    const PoolAttrs a = pool_attrs(pn);
    const Shape& ys = g.values[pn.outputs[0]].shape;
    s.out_h = as_int(ys[2]), s.out_w = as_int(ys[3]);
    s.kh = a.kh, s.kw = a.kw, s.stride_h = a.stride_h, s.stride_w = a.stride_w;
    s.pad_t = a.pad_t, s.pad_l = a.pad_l, s.pad_b = a.pad_b, s.pad_r = a.pad_r;
    s.count_include_pad = a.count_include_pad;
  }
  s.x_stride = pixel_stride(g, cv, side.src);
  s.y_stride = pixel_stride(g, cv, side.dst);
  return s;
}

namespace {

// Union-find over values, for view_blocks.
int find_set(std::vector<int>& up, int v) {
  while (up[v] != v) v = up[v] = up[up[v]];
  return v;
}

// The leading dotted components all names share ("layer1.0" of
// "layer1.0.convs.0" and "layer1.0.cat"), or "".
std::string common_prefix(const std::vector<std::string>& names) {
  std::string p = names.empty() ? "" : names[0];
  for (const std::string& n : names) {
    size_t k = 0;
    while (k < p.size() && k < n.size() && p[k] == n[k]) ++k;
    // Cut back to a whole component: the next character of both must end one.
    auto ends = [](const std::string& s, size_t at) { return at == s.size() || s[at] == '.'; };
    while (k > 0 && !(ends(p, k) && ends(n, k))) --k;
    p.resize(k);
  }
  return p;
}

}  // namespace

std::vector<ViewBlock> view_blocks(const Graph& g, const ChannelViews& cv) {
  std::vector<int> up(g.values.size());
  for (size_t v = 0; v < up.size(); ++v) up[v] = static_cast<int>(v);
  auto join = [&](int a, int b) { up[find_set(up, a)] = find_set(up, b); };
  for (size_t v = 0; v < g.values.size(); ++v)
    if (cv.is_view(static_cast<int>(v))) join(static_cast<int>(v), cv.parent[v]);
  std::vector<size_t> touching;
  for (size_t ni = 0; ni < g.nodes.size(); ++ni) {
    const Node& n = g.nodes[ni];
    if (!touches_view(cv, n)) continue;
    touching.push_back(ni);
    for (int in : n.inputs)
      if (!g.is_constant(in)) join(in, n.outputs[0]);
  }
  std::map<int, size_t> block_of;  // set representative -> index in `blocks`
  std::vector<ViewBlock> blocks;
  for (size_t ni : touching) {
    const int r = find_set(up, g.nodes[ni].outputs[0]);
    auto [it, fresh] = block_of.emplace(r, blocks.size());
    if (fresh) blocks.emplace_back();
    blocks[it->second].nodes.push_back(ni);
  }
  for (size_t v = 0; v < g.values.size(); ++v)
    if (cv.is_view(static_cast<int>(v))) {
      auto it = block_of.find(find_set(up, static_cast<int>(v)));
      if (it != block_of.end()) blocks[it->second].views.push_back(static_cast<int>(v));
    }
  std::set<std::string> node_names, taken;
  for (const Node& n : g.nodes) node_names.insert(n.name);
  for (ViewBlock& b : blocks) {
    std::vector<std::string> names;
    for (size_t ni : b.nodes) names.push_back(g.nodes[ni].name);
    b.name = common_prefix(names);
    // A name must say one block and be no node's (the record keys both alike).
    if (b.name.empty() || node_names.count(b.name) || taken.count(b.name)) b.name = names[0] + "#views";
    taken.insert(b.name);
  }
  return blocks;
}

ChannelViews keep_view_blocks(const Graph& g, const ChannelViews& cv, const std::vector<ViewBlock>& blocks,
                              const std::vector<char>& keep) {
  ChannelViews r = cv;
  for (size_t i = 0; i < blocks.size(); ++i)
    if (!keep.at(i))
      for (int v : blocks[i].views) r.parent[v] = -1, r.channel_offset[v] = 0;
  r.slices_as_views = r.concat_inputs_in_place = r.concat_inputs_copied = 0;
  for (const Node& n : g.nodes) {
    if (n.op == Op::Slice && r.is_view(n.outputs[0]) && r.parent[n.outputs[0]] == n.inputs[0]) ++r.slices_as_views;
    if (n.op != Op::Concat || !on_channel_axis(g, n)) continue;
    for (int in : n.inputs) (r.parent[in] == n.outputs[0] ? r.concat_inputs_in_place : r.concat_inputs_copied) += 1;
  }
  return r;
}

std::vector<BlockWindows> plan_block_windows(const Graph& g, const ChannelViews& cv, const std::vector<ViewBlock>& blocks) {
  std::vector<BlockWindows> r;
  for (size_t i = 0; i < blocks.size(); ++i) {
    std::vector<char> only(blocks.size(), 0);
    only[i] = 1;
    const WindowPlan p = plan_window_convs(g, keep_view_blocks(g, cv, blocks, only));
    r.push_back({p.why_not, p.max_rows});
  }
  return r;
}

LayerSignature view_block_signature(const Graph& g, const ChannelViews& cv, const ViewBlock& b, bool split_always) {
  LayerSignature s{"view block window-vs-cudnn", g.values[g.nodes[b.nodes.front()].outputs[0]].dtype, {}, {}};
  s.attr("split_always", split_always);
  for (size_t ni : b.nodes) {
    const Node& n = g.nodes[ni];
    s.attr("op", static_cast<int64_t>(n.op)).attr("act", static_cast<int64_t>(n.activation()));
    for (const auto& [key, v] : n.attrs) {
      if (const auto* i = std::get_if<int64_t>(&v)) s.attr(key, *i);
      if (const auto* l = std::get_if<std::vector<int64_t>>(&v))
        for (int64_t x : *l) s.attr(key, x);
    }
    std::vector<int> vals = n.inputs;
    vals.push_back(n.outputs[0]);
    for (int v : vals) {
      s.shapes.push_back(g.values[v].shape);
      // Where a view sits: its root's channels and its offset there.
      if (cv.is_view(v)) s.attr("view_root_c", g.values[cv.root(v)].shape[1]).attr("view_at", cv.root_offset(v));
    }
  }
  return s;
}

WindowPlan plan_window_convs(const Graph& g, const ChannelViews& cv) {
  WindowPlan p;
  auto refuse = [&](std::string why) {
    p = WindowPlan{};
    p.why_not = why.empty() ? "no view-touching conv" : std::move(why);
    return p;
  };
  // Chain adds: convs marked input_add (ir/fusion_marks.hpp) whose add
  // touches a view, where the window conv takes the add's operands.
  std::map<size_t, size_t> add_feeding;  // conv -> add
  for (size_t ni = 0; ni < g.nodes.size(); ++ni) {
    const int a = input_add_of(g, ni);
    if (a < 0) continue;
    const Node& n = g.nodes[a];
    if (!touches_view(cv, n) || cv.is_view(n.outputs[0])) continue;
    if (!conv_refusal(g, cv, g.nodes[ni], n.inputs[0], n.inputs[1]).empty()) continue;
    add_feeding[ni] = static_cast<size_t>(a);
  }
  for (size_t ni = 0; ni < g.nodes.size(); ++ni) {
    const Node& n = g.nodes[ni];
    const auto fed = add_feeding.find(ni);
    if (!touches_view(cv, n) && fed == add_feeding.end()) continue;
    if (n.op != Op::Conv2d) {
      if (!takes_channel_views(g, n)) return refuse(cat(n.name, ": ", op_name(n.op), " on a channel view"));
      continue;
    }
    const size_t add = fed == add_feeding.end() ? kNoNode : fed->second;
    const int x = add == kNoNode ? n.inputs[0] : g.nodes[add].inputs[0];
    const int x_add = add == kNoNode ? -1 : g.nodes[add].inputs[1];
    std::string why = conv_refusal(g, cv, n, x, x_add);
    if (!why.empty()) return refuse(why);
    p.convs[ni] = add;
    if (add != kNoNode) p.fused_adds.insert(add);
    const Shape& ys = g.values[n.outputs[0]].shape;
    p.max_rows = std::max(p.max_rows, ys[0] * ys[2] * ys[3]);
  }
  if (p.convs.empty()) return refuse("");
  group_launches(g, cv, p);
  plan_sides(g, cv, p);
  return p;
}

std::map<std::string, std::string> window_plan_notes(const Graph& g, const ChannelViews& cv, const WindowPlan& p) {
  std::map<std::string, std::string> notes;
  for (const auto& [conv, add] : p.convs)
    if (add != kNoNode) notes[g.nodes[add].name] = cat("in ", g.nodes[conv].name, "'s load (no store)");
  for (const auto& [lead, run] : p.launches)
    for (size_t k = 1; k < run.size(); ++k) notes[g.nodes[run[k]].name] = cat("in ", g.nodes[lead].name, "'s launch");
  for (const auto& [lead, side] : p.sides)
    if (side.pool_node != kNoNode) notes[g.nodes[side.pool_node].name] = cat("in ", g.nodes[lead].name, "'s launch");
  for (const Node& n : g.nodes)
    if (n.op == Op::Slice && cv.is_view(n.outputs[0])) notes[n.name] = "view (no copy)";
  for (size_t ci = 0; ci < g.nodes.size(); ++ci) {
    const Node& n = g.nodes[ci];
    if (n.op != Op::Concat) continue;
    int in_place = 0, by_conv = 0;
    for (size_t k = 0; k < n.inputs.size(); ++k) {
      in_place += cv.parent[n.inputs[k]] == n.outputs[0];
      by_conv += static_cast<int>(p.copied_inputs.count({ci, k}));
    }
    if (in_place + by_conv == 0) continue;  // a block on cuDNN convs, or no view block at all
    notes[n.name] = cat(in_place, "/", n.inputs.size(), " written in place", by_conv ? cat(", ", by_conv, " copied by a conv") : "");
  }
  return notes;
}

std::string window_tactic_name(const WindowLaunch& l) { return cat(kWindowConvTactic, " nt", l.nt, " w", l.warps); }

bool parse_window_tactic(const std::string& name, WindowLaunch& l) {
  const std::string head = std::string(kWindowConvTactic) + " nt";
  if (name.rfind(head, 0) != 0) return false;
  int nt = 0, warps = 0;
  if (std::sscanf(name.c_str() + head.size(), "%d w%d", &nt, &warps) != 2) return false;
  if ((nt != 1 && nt != 2 && nt != 4) || warps < 1 || warps > 16 || (warps & (warps - 1))) return false;
  l = {nt, warps};
  return true;
}

}  // namespace kiln::cuda
