// The CUDA lowering of top_k (kernel in top_k.cu): x seen as [outer, extent,
// inner] in row-major order (a 4-D x or values output stored NHWC goes
// through the workspace, RowMajorIo); the indices output is i64, stored
// row-major at every rank (integer values are never NHWC, lower.hpp), and
// the engine hands it out as exact floats like every output.
#include "backends/cuda/lower.hpp"
#include "core/error.hpp"
#include "ir/attrs.hpp"

namespace kiln::cuda {

void lower_TopK(Lowering& L, size_t ni) {
  const Node& n = L.g.nodes[ni];
  const TopKAttrs a = top_k_attrs(L.g, n);
  if (a.k > kMaxCudaTopK) fail_input(n.name, ": CUDA top_k takes k up to ", kMaxCudaTopK, ", not ", a.k);
  if (L.g.values[n.outputs[1]].dtype != DType::I64)
    fail_input(n.name, ": CUDA top_k writes i64 indices, not ", dtype_name(L.g.values[n.outputs[1]].dtype));
  const RowMajorIo io(L, {n.inputs[0]}, {n.outputs[0], n.outputs[1]});
  L.reserve_workspace(io.scratch_bytes());
  const DType dt = L.g.values[n.outputs[0]].dtype;
  // Switch cluster_top_k (auto: on since session 33, same bits and faster on the H100): long rows on a thread-block cluster
  // (top_k.cu); the same bits either way.
  const TopKPath path = L.m.opts.switches.get(Switch::ClusterTopK).value_or(true) ? TopKPath::Auto : TopKPath::OneBlock;
  L.step(io.kernel("top_k"), [=](const Exec& x) {
    io.load(x);
    top_k_rows(io.in(x, 0), io.out(x, 0), static_cast<int64_t*>(io.out(x, 1)), dt, a.outer, a.extent, a.inner,
               as_int(a.k), a.largest, x.stream, path);
    io.store(x);
  });
}

}  // namespace kiln::cuda
