// The CPU reference for kiln's own CUDA convs (window conv, implicit-GEMM
// conv): NHWC tensors and a KRSC filter as those kernels take them, through
// the CPU backend's NCHW conv. Shared by their GPU tests.
#pragma once
#include <algorithm>
#include <cmath>
#include <vector>

#include "backends/cpu/kernels.hpp"
#include "cuda_test_util.hpp"

namespace kiln::cuda::test {

inline cpu::ThreadPool& reference_pool() {
  static cpu::ThreadPool p(0);
  return p;
}

struct ReferenceConv {
  int n, h, w, c, k, r, stride, pad, dil;
  Activation act;
};

// A kernel shape (WindowConvShape, IgemmConvShape: the same geometry fields)
// of a square filter with symmetric padding; pixel strides left to the caller.
template <typename S>
S square_conv_shape(const ReferenceConv& k) {
  S s{};
  s.n = k.n, s.h = k.h, s.w = k.w, s.c = k.c, s.k = k.k, s.r = s.s = k.r;
  s.out_h = (k.h + 2 * k.pad - k.dil * (k.r - 1) - 1) / k.stride + 1;
  s.out_w = (k.w + 2 * k.pad - k.dil * (k.r - 1) - 1) / k.stride + 1;
  s.stride_h = s.stride_w = k.stride, s.pad_t = s.pad_l = k.pad, s.dil_h = s.dil_w = k.dil;
  return s;
}

// y = act(conv(x [+ x_add, rounded to dt as a stored add], w) + bias [+ residual]), all NHWC
// (x, x_add: dense [n*h*w][c]; residual and the result: [n*out_h*out_w][k]); w KRSC.
// x_add and residual may be empty.
inline std::vector<float> reference_conv_nhwc(const ReferenceConv& k, DType dt, const std::vector<float>& x,
                                              const std::vector<float>& x_add, const std::vector<float>& w_krsc,
                                              const std::vector<float>& bias, const std::vector<float>& residual) {
  const int taps = k.r * k.r;
  std::vector<float> wkcrs(w_krsc.size());
  for (int o = 0; o < k.k; ++o)
    for (int t = 0; t < taps; ++t)
      for (int ch = 0; ch < k.c; ++ch) wkcrs[(size_t(o) * k.c + ch) * taps + t] = w_krsc[(size_t(o) * taps + t) * k.c + ch];
  cpu::Conv2dParams p;
  p.n = k.n, p.c_in = k.c, p.h = k.h, p.w = k.w, p.c_out = k.k, p.kh = p.kw = k.r;
  p.stride_h = p.stride_w = k.stride, p.pad_t = p.pad_l = p.pad_b = p.pad_r = k.pad, p.dil_h = p.dil_w = k.dil;
  struct Out {
    int n, h, w, c, k, r, s, out_h, out_w, stride_h, stride_w, pad_t, pad_l, dil_h, dil_w;
  };
  const Out o = square_conv_shape<Out>(k);
  const int out_h = o.out_h, out_w = o.out_w;
  const std::vector<float> add = x_add.empty() ? std::vector<float>(x.size(), 0.f) : x_add;
  const std::vector<float> res = residual.empty() ? residual : nhwc_to_nchw(residual, k.n, k.k, out_h, out_w);
  std::vector<float> y(size_t(k.n) * out_h * out_w * k.k);
  cpu::conv2d_of_sum(p, nhwc_to_nchw(x, k.n, k.c, k.h, k.w).data(), nhwc_to_nchw(add, k.n, k.c, k.h, k.w).data(), dt,
                     wkcrs.data(), bias.data(), res.empty() ? nullptr : res.data(), k.act, y.data(), reference_pool());
  return nchw_to_nhwc(y, k.n, k.k, out_h, out_w);
}

// A conv output y of pixel stride yw (>= k) against ref [px][k]: the largest
// |y - ref| over the k output channels (NaN counts as infinity), and how many
// values past them differ from y0, what y held before the conv (a kernel must
// not write outside its output window).
struct WindowCheck {
  double worst = 0;
  size_t touched = 0;
};
inline WindowCheck check_output_window(const std::vector<float>& y, const std::vector<float>& ref, const std::vector<float>& y0,
                                       int64_t out_px, int k, int yw) {
  WindowCheck c;
  for (int64_t px = 0; px < out_px; ++px)
    for (int ch = 0; ch < yw; ++ch) {
      const float g = y[size_t(px) * yw + ch];
      if (ch < k) {
        const double d = std::fabs(double(g) - ref[size_t(px) * k + ch]);
        c.worst = std::isnan(d) ? INFINITY : std::max(c.worst, d);
      } else if (g != y0[size_t(px) * yw + ch]) {
        ++c.touched;
      }
    }
  return c;
}

}  // namespace kiln::cuda::test
