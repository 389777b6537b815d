// The CUDA lowering of layer_norm and softmax (kernels in norm.cu). Both
// compute on row-major data: a 4-D input or output (stored NHWC) goes
// through the workspace (RowMajorIo, lower.hpp). Statistics, exponentials
// and sums are f32 for every storage type; the result is rounded once.
#include <algorithm>

#include "backends/cuda/lower.hpp"
#include "core/error.hpp"
#include "ir/attrs.hpp"

namespace kiln::cuda {

namespace {

// Whether add node `ai` is a plain sum of row-major values of y's shape and
// type: no activation, no codes, no constant or channel-view operand.
bool plain_add(const Graph& g, const GraphFacts& f, size_t ai, const Value& y) {
  const Node& add = g.nodes[ai];
  if (add.op != Op::Add || f.fused_away[ai] || add.activation() != Activation::None || code_out(g, add.outputs[0]).on() ||
      g.values[add.outputs[0]].dtype != y.dtype || stored_nhwc(y))
    return false;
  for (int in : add.inputs) {
    const Value& iv = g.values[in];
    if (iv.constant || iv.shape != y.shape || iv.dtype != y.dtype || f.viewed(in)) return false;
  }
  return true;
}

}  // namespace

size_t earlier_sum_reader(const Graph& g, const GraphFacts& f, int y, size_t at) {
  for (int r : g.consumers(y)) {
    const auto ai = static_cast<size_t>(r);
    if (!plain_add(g, f, ai, g.values[y])) continue;
    const Node& add = g.nodes[ai];
    const int other = other_input(add, y);
    if (other != y && g.values[other].producer < static_cast<int>(at) && f.alias[add.outputs[0]] < 0) return ai;
  }
  return kNoNode;
}

void plan_norm_adds(const Graph& g, GraphFacts& f) {
  for (size_t ni = 0; ni < g.nodes.size(); ++ni) {
    const Node& n = g.nodes[ni];
    if (n.op != Op::LayerNorm || f.fused_away[ni]) continue;
    const int sum = n.inputs[0], y = n.outputs[0];
    const Value &sv = g.values[sum], &yv = g.values[y];
    if (stored_nhwc(yv)) continue;  // the fused step reads and writes row-major values only
    NormAdds fused;
    if (sv.producer >= 0 && g.consumers(sum).size() == 1 && !g.is_graph_output(sum) && f.alias[sum] < 0 &&
        plain_add(g, f, static_cast<size_t>(sv.producer), yv))
      fused.residual = static_cast<size_t>(sv.producer);
    if (const size_t ai = earlier_sum_reader(g, f, y, ni); ai != kNoNode)
      fused.pos = ai, fused.pos_value = other_input(g.nodes[ai], y);
    if (yv.dtype == DType::F16 || yv.dtype == DType::BF16)
      if (const size_t ci = free_cast_reader(g, f, y, {DType::F32}); ci != kNoNode && f.alias[g.nodes[ci].outputs[0]] < 0)
        fused.widen = ci;
    if (fused.residual == kNoNode && fused.pos == kNoNode && fused.widen == kNoNode) continue;
    if (fused.residual != kNoNode) {
      f.fused_away[fused.residual] = 1;
      for (int in : g.nodes[fused.residual].inputs) f.live_through(in, static_cast<int>(ni));
    }
    for (size_t early : {fused.pos, fused.widen})  // written by this launch, before their own nodes
      if (early != kNoNode) write_early(g, f, early, ni);
    f.norm_adds[ni] = fused;
  }
}

NormOperands norm_operands(Lowering& L, size_t ln, const NormAdds* adds) {
  const Graph& g = L.g;
  const Node& n = g.nodes[ln];
  NormOperands o;
  o.has_w = n.inputs.size() > 1, o.has_b = n.inputs.size() > 2;
  if (o.has_w) o.w = operand(L, n.inputs[1]);
  if (o.has_b) o.b = operand(L, n.inputs[2]);
  o.eps = static_cast<float>(n.attr_float("eps", 1e-5));
  o.ptr = L.ptr;
  if (!adds) return o;
  for (size_t k : {adds->residual, adds->pos, adds->widen})
    if (k != kNoNode) L.record(g.nodes[k].name, cat("inside ", n.name, " (no launch of its own)"));
  if (adds->pos != kNoNode) o.pos = operand(L, adds->pos_value), o.y_pos = g.nodes[adds->pos].outputs[0];
  if (adds->widen != kNoNode) o.y_f32 = g.nodes[adds->widen].outputs[0];
  return o;
}

void NormOperands::fill(const Exec& x, LayerNormIo& io) const {
  if (has_w) io.weight = w(x);
  if (has_b) io.bias = b(x);
  if (y_pos >= 0) io.pos = pos(x), io.y_pos = ptr(x, y_pos);
  if (y_f32 >= 0) io.y_f32 = static_cast<float*>(ptr(x, y_f32));
}

void lower_LayerNorm(Lowering& L, size_t ni) {
  if (const auto chain = L.f.mlp_chains.find(ni); chain != L.f.mlp_chains.end()) return lower_mlp_chain(L, ni, chain->second);
  const Node& n = L.g.nodes[ni];
  const Value& yv = L.g.values[n.outputs[0]];
  const int64_t c = yv.shape.back(), rows = shape_numel(yv.shape) / std::max<int64_t>(1, c);
  const DType dt = yv.dtype;
  if (const auto it = L.f.norm_adds.find(ni); it != L.f.norm_adds.end()) {  // plan_norm_adds: row-major values only
    const NormAdds fused = it->second;
    const Graph& g = L.g;
    const NormOperands o = norm_operands(L, ni, &fused);
    const int y = n.outputs[0];
    const bool has_r = fused.residual != kNoNode;
    const Operand a = operand(L, has_r ? g.nodes[fused.residual].inputs[0] : n.inputs[0]);
    const Operand r = has_r ? operand(L, g.nodes[fused.residual].inputs[1]) : Operand{};
    std::string kernel = has_r ? "add_layer_norm" : "layer_norm";
    if (o.y_pos >= 0) kernel += "_pos";
    if (o.y_f32 >= 0) kernel += "_f32";
    L.step(kernel, [=](const Exec& x) {
      LayerNormIo io;
      io.x = a(x), io.y = o.ptr(x, y);
      if (has_r) io.x2 = r(x);
      o.fill(x, io);
      layer_norm_rows(io, dt, rows, as_int(c), o.eps, x.stream);
    });
    return;
  }
  const NormOperands o = norm_operands(L, ni, nullptr);
  const RowMajorIo io(L, {n.inputs[0]}, {n.outputs[0]});
  L.reserve_workspace(io.scratch_bytes());
  L.step(io.kernel("layer_norm"), [=](const Exec& x) {
    io.load(x);
    LayerNormIo rows_io;
    rows_io.x = io.in(x, 0), rows_io.y = io.out(x, 0);
    o.fill(x, rows_io);
    layer_norm_rows(rows_io, dt, rows, as_int(c), o.eps, x.stream);
    io.store(x);
  });
}

void lower_Softmax(Lowering& L, size_t ni) {
  const Node& n = L.g.nodes[ni];
  const AxisSplit a = softmax_split(L.g, n);
  const RowMajorIo io(L, {n.inputs[0]}, {n.outputs[0]});
  L.reserve_workspace(io.scratch_bytes());
  const DType dt = L.g.values[n.outputs[0]].dtype;
  L.step(io.kernel("softmax"), [=](const Exec& x) {
    io.load(x);
    softmax_axis(io.in(x, 0), io.out(x, 0), dt, a.outer, a.extent, a.inner, x.stream);
    io.store(x);
  });
}

}  // namespace kiln::cuda
