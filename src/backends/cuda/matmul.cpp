// MatMul's CUDA lowering: cuBLASLt strided-batched GEMMs (MatMulOp,
// cublaslt_linear.hpp), its algorithms handed to the one tactic selector
// like linear's. Operands are read row-major: a 4-D one stored NHWC goes
// through the workspace (RowMajorIo, lower.hpp), and cuBLASLt's own
// workspace follows that scratch. A shared 2-D b folds the batch into m (one
// GEMM of batch*m rows); a shared 2-D a is a zero batch stride.
#include "backends/cuda/cuda_check.hpp"
#include "backends/cuda/lower.hpp"
#include "core/error.hpp"
#include "ir/attrs.hpp"

namespace kiln::cuda {

void lower_MatMul(Lowering& L, size_t ni) {
  const Graph& g = L.g;
  const Node& n = g.nodes[ni];
  const MatMulDims d = matmul_dims(g, n);
  const DType dt = g.values[n.outputs[0]].dtype;
  const bool fold = d.b_shared;  // a batched, b shared: [batch*m, k] x [k, n]
  const int64_t batch = fold ? 1 : d.batch, m = fold ? d.batch * d.m : d.m;
  auto owned = std::make_unique<MatMulOp>(L.m.lt.h, dt, batch, as_int(m), as_int(d.k), as_int(d.n), d.a_stride(),
                                          d.b_stride(), L.m.opts.allow_tf32);
  MatMulOp* op = owned.get();
  L.p.matmuls.push_back(std::move(owned));
  const RowMajorIo io(L, {n.inputs[0], n.inputs[1]}, {n.outputs[0]});
  const size_t scratch = io.scratch_bytes();
  DeviceBuffer ab, bb, yb;  // timing scratch, allocated when first timed
  std::vector<Candidate> cands;
  for (int t = 0; t < op->tactic_count(); ++t)
    cands.push_back({op->tactic_name(t), [op, t] { return op->select(t), true; },
                     [&, op](cudaStream_t s, void* wsp, size_t cap) {
                       if (op->workspace_bytes() > cap) return false;
                       if (!yb.get()) {
                         ab = DeviceBuffer(value_bytes(g.values[n.inputs[0]]));
                         bb = DeviceBuffer(value_bytes(g.values[n.inputs[1]]));
                         yb = DeviceBuffer(value_bytes(g.values[n.outputs[0]]));
                         KILN_CUDA_CHECK(cudaMemsetAsync(ab.get(), 0, ab.size(), s));
                         KILN_CUDA_CHECK(cudaMemsetAsync(bb.get(), 0, bb.size(), s));
                       }
                       op->run(ab.get(), bb.get(), yb.get(), wsp, cap, s);
                       return true;
                     }});
  LayerSignature sig{"matmul", dt, {g.values[n.inputs[0]].shape, g.values[n.inputs[1]].shape}, {}};
  sig.attr("a_shared", d.a_shared).attr("b_shared", d.b_shared).attr("tf32", L.m.opts.allow_tf32);
  const TacticChoice c = L.tactics.choose(n.name, sig, cands, 0);
  L.tactics.finish();
  L.record(n.name, cands[c.index].name, c.us);
  L.reserve_workspace(scratch + op->workspace_bytes());
  L.step(io.kernel(cands[c.index].name), [op, io, scratch](const Exec& x) {
    io.load(x);
    op->run(io.in(x, 0), io.in(x, 1), io.out(x, 0), static_cast<char*>(x.workspace) + scratch,
            x.workspace_bytes - scratch, x.stream);
    io.store(x);
  });
}

}  // namespace kiln::cuda
