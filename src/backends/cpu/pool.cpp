// max/avg pooling with PyTorch's output-size and divisor rules, generalised
// to asymmetric padding (ONNX/TensorFlow models need it).
#include <algorithm>
#include <limits>

#include "backends/cpu/kernels.hpp"
#include "core/window.hpp"
#include "core/error.hpp"

namespace kiln::cpu {

int pool_out_dim(int in, int k, int stride, int pad_begin, int pad_end, bool ceil_mode) {
  if (in < 1 || k < 1 || stride < 1 || pad_begin < 0 || pad_end < 0)
    fail_runtime("pool: invalid size (in=", in, " k=", k, " stride=", stride, " pads=", pad_begin, ",", pad_end, ")");
  if (in + pad_begin + pad_end < k) fail_runtime("pool: kernel ", k, " larger than padded input ", in + pad_begin + pad_end);
  return static_cast<int>(window_out_dim(in, k, stride, pad_begin, pad_end, 1, ceil_mode));
}

int Pool2dParams::out_h() const { return pool_out_dim(h, kh, stride_h, pad_t, pad_b, ceil_mode); }
int Pool2dParams::out_w() const { return pool_out_dim(w, kw, stride_w, pad_l, pad_r, ceil_mode); }

namespace {

void check_params(const Pool2dParams& p, const char* op) {
  if (p.n < 1 || p.c < 1) fail_runtime(op, ": non-positive n or c");
  // A pad as large as the kernel would allow windows made only of padding,
  // whose max/average is undefined (PyTorch requires pad <= k/2).
  if (p.pad_t >= p.kh || p.pad_b >= p.kh || p.pad_l >= p.kw || p.pad_r >= p.kw)
    fail_runtime(op, ": padding (", p.pad_t, ",", p.pad_l, ",", p.pad_b, ",", p.pad_r,
                 ") must be smaller than the kernel ", p.kh, "x", p.kw);
}

// Runs plane_fn(x_plane, y_plane) over all n*c planes on the pool.
template <typename PlaneFn>
void for_each_plane(const Pool2dParams& p, const float* x, float* y, ThreadPool& pool, PlaneFn plane_fn) {
  const int64_t in_plane = int64_t(p.h) * p.w, out_plane = int64_t(p.out_h()) * p.out_w();
  const int64_t grain = std::max<int64_t>(1, 65536 / std::max<int64_t>(1, out_plane * p.kh * p.kw));
  pool.parallel_for(int64_t(p.n) * p.c, [&](int64_t begin, int64_t end) {
    for (int64_t pl = begin; pl < end; ++pl) plane_fn(x + pl * in_plane, y + pl * out_plane);
  }, grain);
}

}  // namespace

void max_pool2d(const Pool2dParams& p, const float* x, float* y, ThreadPool& pool) {
  check_params(p, "max_pool2d");
  const int oh = p.out_h(), ow = p.out_w();
  for_each_plane(p, x, y, pool, [&](const float* xp, float* yp) {
    for (int oy = 0; oy < oh; ++oy) {
      const int h0 = std::max(oy * p.stride_h - p.pad_t, 0);
      const int h1 = std::min(oy * p.stride_h - p.pad_t + p.kh, p.h);
      for (int ox = 0; ox < ow; ++ox) {
        const int w0 = std::max(ox * p.stride_w - p.pad_l, 0);
        const int w1 = std::min(ox * p.stride_w - p.pad_l + p.kw, p.w);
        // Padding is -inf, so only real cells can win; windows are never
        // empty thanks to check_params and pool_out_dim.
        float m = -std::numeric_limits<float>::infinity();
        for (int i = h0; i < h1; ++i)
          for (int j = w0; j < w1; ++j) m = std::max(m, xp[int64_t(i) * p.w + j]);
        yp[int64_t(oy) * ow + ox] = m;
      }
    }
  });
}

void avg_pool2d(const Pool2dParams& p, const float* x, float* y, ThreadPool& pool) {
  check_params(p, "avg_pool2d");
  const int oh = p.out_h(), ow = p.out_w();
  for_each_plane(p, x, y, pool, [&](const float* xp, float* yp) {
    for (int oy = 0; oy < oh; ++oy) {
      // PyTorch's rule: the window is first clipped to the padded input
      // (this size is the count_include_pad divisor), then to the real input.
      const int hs = oy * p.stride_h - p.pad_t;
      const int he = std::min(hs + p.kh, p.h + p.pad_b);
      const int h0 = std::max(hs, 0), h1 = std::min(he, p.h);
      for (int ox = 0; ox < ow; ++ox) {
        const int ws = ox * p.stride_w - p.pad_l;
        const int we = std::min(ws + p.kw, p.w + p.pad_r);
        const int w0 = std::max(ws, 0), w1 = std::min(we, p.w);
        float sum = 0.f;
        for (int i = h0; i < h1; ++i)
          for (int j = w0; j < w1; ++j) sum += xp[int64_t(i) * p.w + j];
        const int divisor = p.count_include_pad ? (he - hs) * (we - ws) : (h1 - h0) * (w1 - w0);
        yp[int64_t(oy) * ow + ox] = sum / float(divisor);
      }
    }
  });
}

}  // namespace kiln::cpu
