// The CUDA lowering of the elementwise ops (kernels in elementwise.cu).
#include <algorithm>

#include "backends/cuda/lower.hpp"
#include "core/broadcast.hpp"
#include "core/error.hpp"

namespace kiln::cuda {

void lower_BatchNorm(Lowering& L, size_t ni) {
  const Node& n = L.g.nodes[ni];
  const int in0 = n.inputs[0], out = n.outputs[0];
  const DType dt = L.g.values[out].dtype;
  const int64_t count = shape_numel(L.g.values[out].shape);
  const size_t rank = L.g.values[in0].shape.size();
  if (rank != 2 && rank != 4)  // channels innermost: NHWC maps and [N, C] rows
    fail_input(n.name, ": CUDA batch_norm takes 2-D or 4-D values, not rank ", rank);
  const int c = as_int(L.g.values[in0].shape[1]);
  auto* s1 = static_cast<const float*>(L.m.bn.at(n.name).first.get());
  auto* s2 = static_cast<const float*>(L.m.bn.at(n.name).second.get());
  const ValuePtr ptr = L.ptr;
  L.step("batch_norm_nhwc", [=](const Exec& x) {
    batch_norm_nhwc(ptr(x, in0), ptr(x, out), dt, count / c, c, s1, s2, Activation::None, x.stream);
  });
}

namespace {
bool lower_box_refine(Lowering& L, size_t ni);  // below
}  // namespace

void lower_Activation(Lowering& L, size_t ni) {
  if (lower_box_refine(L, ni)) return;  // an f32 sigmoid with its narrowing cast (plan_box_refines)
  const Node& n = L.g.nodes[ni];
  const int in0 = n.inputs[0], out = n.outputs[0];
  const DType dt = L.g.values[out].dtype;
  const int64_t count = shape_numel(L.g.values[out].shape);
  const Activation a = n.activation();
  const ValuePtr ptr = L.ptr;
  L.step(cat("activation ", activation_name(a)), [=](const Exec& x) { activation(ptr(x, in0), ptr(x, out), dt, count, a, x.stream); });
}

namespace {

// A constant second operand (constants are uploaded row-major, lower.hpp) in
// the first operand's stored layout and type, uploaded once per engine: as it
// is when of equal shape, else one image of it repeated per image
// (core/broadcast.hpp), which the kernels read at e modulo `period`. Empty
// when the operand is not a constant.
struct ConstOperand {
  const void* at = nullptr;
  int64_t period = 0;  // 0: equal shapes
};
ConstOperand const_operand(Lowering& L, const Node& n) {
  const Value &a = L.g.values[n.inputs[0]], &b = L.g.values[n.inputs[1]];
  if (!b.constant) return {};
  const bool repeats = broadcasts_per_image(b.shape, a.shape);
  if (!repeats && b.shape != a.shape) return {};
  std::vector<float> v = repeats ? broadcast_one_image(b.constant->to_f32(), b.shape, a.shape) : b.constant->to_f32();
  if (stored_nhwc(a)) {  // each image [C, H, W] -> [H, W, C]
    const int64_t c = a.shape[1], hw = a.shape[2] * a.shape[3];
    std::vector<float> t(v.size());
    for (size_t at = 0; at < v.size(); at += static_cast<size_t>(c * hw))
      for (int64_t ch = 0; ch < c; ++ch)
        for (int64_t p = 0; p < hw; ++p) t[at + static_cast<size_t>(p * c + ch)] = v[at + static_cast<size_t>(ch * hw + p)];
    v.swap(t);
  }
  const int64_t count = static_cast<int64_t>(v.size());
  const HostTensor h = HostTensor::from_f32_as(b.dtype, {count}, v);
  return {L.engine_copy(n.name + "#operand", h.blob.data, h.nbytes()), repeats ? count : 0};
}

}  // namespace

void plan_box_refines(const Graph& g, GraphFacts& f) {
  auto free_node = [&](size_t i) { return !f.fused_away[i] && !f.folded_cast[i]; };
  auto is_float = [](DType t) { return t == DType::F32 || t == DType::F16 || t == DType::BF16; };
  // The producer of v when it is `op`, v is read by `reader` alone and is no engine output; else kNoNode.
  auto sole_producer = [&](int v, Op op, size_t reader) {
    const int p = g.values[v].producer;
    const auto readers = g.consumers(v);
    if (p < 0 || g.nodes[p].op != op || !free_node(static_cast<size_t>(p)) || readers.size() != 1 || static_cast<size_t>(readers[0]) != reader ||
        g.is_graph_output(v))
      return kNoNode;
    return static_cast<size_t>(p);
  };
  auto narrow_reader = [&](int y) { return free_cast_reader(g, f, y, {DType::F16, DType::BF16}); };
  // Records r for node `at` (its narrowing cast found here): the nodes it
  // takes in are fused away, what it reads lives until its last node, the
  // narrowed value's buffer from `at`.
  auto take = [&](size_t at, BoxRefine r) {
    const int y = g.nodes[at].outputs[0];
    r.narrow = narrow_reader(y);
    const size_t last = r.narrow == kNoNode ? at : r.narrow;
    for (size_t fused : {r.widen, r.inverse})
      if (fused != kNoNode) f.fused_away[fused] = 1;
    if (r.narrow != kNoNode) write_early(g, f, r.narrow, at);
    for (int v : {r.delta, r.ref, y})
      if (v >= 0) f.live_through(v, static_cast<int>(last));
    f.box_refines[at] = r;
  };
  for (size_t ai = 0; ai < g.nodes.size(); ++ai) {
    const Node& add = g.nodes[ai];
    if (add.op != Op::Add || !free_node(ai)) continue;
    const int y = add.outputs[0];
    const Value& yv = g.values[y];
    const Activation a = add.activation();
    if (yv.dtype != DType::F32 || (a != Activation::None && a != Activation::Sigmoid) || code_out(g, y).on()) continue;
    BoxRefine r;
    r.inverse = sole_producer(add.inputs[1], Op::InverseSigmoid, ai);
    // Without an inverse_sigmoid: the initial reference points' sigmoid(head
    // + picked anchors), the f32 operand added as it is.
    r.ref = r.inverse == kNoNode ? add.inputs[1] : g.nodes[r.inverse].inputs[0];
    if (r.inverse == kNoNode && (a != Activation::Sigmoid || g.values[r.ref].constant || stored_nhwc(g.values[r.ref]) ||
                                 f.viewed(r.ref) || f.viewed(add.inputs[0]) || f.viewed(y)))
      continue;
    const Value& d0 = g.values[add.inputs[0]];
    if (g.values[r.ref].dtype != DType::F32 || g.values[r.ref].shape != yv.shape || d0.constant || d0.shape != yv.shape)
      continue;
    r.widen = sole_producer(add.inputs[0], Op::Cast, ai);
    r.delta = r.widen == kNoNode ? add.inputs[0] : g.nodes[r.widen].inputs[0];
    if (!is_float(g.values[r.delta].dtype) || d0.dtype != DType::F32) continue;
    take(ai, r);
  }
  // The reference points before the first layer: sigmoid(picked) in f32 and
  // its narrowing cast, one launch (no inverse_sigmoid term).
  for (size_t ai = 0; ai < g.nodes.size(); ++ai) {
    const Node& n = g.nodes[ai];
    if (n.op != Op::Activation || !free_node(ai) || n.activation() != Activation::Sigmoid) continue;
    const Value &xv = g.values[n.inputs[0]], &yv = g.values[n.outputs[0]];
    if (xv.dtype != DType::F32 || yv.dtype != DType::F32 || xv.constant || xv.shape != yv.shape || stored_nhwc(yv)) continue;
    BoxRefine r;
    r.delta = n.inputs[0];
    if (narrow_reader(n.outputs[0]) == kNoNode) continue;  // nothing to save
    take(ai, r);
  }
}

namespace {

// Node ni's step when plan_box_refines took it (an add or an activation);
// false when it did not.
bool lower_box_refine(Lowering& L, size_t ni) {
  const auto fused = L.f.box_refines.find(ni);
  if (fused == L.f.box_refines.end()) return false;
  const BoxRefine r = fused->second;
  const Graph& g = L.g;
  const Node& n = g.nodes[ni];
  for (size_t k : {r.widen, r.inverse, r.narrow})
    if (k != kNoNode) L.record(g.nodes[k].name, cat("inside ", n.name, " (box_refine, no launch of its own)"));
  const int y = n.outputs[0], narrow = r.narrow == kNoNode ? -1 : g.nodes[r.narrow].outputs[0];
  const DType delta_dt = g.values[r.delta].dtype, narrow_dt = narrow < 0 ? DType::F16 : g.values[narrow].dtype;
  // eps < 0 tells box_refine to add ref as it is (no inverse_sigmoid node).
  const float eps = r.inverse == kNoNode ? -1.f : static_cast<float>(g.nodes[r.inverse].attr_float("eps", 1e-5));
  const int64_t count = shape_numel(g.values[y].shape);
  const Activation a = n.activation();
  const ValuePtr ptr = L.ptr;
  const int delta = r.delta, ref = r.ref;
  L.step("box_refine", [=](const Exec& x) {
    box_refine(ptr(x, delta), delta_dt, ref < 0 ? nullptr : static_cast<const float*>(ptr(x, ref)), eps,
               static_cast<float*>(ptr(x, y)), narrow < 0 ? nullptr : ptr(x, narrow), narrow_dt, count, a, x.stream);
  });
  return true;
}

}  // namespace

void lower_Add(Lowering& L, size_t ni) {
  const Node& n = L.g.nodes[ni];
  if (lower_box_refine(L, ni)) return;  // plan_box_refines
  const int in0 = n.inputs[0], in1 = n.inputs[1], out = n.outputs[0];
  const Value& ov = L.g.values[out];
  const DType dt = L.g.values[in0].dtype;  // the inputs' type; the output's unless the add writes codes
  const CodeOut code = code_out(L.g, out);
  const int64_t count = shape_numel(ov.shape);
  const Activation a = n.activation();
  const ValuePtr ptr = L.ptr;
  if (const ConstOperand b = const_operand(L, n); b.at) {
    if (L.strided(in0) || L.strided(out)) fail_input(n.name, ": CUDA add of a constant on a channel view");
    L.step("add", [=](const Exec& x) { add(ptr(x, in0), b.at, ptr(x, out), dt, count, a, x.stream, code, b.period); });
    return;
  }
  if (L.strided(in0) || L.strided(in1) || L.strided(out)) {
    const int c = as_int(ov.shape[1]);
    const int sa = L.strided(in0) ? L.pixel_stride(in0) : c, sb = L.strided(in1) ? L.pixel_stride(in1) : c;
    const int sy = L.strided(out) ? L.pixel_stride(out) : c;
    const int64_t rows = count / c;
    L.step("add_strided_nhwc", [=](const Exec& x) {
      add_strided_nhwc(ptr(x, in0), sa, ptr(x, in1), sb, ptr(x, out), sy, rows, c, dt, a, x.stream, code);
    });
    return;
  }
  L.step("add", [=](const Exec& x) { add(ptr(x, in0), ptr(x, in1), ptr(x, out), dt, count, a, x.stream, code); });
}

void lower_Mul(Lowering& L, size_t ni) {
  const Node& n = L.g.nodes[ni];
  const int in0 = n.inputs[0], in1 = n.inputs[1], out = n.outputs[0];
  const Shape xs = L.g.values[in0].shape;
  const DType dt = L.g.values[in0].dtype;
  const CodeOut code = code_out(L.g, out);
  const ValuePtr ptr = L.ptr;
  const ConstOperand b = const_operand(L, n);
  if (b.at || L.g.values[in1].shape == xs) {  // elementwise (activations stored alike), or a constant
    if (L.strided(in0) || L.strided(in1) || L.strided(out)) fail_input(n.name, ": CUDA elementwise mul on a channel view");
    const int64_t count = shape_numel(xs);
    L.step("mul", [=](const Exec& x) { mul(ptr(x, in0), b.at ? b.at : ptr(x, in1), ptr(x, out), dt, count, x.stream, code, b.period); });
    return;
  }
  if (xs.size() != 4) fail_input(n.name, ": CUDA mul scales the channels of 4-D maps only, not rank ", xs.size());
  L.step("mul_channel_nhwc", [=](const Exec& x) {
    mul_channel_nhwc(ptr(x, in0), ptr(x, in1), ptr(x, out), dt, as_int(xs[0]), as_int(xs[2] * xs[3]), as_int(xs[1]), x.stream,
                     code);
  });
}

void lower_Cast(Lowering& L, size_t ni) {
  const Node& n = L.g.nodes[ni];
  const int in0 = n.inputs[0], out = n.outputs[0];
  const DType from = L.g.values[in0].dtype, dt = L.g.values[out].dtype;
  const int64_t count = shape_numel(L.g.values[out].shape);
  const ValuePtr ptr = L.ptr;
  L.step("cast", [=](const Exec& x) { cast(ptr(x, in0), from, ptr(x, out), dt, count, x.stream); });
}

// Elementwise in f32 whatever the storage: eps is used as the f32 nearest to
// the attribute, never rounded to f16/bf16 (1e-5 is below f16's normal range).
void lower_InverseSigmoid(Lowering& L, size_t ni) {
  const Node& n = L.g.nodes[ni];
  const int in0 = n.inputs[0], out = n.outputs[0];
  const DType dt = L.g.values[out].dtype;
  const int64_t count = shape_numel(L.g.values[out].shape);
  const float eps = static_cast<float>(n.attr_float("eps", 1e-5));
  const ValuePtr ptr = L.ptr;
  L.step("inverse_sigmoid", [=](const Exec& x) { inverse_sigmoid(ptr(x, in0), ptr(x, out), dt, count, eps, x.stream); });
}

}  // namespace kiln::cuda
