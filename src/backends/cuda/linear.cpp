// Linear's CUDA lowering: cuBLASLt (cublaslt_linear.hpp), its algorithms
// handed to the one tactic selector (tactics.hpp).
#include "backends/cuda/cuda_check.hpp"
#include "backends/cuda/lower.hpp"
#include "core/error.hpp"
#include "ir/quant_form.hpp"

namespace kiln::cuda {

void lower_Linear(Lowering& L, size_t ni) {
  if (is_quantized_layer(L.g, L.g.nodes[ni])) return lower_quantized_linear(L, ni);
  const Graph& g = L.g;
  const Node& n = g.nodes[ni];
  const int in0 = n.inputs[0], out = n.outputs[0];
  const Shape xs = g.values[in0].shape, ws = g.values[n.inputs[1]].shape;
  const DType dt = g.values[out].dtype;
  const bool has_bias = n.inputs.size() > 2;
  // x[..., K] is numel / K rows of K in row-major order: a 4-D x and y
  // (stored NHWC, lower.hpp) go through the workspace (RowMajorIo), and
  // cuBLASLt's workspace follows that scratch.
  const RowMajorIo io(L, {in0}, {out});
  const size_t scratch = io.scratch_bytes();
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
  L.reserve_workspace(scratch + op->workspace_bytes());
  L.step(io.kernel(cands[c.index].name), [op, w, b, io, scratch](const Exec& x) {
    io.load(x);
    op->run(io.in(x, 0), w, b, io.out(x, 0), static_cast<char*>(x.workspace) + scratch, x.workspace_bytes - scratch,
            x.stream);
    io.store(x);
  });
}

}  // namespace kiln::cuda
