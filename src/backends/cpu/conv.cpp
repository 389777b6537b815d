// conv2d: im2col + SGEMM per (batch, group), with a direct path for
// depthwise convolutions and no im2col at all for 1x1/stride-1/unpadded
// convolutions (x already is the [c_in, h*w] matrix).
#include <cblas.h>

#include <algorithm>
#include <vector>

#include "backends/cpu/kernels.hpp"
#include "core/error.hpp"
#include "core/half.hpp"

namespace kiln::cpu {

namespace {

void check_params(const Conv2dParams& p) {
  if (p.n < 1 || p.c_in < 1 || p.h < 1 || p.w < 1 || p.c_out < 1 || p.kh < 1 || p.kw < 1)
    fail_runtime("conv2d: non-positive size (n=", p.n, " c_in=", p.c_in, " h=", p.h, " w=", p.w,
                 " c_out=", p.c_out, " k=", p.kh, "x", p.kw, ")");
  if (p.stride_h < 1 || p.stride_w < 1 || p.dil_h < 1 || p.dil_w < 1)
    fail_runtime("conv2d: stride and dilation must be >= 1");
  if (p.pad_t < 0 || p.pad_l < 0 || p.pad_b < 0 || p.pad_r < 0) fail_runtime("conv2d: negative padding");
  if (p.groups < 1 || p.c_in % p.groups != 0 || p.c_out % p.groups != 0)
    fail_runtime("conv2d: groups=", p.groups, " does not divide c_in=", p.c_in, " and c_out=", p.c_out);
  // Checked before out_h()/out_w(): C++ division truncates toward zero, so a
  // negative numerator would otherwise yield a bogus output size of 1.
  if (p.h + p.pad_t + p.pad_b < p.dil_h * (p.kh - 1) + 1 || p.w + p.pad_l + p.pad_r < p.dil_w * (p.kw - 1) + 1)
    fail_runtime("conv2d: kernel ", p.kh, "x", p.kw, " (dilation ", p.dil_h, "x", p.dil_w,
                 ") larger than padded input ", p.h, "x", p.w);
}

// Output indices o in [lo, hi) for which o * stride + offset lies in [0, in).
// Lets inner loops run without per-element bounds checks.
inline void valid_range(int out, int stride, int offset, int in, int& lo, int& hi) {
  lo = offset >= 0 ? 0 : (-offset + stride - 1) / stride;
  hi = (in - 1 - offset) < 0 ? 0 : (in - 1 - offset) / stride + 1;
  lo = std::min(lo, out);
  hi = std::clamp(hi, lo, out);
}

// Bias, residual and activation in one pass over a freshly written output
// row, while it is still in cache.
inline void epilogue_row(float* y, int64_t len, float bias, const float* residual, Activation act) {
  if (residual) {
    for (int64_t i = 0; i < len; ++i) y[i] += bias + residual[i];
  } else if (bias != 0.f) {
    for (int64_t i = 0; i < len; ++i) y[i] += bias;
  }
  if (act != Activation::None) activation(len, y, act, y);
}

// The second input of a conv of a sum (conv2d_of_sum): x_add (same layout as
// x, offset like x) and the storage type the sum is rounded to.
struct SumInput {
  const float* x_add = nullptr;
  DType dtype = DType::F32;
};

// dst[o] = round(a[o * step] + b[o * step]) for o in [lo, hi).
inline void sum_copy(const float* a, const float* b, int64_t step, int64_t lo, int64_t hi, DType t, float* dst) {
  for (int64_t o = lo; o < hi; ++o) dst[o] = round_to_storage(t, a[o * step] + b[o * step]);
}

// Rows [r_begin, r_end) of the [cg*kh*kw, oh*ow] column matrix for the cg
// channels starting at x (plus sum.x_add at the same offsets, when set).
// Row r is (channel, kernel row, kernel column).
void im2col_rows(const Conv2dParams& p, const float* x, int64_t r_begin, int64_t r_end, float* col,
                 const SumInput& sum = {}, int64_t x_add_offset = 0) {
  const int oh = p.out_h(), ow = p.out_w();
  const int64_t hw = int64_t(p.h) * p.w, n_cols = int64_t(oh) * ow;
  for (int64_t r = r_begin; r < r_end; ++r) {
    const int c = int(r / (p.kh * p.kw));
    const int i = int(r / p.kw % p.kh);
    const int j = int(r % p.kw);
    const float* xc = x + c * hw;
    const float* ac = sum.x_add ? sum.x_add + x_add_offset + c * hw : nullptr;
    float* dst = col + r * n_cols;
    int lo, hi;
    valid_range(ow, p.stride_w, j * p.dil_w - p.pad_l, p.w, lo, hi);
    for (int y = 0; y < oh; ++y, dst += ow) {
      const int ih = y * p.stride_h - p.pad_t + i * p.dil_h;
      if (ih < 0 || ih >= p.h) {
        std::fill(dst, dst + ow, 0.f);
        continue;
      }
      const int64_t at = int64_t(ih) * p.w + j * p.dil_w - p.pad_l;
      const float* src = xc + at;
      std::fill(dst, dst + lo, 0.f);
      if (ac) {
        sum_copy(src, ac + at, p.stride_w, lo, hi, sum.dtype, dst);
      } else if (p.stride_w == 1) {
        std::copy(src + lo, src + hi, dst + lo);
      } else {
        for (int o = lo; o < hi; ++o) dst[o] = src[int64_t(o) * p.stride_w];
      }
      std::fill(dst + hi, dst + ow, 0.f);
    }
  }
}

// One output plane of a depthwise convolution (one input channel, one filter).
// A direct loop: im2col would copy every input kh*kw times for a GEMM with a
// single output row, which is all overhead.
void depthwise_plane(const Conv2dParams& p, const float* x, const float* wk, float bias, const float* residual,
                     Activation act, float* y) {
  const int oh = p.out_h(), ow = p.out_w();
  // Column ranges depend only on the kernel column, so compute them once.
  std::vector<int> lo(p.kw), hi(p.kw);
  for (int j = 0; j < p.kw; ++j) valid_range(ow, p.stride_w, j * p.dil_w - p.pad_l, p.w, lo[j], hi[j]);
  for (int oy = 0; oy < oh; ++oy) {
    float* row = y + int64_t(oy) * ow;
    std::fill(row, row + ow, 0.f);
    for (int i = 0; i < p.kh; ++i) {
      const int ih = oy * p.stride_h - p.pad_t + i * p.dil_h;
      if (ih < 0 || ih >= p.h) continue;
      const float* xrow = x + int64_t(ih) * p.w;
      for (int j = 0; j < p.kw; ++j) {
        const float wt = wk[i * p.kw + j];
        const float* src = xrow + j * p.dil_w - p.pad_l;
        if (p.stride_w == 1) {
          for (int o = lo[j]; o < hi[j]; ++o) row[o] += wt * src[o];
        } else {
          for (int o = lo[j]; o < hi[j]; ++o) row[o] += wt * src[int64_t(o) * p.stride_w];
        }
      }
    }
    epilogue_row(row, ow, bias, residual ? residual + int64_t(oy) * ow : nullptr, act);
  }
}

void conv2d_depthwise(const Conv2dParams& p, const float* x, const float* w, const float* bias,
                      const float* residual, Activation act, float* y, ThreadPool& pool) {
  const int64_t in_plane = int64_t(p.h) * p.w, out_plane = int64_t(p.out_h()) * p.out_w();
  const int64_t planes = int64_t(p.n) * p.c_in;
  // Aim for ~64K multiply-adds per chunk so tiny layers are not split into
  // chunks cheaper than the hand-off.
  const int64_t grain = std::max<int64_t>(1, 65536 / std::max<int64_t>(1, out_plane * p.kh * p.kw));
  pool.parallel_for(planes, [&](int64_t begin, int64_t end) {
    for (int64_t pl = begin; pl < end; ++pl) {
      const int c = int(pl % p.c_in);
      depthwise_plane(p, x + pl * in_plane, w + int64_t(c) * p.kh * p.kw, bias ? bias[c] : 0.f,
                      residual ? residual + pl * out_plane : nullptr, act, y + pl * out_plane);
    }
  }, grain);
}

}  // namespace

namespace {

void conv2d_impl(const Conv2dParams& p, const float* x, const SumInput& sum, const float* w, const float* bias,
                 const float* residual, Activation act, float* y, ThreadPool& pool) {
  check_params(p);
  if (p.groups == p.c_in && p.groups == p.c_out && p.groups > 1) {
    if (!sum.x_add) {
      conv2d_depthwise(p, x, w, bias, residual, act, y, pool);
      return;
    }
    // Depthwise has no gather step to fold the sum into: form it once.
    const int64_t count = int64_t(p.n) * p.c_in * p.h * p.w;
    std::vector<float> summed(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i) summed[i] = round_to_storage(sum.dtype, x[i] + sum.x_add[i]);
    conv2d_depthwise(p, summed.data(), w, bias, residual, act, y, pool);
    return;
  }
  const int cg_in = p.c_in / p.groups, m = p.c_out / p.groups;
  const int64_t n_cols = int64_t(p.out_h()) * p.out_w();
  const int64_t k = int64_t(cg_in) * p.kh * p.kw;
  const int64_t hw = int64_t(p.h) * p.w;
  const bool direct = p.kh == 1 && p.kw == 1 && p.stride_h == 1 && p.stride_w == 1 && p.pad_t == 0 &&
                      p.pad_l == 0 && p.pad_b == 0 && p.pad_r == 0;
  const int64_t items = int64_t(p.n) * p.groups;

  // One (batch, group) GEMM: y_g[m, n_cols] = w_g[m, k] * col[k, n_cols].
  // `inner` is the pool used for im2col/epilogue inside the item: the real
  // pool when items run one after another, none when items run in parallel.
  auto run_item = [&](int64_t item, std::vector<float>& col, ThreadPool* inner) {
    const int64_t b = item / p.groups, g = item % p.groups;
    const float* xg = x + (b * p.c_in + g * cg_in) * hw;
    const float* wg = w + g * m * k;
    float* yg = y + (b * p.c_out + g * m) * n_cols;
    const float* src = xg;
    const int64_t x_off = (b * p.c_in + g * cg_in) * hw;  // of xg inside x, and of its partner in x_add
    if (direct && sum.x_add) {
      // A 1x1 conv reads x as its matrix: the summed matrix takes its place.
      col.resize(size_t(k * n_cols));
      sum_copy(xg, sum.x_add + x_off, 1, 0, k * n_cols, sum.dtype, col.data());
      src = col.data();
    } else if (!direct) {
      col.resize(size_t(k * n_cols));
      if (inner) {
        inner->parallel_for(k, [&](int64_t r0, int64_t r1) { im2col_rows(p, xg, r0, r1, col.data(), sum, x_off); },
                            std::max<int64_t>(1, 16384 / n_cols));
      } else {
        im2col_rows(p, xg, 0, k, col.data(), sum, x_off);
      }
      src = col.data();
    }
    auto gemm_rows = [&](int64_t r0, int64_t r1) {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(r1 - r0), int(n_cols), int(k), 1.f, wg + r0 * k,
                  int(k), src, int(n_cols), 0.f, yg + r0 * n_cols, int(n_cols));
    };
    if (inner) {
      // Rows of output channels per chunk, each at least ~256K multiply-adds.
      inner->parallel_for(m, gemm_rows, std::max<int64_t>(1, (int64_t{1} << 18) / std::max<int64_t>(1, k * n_cols)));
    } else {
      gemm_rows(0, m);
    }
    auto epilogue = [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t oc = g * m + r;
        epilogue_row(yg + r * n_cols, n_cols, bias ? bias[oc] : 0.f,
                     residual ? residual + (b * p.c_out + oc) * n_cols : nullptr, act);
      }
    };
    const bool trivial = !bias && !residual && act == Activation::None;
    if (trivial) return;
    if (inner) {
      inner->parallel_for(m, epilogue, std::max<int64_t>(1, 16384 / n_cols));
    } else {
      epilogue(0, m);
    }
  };

