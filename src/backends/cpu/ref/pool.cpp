// max_pool2d, avg_pool2d and global_avg_pool with PyTorch's rules, written
// per output cell. The output size (ceil_mode included) comes from shape
// inference; here only which input cells a window covers and what it divides by.
#include <algorithm>
#include <limits>

#include "backends/cpu/ref/ref.hpp"
#include "ir/attrs.hpp"

namespace kiln::ref {

namespace {

// Calls cell(b, c, oy, ox, y0, y1, x0, x1, divisor_with_pad) for every output
// cell, where [y0, y1) x [x0, x1) is the window's part inside the input and
// divisor_with_pad counts the window's cells inside the padded input
// (PyTorch: a ceil_mode window is cut at the end padding, never beyond).
template <typename Cell>
void for_each_window(const OpArgs& a, Cell cell) {
  const Shape& xs = a.in_shape(0);
  const Shape& ys = a.out_shape();
  const PoolAttrs p = pool_attrs(a.n);
  for (int64_t b = 0; b < xs[0]; ++b)
    for (int64_t c = 0; c < xs[1]; ++c)
      for (int64_t oy = 0; oy < ys[2]; ++oy)
        for (int64_t ox = 0; ox < ys[3]; ++ox) {
          const int64_t ys0 = oy * p.stride_h - p.pad_t, xs0 = ox * p.stride_w - p.pad_l;
          const int64_t ye_pad = std::min(ys0 + p.kh, xs[2] + p.pad_b), xe_pad = std::min(xs0 + p.kw, xs[3] + p.pad_r);
          const int64_t with_pad = (ye_pad - ys0) * (xe_pad - xs0);
          cell(b, c, oy, ox, std::max<int64_t>(ys0, 0), std::min(ys0 + p.kh, xs[2]), std::max<int64_t>(xs0, 0),
               std::min(xs0 + p.kw, xs[3]), with_pad);
        }
}

}  // namespace

Buffer max_pool2d(const OpArgs& a) {
  const Shape& xs = a.in_shape(0);
  const Shape& ys = a.out_shape();
  Buffer y(static_cast<size_t>(shape_numel(ys)));
  for_each_window(a, [&](int64_t b, int64_t c, int64_t oy, int64_t ox, int64_t y0, int64_t y1, int64_t x0, int64_t x1,
                         int64_t) {
    // Padding is -infinity: only input cells compete.
    float m = -std::numeric_limits<float>::infinity();
    for (int64_t i = y0; i < y1; ++i)
      for (int64_t j = x0; j < x1; ++j) m = std::max(m, a.in[0][((b * xs[1] + c) * xs[2] + i) * xs[3] + j]);
    y[((b * ys[1] + c) * ys[2] + oy) * ys[3] + ox] = m;
  });
  return y;
}

Buffer avg_pool2d(const OpArgs& a) {
  const Shape& xs = a.in_shape(0);
  const Shape& ys = a.out_shape();
  const bool include_pad = pool_attrs(a.n).count_include_pad;
  Buffer y(static_cast<size_t>(shape_numel(ys)));
  for_each_window(a, [&](int64_t b, int64_t c, int64_t oy, int64_t ox, int64_t y0, int64_t y1, int64_t x0, int64_t x1,
                         int64_t with_pad) {
    double sum = 0;
    for (int64_t i = y0; i < y1; ++i)
      for (int64_t j = x0; j < x1; ++j) sum += a.in[0][((b * xs[1] + c) * xs[2] + i) * xs[3] + j];
    const int64_t divisor = include_pad ? with_pad : (y1 - y0) * (x1 - x0);
    y[((b * ys[1] + c) * ys[2] + oy) * ys[3] + ox] = static_cast<float>(sum / double(divisor));
  });
  return y;
}

Buffer global_avg_pool(const OpArgs& a) {
  const Shape& xs = a.in_shape(0);
  const int64_t planes = xs[0] * xs[1], hw = xs[2] * xs[3];
  Buffer y(static_cast<size_t>(planes));
  for (int64_t p = 0; p < planes; ++p) {
    double sum = 0;
    for (int64_t i = 0; i < hw; ++i) sum += a.in[0][p * hw + i];
    y[p] = static_cast<float>(sum / double(hw));
  }
  return y;
}

}  // namespace kiln::ref
