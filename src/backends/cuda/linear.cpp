// Linear's CUDA lowering: cuBLASLt (cublaslt_linear.hpp), its algorithms
// handed to the one tactic selector (tactics.hpp).
#include "backends/cuda/cuda_check.hpp"
#include "backends/cuda/lower.hpp"
#include "core/error.hpp"

namespace kiln::cuda {

void lower_Linear(Lowering& L, size_t ni) {
  const Graph& g = L.g;
  const Node& n = g.nodes[ni];
  const int in0 = n.inputs[0], out = n.outputs[0];
  const Shape xs = g.values[in0].shape, ws = g.values[n.inputs[1]].shape;
  const DType dt = g.values[out].dtype;
  const bool has_bias = n.inputs.size() > 2;
  // x[..., K] is numel / K rows of K, which holds for row-major storage: every
  // rank but 4 (4-D values are NHWC, lower.hpp).
  if (xs.size() == 4)
    fail_input(n.name, ": CUDA linear takes x of rank 2, 3 or 5+ (4-D values are stored NHWC), not ", shape_str(xs));
  const int64_t rows = shape_numel(xs) / ws[1];
  auto owned = std::make_unique<LinearOp>(L.m.lt.h, dt, as_int(rows), as_int(ws[1]), as_int(ws[0]), has_bias, n.activation(),
                                          L.m.opts.allow_tf32);
  LinearOp* op = owned.get();
  L.p.linears.push_back(std::move(owned));
  const void* w = L.weight(n.inputs[1]);
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
  sig.attr("bias", has_bias).attr("act", static_cast<int64_t>(n.activation())).attr("tf32", L.m.opts.allow_tf32);
  const TacticChoice c = L.tactics.choose(n.name, sig, cands, 0);
  L.tactics.finish();
  L.record(n.name, cands[c.index].name, c.us);
  L.p.workspace_bytes = std::max(L.p.workspace_bytes, op->workspace_bytes());
  const ValuePtr ptr = L.ptr;
  L.step(cands[c.index].name, [op, w, b, in0, out, ptr](const Exec& x) {
    op->run(ptr(x, in0), w, b, ptr(x, out), x.workspace, x.workspace_bytes, x.stream);
  });
}

}  // namespace kiln::cuda
