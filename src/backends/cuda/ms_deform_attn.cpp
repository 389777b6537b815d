// The CUDA lowering of ms_deform_attn (kernel in ms_deform_attn.cu): one
// fused kernel per node, on row-major operands.
//
// Layout: value [N, S, heads, D] and logits [N, Q, heads, P] are 4-D, so the
// layout rule stores them NHWC (lower.hpp), which would scatter a head's D
// channels S elements apart. In RT-DETR both are reshapes of a row-major
// linear output ([N, S, heads * D], [N, Q, heads * P]) whose bytes are
// already the row-major 4-D tensor: plan_deform_inputs (called by
// plan_fusions, cuda_program.cpp) marks such a reshape fused away and its
// output an alias of its input, and the kernel reads the linear's output in
// place (no relayout, no copy). Any other NHWC input goes through the
// workspace (RowMajorIo). ref (rank 3), offsets (rank 5) and y (rank 3) are
// row-major already.
#include "backends/cuda/lower.hpp"
#include "core/error.hpp"
#include "ir/attrs.hpp"

namespace kiln::cuda {

namespace {

// Switch warp_deform's auto: the warp form from this many queries a launch
// (images x queries; measured on the H100 in session 34: it won at 2400, lost at 300).
constexpr int64_t kWarpDeformMinQueries = 2400;

// Inputs 0 (value) and 3 (logits) are the 4-D ones.
bool deform_reads_4d(const Node& n, int v) { return n.inputs[0] == v || n.inputs[3] == v; }

// The row-major value whose bytes 4-D input v is, when v is a reshape of it
// read only by ms_deform_attn nodes; else -1.
int row_major_source(const Graph& g, int v) {
  const Value& val = g.values[v];
  if (!stored_nhwc(val) || val.producer < 0) return -1;
  const Node& r = g.nodes[val.producer];
  if (r.op != Op::Reshape || stored_nhwc(g.values[r.inputs[0]]) || g.values[r.inputs[0]].constant) return -1;
  for (int o : g.outputs)
    if (o == v) return -1;
  for (int c : g.consumers(v))
    if (g.nodes[c].op != Op::MsDeformAttn || !deform_reads_4d(g.nodes[c], v)) return -1;
  return r.inputs[0];
}

// The value the kernel reads for input v: the reshape's source when the
// reshape was fused away by plan_deform_inputs, else v.
int read_source(const Lowering& L, int v) {
  const int pr = L.g.values[v].producer;
  if (pr < 0 || !L.f.fused_away[static_cast<size_t>(pr)] || L.g.nodes[pr].op != Op::Reshape) return v;
  return L.g.nodes[pr].inputs[0];
}

DeformAttnShape kernel_shape(const Node& n, const DeformAttnDims& d) {
  const int64_t pairs = d.heads * d.p;
  if (d.points.size() > size_t(kMaxDeformLevels))
    fail_input(n.name, ": CUDA ms_deform_attn takes up to ", kMaxDeformLevels, " levels, not ", d.points.size());
  if (pairs > kMaxDeformPairs)
    fail_input(n.name, ": CUDA ms_deform_attn takes up to ", kMaxDeformPairs, " (head, point) pairs per query, not ", d.heads,
               " heads x ", d.p, " points");
  if (d.s > int64_t(0x7fffffff) || d.heads * d.d > int64_t(0x7fffffff) || d.n * d.q > int64_t(0x7fffffff))
    fail_input(n.name, ": CUDA ms_deform_attn takes S, heads * D and N * Q below 2^31 (S ", d.s, ", heads * D ", d.heads * d.d,
               ", N * Q ", d.n * d.q, ")");
  DeformAttnShape s;
  s.n = d.n, s.s = d.s, s.q = d.q;
  s.heads = as_int(d.heads), s.d = as_int(d.d), s.p = as_int(d.p), s.levels = as_int(static_cast<int64_t>(d.points.size()));
  for (size_t l = 0; l < d.points.size(); ++l) {
    s.level_h[l] = d.level_h[l], s.level_w[l] = d.level_w[l], s.level_start[l] = d.level_start[l];
    s.points[l] = as_int(d.points[l]);
  }
  s.offset_scale = static_cast<float>(d.offset_scale);
  s.discrete = d.discrete;
  return s;
}

}  // namespace

void plan_deform_inputs(const Graph& g, GraphFacts& f) {
  for (const Node& n : g.nodes) {
    if (n.op != Op::MsDeformAttn) continue;
    for (int v : {n.inputs[0], n.inputs[3]}) {
      const int src = row_major_source(g, v);
      if (src < 0) continue;
      f.fused_away[static_cast<size_t>(g.values[v].producer)] = 1;
      f.alias[v] = src;  // same bytes: the row-major [N, S, heads * D] is the row-major [N, S, heads, D]
    }
  }
}

void lower_MsDeformAttn(Lowering& L, size_t ni) {
  const Graph& g = L.g;
  const Node& n = g.nodes[ni];
  const DeformAttnDims d = deform_attn_dims(g, n);
  const DeformAttnShape s = kernel_shape(n, d);
  const DType dt = g.values[n.outputs[0]].dtype;
  for (int v : n.inputs)
    if (g.values[v].dtype != dt)
      fail_input(n.name, ": CUDA ms_deform_attn takes every input in ", dtype_name(dt), ", '", g.values[v].name, "' is ",
                 dtype_name(g.values[v].dtype));
  const int value = read_source(L, n.inputs[0]), logits = read_source(L, n.inputs[3]);
  for (int v : {n.inputs[0], n.inputs[3]})
    if (read_source(L, v) != v) L.record(g.nodes[g.values[v].producer].name, cat("read in place by ", n.name, " (no copy)"));
  const RowMajorIo io(L, {value, n.inputs[1], n.inputs[2], logits}, {n.outputs[0]});
  L.reserve_workspace(io.scratch_bytes());
  // Value, offsets and logits that are row windows (plan_row_windows: slices
  // of one projection) are read in place, rows the projection's row length apart.
  WindowRead w[4];
  DeformAttnShape ks = s;
  for (size_t k : {0, 2, 3})
    if ((w[k] = window_read(L, n, k)).on) (k == 0 ? ks.value_ld : k == 2 ? ks.off_ld : ks.logit_ld) = w[k].ld;
  // Switch warp_deform: one warp per query (ms_deform_attn.cu); the same bits.
  // Auto (session 34, H100): from kWarpDeformMinQueries queries a launch, where
  // it won (RT-DETR r18vd batch 8, 2400 queries: 22.7 against 34.0 us, the
  // engine 2.051 -> 2.006 ms); below, the block form (batch 1: 7.4 against 11.3 us).
  const bool warp_auto = s.n * s.q >= kWarpDeformMinQueries;
  const DeformPath path = L.m.opts.switches.get(Switch::WarpDeform).value_or(warp_auto) ? DeformPath::Warp : DeformPath::Block;
  L.step(io.kernel(d.discrete ? "ms_deform_attn discrete" : "ms_deform_attn"), [=](const Exec& x) {
    io.load(x);
    auto in = [&](size_t k) { return w[k].on ? w[k].at(x) : io.in(x, k); };
    ms_deform_attn(in(0), in(1), in(2), in(3), io.out(x, 0), dt, ks, x.stream, path);
    io.store(x);
  });
}

}  // namespace kiln::cuda
