// The CUDA lowering of the pools (kernels in pool.cu).
#include "backends/cuda/lower.hpp"
#include "ir/attrs.hpp"

namespace kiln::cuda {

namespace {

void lower_window_pool(Lowering& L, size_t ni, bool is_max) {
  const Node& n = L.g.nodes[ni];
  const int in0 = n.inputs[0], out = n.outputs[0];
  const Shape xs = L.g.values[in0].shape, ys = L.g.values[out].shape;
  const DType dt = L.g.values[in0].dtype;
  const CodeOut code = code_out(L.g, out);  // a max pool that writes codes
  const PoolAttrs a = pool_attrs(n);
  PoolShape s{as_int(xs[0]), as_int(xs[2]), as_int(xs[3]), as_int(xs[1]), as_int(ys[2]), as_int(ys[3]),
              a.kh, a.kw, a.stride_h, a.stride_w, a.pad_t, a.pad_l, a.count_include_pad, a.pad_b, a.pad_r};
  s.x_stride = L.stride_or_0(in0), s.y_stride = L.stride_or_0(out);
  const ValuePtr ptr = L.ptr;
  L.step(is_max ? "max_pool_nhwc" : "avg_pool_nhwc", [=](const Exec& x) {
    if (is_max) max_pool_nhwc(ptr(x, in0), ptr(x, out), dt, s, x.stream, code);
    else avg_pool_nhwc(ptr(x, in0), ptr(x, out), dt, s, x.stream);
  });
}

}  // namespace

void lower_MaxPool2d(Lowering& L, size_t ni) { lower_window_pool(L, ni, true); }
void lower_AvgPool2d(Lowering& L, size_t ni) { lower_window_pool(L, ni, false); }

void lower_GlobalAvgPool(Lowering& L, size_t ni) {
  const Node& n = L.g.nodes[ni];
  const int in0 = n.inputs[0], out = n.outputs[0];
  const Shape xs = L.g.values[in0].shape;
  const DType dt = L.g.values[out].dtype;
  const ValuePtr ptr = L.ptr;
  L.step("global_avg_pool_nhwc", [=](const Exec& x) {
    global_avg_pool_nhwc(ptr(x, in0), ptr(x, out), dt, as_int(xs[0]), as_int(xs[2] * xs[3]), as_int(xs[1]), x.stream);
  });
}

}  // namespace kiln::cuda