  use_single_threaded_blas();
  if (pool.threads() > 1 && items >= pool.threads()) {
    // Enough independent GEMMs to occupy every thread: one per chunk.
    pool.parallel_for(items, [&](int64_t begin, int64_t end) {
      std::vector<float> col;  // one buffer per chunk, reused across its items
      for (int64_t it = begin; it < end; ++it) run_item(it, col, nullptr);
    });
  } else {
    // Few large GEMMs: the pool splits each one by rows.
    std::vector<float> col;
    for (int64_t it = 0; it < items; ++it) run_item(it, col, &pool);
  }
}

}  // namespace

void conv2d(const Conv2dParams& p, const float* x, const float* w, const float* bias, const float* residual,
            Activation act, float* y, ThreadPool& pool) {
  conv2d_impl(p, x, {}, w, bias, residual, act, y, pool);
}

void conv2d_of_sum(const Conv2dParams& p, const float* x, const float* x_add, DType sum_dtype, const float* w,
                   const float* bias, const float* residual, Activation act, float* y, ThreadPool& pool) {
  if (!x_add) fail_runtime("conv2d_of_sum: no second input");
  conv2d_impl(p, x, SumInput{x_add, sum_dtype}, w, bias, residual, act, y, pool);
}

}  // namespace kiln::cpu
