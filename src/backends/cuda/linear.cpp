// Linear's CUDA lowering: cuBLASLt (cublaslt_linear.hpp), its algorithms
// handed to the one tactic selector (tactics.hpp).
#include "backends/cuda/cuda_check.hpp"
#include "backends/cuda/lower.hpp"
#include "core/error.hpp"
#include "ir/quant_form.hpp"

namespace kiln::cuda {

void plan_wide_linears(const Graph& g, GraphFacts& f) {
  for (size_t ni = 0; ni < g.nodes.size(); ++ni) {
    const Node& n = g.nodes[ni];
    if (n.op != Op::Linear || f.fused_away[ni] || is_quantized_layer(g, n)) continue;
    const int v = n.inputs[0];
    const Value& xv = g.values[v];
    if (xv.dtype != DType::F32 || g.values[n.outputs[0]].dtype != DType::F32 || xv.producer < 0) continue;
    const auto ci = static_cast<size_t>(xv.producer);
    const Node& c = g.nodes[ci];
    if (c.op != Op::Cast || f.fused_away[ci] || f.folded_cast[ci]) continue;
    const int u = c.inputs[0];
    const Value& uv = g.values[u];
    if ((uv.dtype != DType::F16 && uv.dtype != DType::BF16) || uv.constant || stored_nhwc(uv) || f.viewed(u)) continue;
    bool weights_f32 = true;
    for (size_t k = 1; k < n.inputs.size(); ++k) weights_f32 &= g.is_constant(n.inputs[k]) && g.values[n.inputs[k]].dtype == DType::F32;
    if (!weights_f32 || g.consumers(v).size() != 1 || g.is_graph_output(v)) continue;
    f.fused_away[ci] = 1;
    f.wide_linears[ni] = u;
    f.alias[v] = u;  // never written: no arena bytes of its own
    f.live_through(u, static_cast<int>(ni));
  }
}

void lower_Linear(Lowering& L, size_t ni) {
  if (is_quantized_layer(L.g, L.g.nodes[ni])) return lower_quantized_linear(L, ni);
  const Graph& g = L.g;
  const Node& n = g.nodes[ni];
  // plan_wide_linears: the 16-bit value behind the widening cast, its type the product's.
  const auto wide = L.f.wide_linears.find(ni);
  const int in0 = wide != L.f.wide_linears.end() ? wide->second : n.inputs[0], out = n.outputs[0];
  const Shape xs = g.values[in0].shape, ws = g.values[n.inputs[1]].shape;
  const DType dt = g.values[out].dtype, xdt = g.values[in0].dtype;
  const bool has_bias = n.inputs.size() > 2;
  // x[..., K] is numel / K rows of K in row-major order: a 4-D x and y
  // (stored NHWC, lower.hpp) go through the workspace (RowMajorIo), and
  // cuBLASLt's workspace follows that scratch.
  const RowMajorIo io(L, {in0}, {out});
  const size_t scratch = io.scratch_bytes();
  const int64_t rows = shape_numel(xs) / ws[1];
  auto owned = std::make_unique<LinearOp>(L.m.lt.h, xdt, as_int(rows), as_int(ws[1]), as_int(ws[0]), has_bias, n.activation(),
                                          L.m.opts.allow_tf32, dt);
  LinearOp* op = owned.get();
  L.p.linears.push_back(std::move(owned));
  const void* w = L.weight(n.inputs[1]);
  if (xdt != dt) {  // the f32 weights rounded once (RNE) to the input's type
    const HostTensor& wt = *g.values[n.inputs[1]].constant;
    const HostTensor narrow = HostTensor::from_f32_as(xdt, wt.shape, wt.to_f32());
    w = L.engine_copy(n.name + "#" + dtype_name(xdt) + "_weight", narrow.blob.data, narrow.nbytes());
    L.record(g.nodes[static_cast<size_t>(g.values[n.inputs[0]].producer)].name,
             cat("inside ", n.name, " (", dtype_name(xdt), " product with f32 output, no launch of its own)"));
  }
  const void* b = has_bias ? L.weight(n.inputs[2]) : nullptr;
  DeviceBuffer xb, yb;  // timing scratch, allocated when first timed
  std::vector<Candidate> cands;
  for (int t = 0; t < op->tactic_count(); ++t)
    cands.push_back({op->tactic_name(t), [op, t] { return op->select(t), true; },
                     [&, op](cudaStream_t s, void* wsp, size_t cap) {
                       if (op->workspace_bytes() > cap) return false;
                       if (!xb.get()) {
                         xb = DeviceBuffer(value_bytes(g.values[in0])), yb = DeviceBuffer(value_bytes(g.values[out]));
                         KILN_CUDA_CHECK(cudaMemsetAsync(xb.get(), 0, xb.size(), s));
                       }
                       op->run(xb.get(), w, b, yb.get(), wsp, cap, s);
                       return true;
                     }});
  LayerSignature sig{"linear", dt, {xs, ws}, {}};
  if (xdt != dt) sig.attr("x_dtype", static_cast<int64_t>(xdt));  // the mixed product (plan_wide_linears)
  sig.attr("bias", has_bias).attr("act", static_cast<int64_t>(n.activation())).attr("tf32", L.m.opts.allow_tf32);
  const TacticChoice c = L.tactics.choose(n.name, sig, cands, 0);
  L.tactics.finish();
  L.record(n.name, cands[c.index].name, c.us);
  L.reserve_workspace(scratch + op->workspace_bytes());
  L.step(io.kernel(cands[c.index].name), [op, w, b, io, scratch](const Exec& x) {
    io.load(x);
    op->run(io.in(x, 0), w, b, io.out(x, 0), static_cast<char*>(x.workspace) + scratch, x.workspace_bytes - scratch,
            x.stream);
    io.store(x);
  });
}

}  // namespace kiln::cuda
