// The 8-bit ops on the CPU (issue 13): quantize, dequantize, and the
// quantized conv2d / linear. The layers form the exact sum of code products
// (quant/layer.hpp: exact in double, whatever the order) with OpenBLAS DGEMM
// over im2col columns, then run the epilogue the plain reference runs, so
// both give the same bits.
#include <cblas.h>

#include <algorithm>
#include <vector>

#include "backends/cpu/kernels.hpp"
#include "core/error.hpp"
#include "quant/fp8.hpp"

namespace kiln::cpu {

namespace {

float scale_of(const QuantScales& s, int64_t i) {
  return s.scales.size() == 1 ? s.scales[0] : s.scales[static_cast<size_t>((i / s.inner) % static_cast<int64_t>(s.scales.size()))];
}

}  // namespace

void quantize(int64_t count, const float* x, const QuantScales& s, DType code, float* y, ThreadPool& pool) {
  pool.parallel_for(count, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i)
      y[i] = quant::decode(code, quant::quantize_value(x[i], scale_of(s, i), code, quant::Int8Range::Full));
  }, 16384);
}

void dequantize(int64_t count, const float* x, const QuantScales& s, float* y, ThreadPool& pool) {
  pool.parallel_for(count, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) y[i] = x[i] * scale_of(s, i);
  }, 16384);
}

void qconv2d(const Conv2dParams& p, const float* x, const float* w, const float* residual, const quant::LayerEpilogue& ep,
             float* y, ThreadPool& pool) {
  use_single_threaded_blas();
  const int64_t oh = p.out_h(), ow = p.out_w(), plane = oh * ow;
  const int64_t cg = p.c_in / p.groups, og = p.c_out / p.groups;
  const int64_t k_len = cg * p.kh * p.kw;
  // Weights and columns as doubles: every product and partial sum is exact (quant/layer.hpp).
  const std::vector<double> wd(w, w + static_cast<size_t>(p.c_out) * static_cast<size_t>(k_len));
  std::vector<double> col(static_cast<size_t>(k_len * plane)), acc(static_cast<size_t>(og * plane));
  for (int64_t b = 0; b < p.n; ++b)
    for (int64_t grp = 0; grp < p.groups; ++grp) {
      // col[(c, i, j), (oy, ox)] = x[b, grp*cg + c, oy*sh - pt + i*dh, ox*sw - pl + j*dw] (0 in the padding)
      pool.parallel_for(k_len, [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          const int64_t c = r / (p.kh * p.kw), i = (r / p.kw) % p.kh, j = r % p.kw;
          const float* xc = x + ((b * p.c_in) + grp * cg + c) * p.h * p.w;
          double* row = col.data() + r * plane;
          for (int64_t oy = 0; oy < oh; ++oy) {
            const int64_t iy = oy * p.stride_h - p.pad_t + i * p.dil_h;
            for (int64_t ox = 0; ox < ow; ++ox) {
              const int64_t ix = ox * p.stride_w - p.pad_l + j * p.dil_w;
              row[oy * ow + ox] = (iy < 0 || iy >= p.h || ix < 0 || ix >= p.w) ? 0.0 : double(xc[iy * p.w + ix]);
            }
          }
        }
      }, std::max<int64_t>(1, 4096 / std::max<int64_t>(1, plane)));
      pool.parallel_for(og, [&](int64_t o0, int64_t o1) {
        cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(o1 - o0), static_cast<int>(plane),
                    static_cast<int>(k_len), 1.0, wd.data() + (grp * og + o0) * k_len, static_cast<int>(k_len), col.data(),
                    static_cast<int>(plane), 0.0, acc.data() + o0 * plane, static_cast<int>(plane));
        for (int64_t o = o0; o < o1; ++o) {
          const int64_t oc = grp * og + o;
          const int64_t at = (b * p.c_out + oc) * plane;
          for (int64_t q = 0; q < plane; ++q)
            y[at + q] = ep.apply(oc, acc[static_cast<size_t>(o * plane + q)], residual ? residual + at + q : nullptr);
        }
      }, std::max<int64_t>(1, 65536 / std::max<int64_t>(1, plane * k_len)));
    }
}

void qlinear(int64_t rows, int64_t in, int64_t out, const float* x, const float* w, const quant::LayerEpilogue& ep, float* y,
             ThreadPool& pool) {
  use_single_threaded_blas();
  const std::vector<double> xd(x, x + static_cast<size_t>(rows * in)), wd(w, w + static_cast<size_t>(out * in));
  std::vector<double> acc(static_cast<size_t>(rows * out));
  pool.parallel_for(out, [&](int64_t o0, int64_t o1) {
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(rows), static_cast<int>(o1 - o0), static_cast<int>(in),
                1.0, xd.data(), static_cast<int>(in), wd.data() + o0 * in, static_cast<int>(in), 0.0, acc.data() + o0,
                static_cast<int>(out));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t o = o0; o < o1; ++o) y[r * out + o] = ep.apply(o, acc[static_cast<size_t>(r * out + o)], nullptr);
  }, std::max<int64_t>(1, 65536 / std::max<int64_t>(1, rows * in)));
}

}  // namespace kiln::cpu
