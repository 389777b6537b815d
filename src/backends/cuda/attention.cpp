// attention's CUDA lowering: one fused kernel per node (attention.cu). Its
// operands are 3-D token tensors, stored row-major, read and written in
// place (RowMajorIo relayouts nothing for them).
#include "backends/cuda/kernels.hpp"
#include "backends/cuda/lower.hpp"
#include "core/error.hpp"
#include "core/switches.hpp"
#include "ir/attrs.hpp"

namespace kiln::cuda {

void lower_Attention(Lowering& L, size_t ni) {
  const Graph& g = L.g;
  const Node& n = g.nodes[ni];
  const AttentionDims d = attention_dims(g, n);
  const DType dt = g.values[n.outputs[0]].dtype;  // q, k, v share it (the shape rule's expect_same_dtype)
  AttentionShape s;
  s.n = d.n, s.lq = as_int(d.lq), s.lk = as_int(d.lk), s.heads = as_int(d.heads), s.d = as_int(d.d), s.dv = as_int(d.dv);
  s.scale = static_cast<float>(d.scale);
  // Switch wide_attention (auto: on since session 33, same bits and faster on
  // the H100): at the small grids' key split 4, blocks of 2 or 4 query groups
  // (attention.cu).
  s.wide = L.m.opts.switches.get(Switch::WideAttention).value_or(true);
  const int64_t big = int64_t{1} << 30;
  if (d.n > 65535 || d.heads > 65535 || d.lq > big || d.lk > big || d.d > big || d.dv > big || !attention_fits(s))
    fail_input(n.name, ": CUDA attention supports at most 65535 images and heads and keys of one query row in shared memory (",
               d.lk, " keys, head width ", d.d, "); build with --backend cpu");
  const RowMajorIo io(L, {n.inputs[0], n.inputs[1], n.inputs[2]}, {n.outputs[0]});
  L.reserve_workspace(io.scratch_bytes());
  // Inputs that are row windows (plan_row_windows: q and k as slices of one
  // projection) are read in place, rows the projection's row length apart.
  WindowRead w[3];
  for (size_t k = 0; k < 3; ++k)
    if ((w[k] = window_read(L, n, k)).on) (k == 0 ? s.q_ld : k == 1 ? s.k_ld : s.v_ld) = w[k].ld;
  // Tensor cores unless a pointer turns out misaligned at run time; the
  // exact kernel then runs instead (its limits are checked above).
  const char* kernel = attention_uses_mma(s, dt)   ? "kiln attention (tensor cores)"
                       : attention_kv_in_shared(s) ? "kiln attention (k, v in shared memory)"
                                                   : "kiln attention (k, v from L2)";
  L.step(io.kernel(kernel), [=](const Exec& x) {
    io.load(x);
    auto in = [&](size_t k) { return w[k].on ? w[k].at(x) : io.in(x, k); };
    attention(in(0), in(1), in(2), io.out(x, 0), dt, s, x.stream);
    io.store(x);
  });
}

}  // namespace kiln::cuda
