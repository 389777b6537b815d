// kiln's window conv (window_conv.cu) against the CPU reference conv of the
// (rounded) sum, on channel windows of wider buffers: Res2Net's chunk shapes
// (c = k = 32/56/104/208 at 56..7 pixels), strides, dilation, 1x1 and 5x5
// filters, batches, f16 and bf16. Also: the fused add gives the same bits as
// a stored add followed by the conv, channels outside the output window are
// untouched, and unsupported shapes are refused with a reason.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "backends/cpu/kernels.hpp"
#include "backends/cuda/kernels.hpp"
#include "core/error.hpp"
#include "conv_reference.hpp"
#include "cuda_test_util.hpp"

namespace kiln::cuda {
namespace {

using test::alloc;
using test::download;
using test::random_values;
using test::round_all;
using test::upload;

struct Case {
  int n, h, w, c, k, r, stride, pad, dil;
  int xw, xo;  // x: channels [xo, xo + c) of an xw-wide buffer
  int aw, ao;  // x_add likewise; aw == 0: no add
  int yw, yo;  // y: channels [yo, yo + k) of a yw-wide buffer
  Activation act;
};

std::string describe(const Case& k, DType dt) {
  return cat(dtype_name(dt), " n", k.n, " ", k.h, "x", k.w, " c", k.c, "@", k.xo, "/", k.xw, k.aw ? cat(" +@", k.ao, "/", k.aw) : "",
             " -> k", k.k, "@", k.yo, "/", k.yw, " ", k.r, "x", k.r, " s", k.stride, " p", k.pad, " d", k.dil, " ",
             activation_name(k.act));
}

// Channels [off, off + c) of each of `rows` pixels of a wide buffer.
std::vector<float> window(const std::vector<float>& wide, int64_t rows, int wide_c, int off, int c) {
  std::vector<float> d(size_t(rows) * c);
  for (int64_t p = 0; p < rows; ++p)
    for (int ch = 0; ch < c; ++ch) d[size_t(p) * c + ch] = wide[size_t(p) * wide_c + off + ch];
  return d;
}

WindowConvShape shape_of(const Case& k) {
  WindowConvShape s = test::square_conv_shape<WindowConvShape>({k.n, k.h, k.w, k.c, k.k, k.r, k.stride, k.pad, k.dil, k.act});
  s.x_stride = k.xw, s.x_add_stride = k.aw ? k.aw : k.c, s.y_stride = k.yw;
  return s;
}

const Case kCases[] = {
    // Res2Net-50 26w_4s at batch 1 after pad_channels: chained (with add) and first-block (stride 2) chunks.
    {1, 56, 56, 32, 32, 3, 1, 1, 1, 128, 32, 128, 0, 128, 0, Activation::Relu},
    {1, 56, 56, 32, 32, 3, 2, 1, 1, 256, 64, 0, 0, 128, 32, Activation::Relu},
    {1, 28, 28, 56, 56, 3, 1, 1, 1, 224, 112, 224, 56, 224, 56, Activation::Relu},
    {1, 14, 14, 104, 104, 3, 1, 1, 1, 416, 104, 416, 0, 416, 208, Activation::Relu},
    {1, 7, 7, 208, 208, 3, 1, 1, 1, 832, 416, 832, 208, 832, 416, Activation::Relu},
    {1, 14, 14, 208, 208, 3, 2, 1, 1, 832, 0, 0, 0, 832, 0, Activation::Relu},
    // Batches, dense buffers, odd spatial sizes, other filters and activations.
    {4, 28, 28, 32, 32, 3, 1, 1, 1, 32, 0, 32, 0, 32, 0, Activation::None},
    {3, 5, 11, 8, 24, 1, 1, 0, 1, 16, 8, 8, 0, 24, 0, Activation::Relu6},
    {2, 9, 7, 16, 8, 5, 1, 2, 1, 48, 16, 0, 0, 16, 8, Activation::Silu},
    {1, 13, 10, 24, 40, 3, 2, 2, 2, 24, 0, 72, 48, 40, 0, Activation::Relu},
};

TEST(CudaWindowConv, MatchesCpuReferenceOnWindows) {
  KILN_REQUIRE_GPU();
  for (DType dt : {DType::F16, DType::BF16})
    for (const Case& k : kCases) {
      const std::string what = describe(k, dt);
      const WindowConvShape s = shape_of(k);
      ASSERT_EQ(window_conv_unsupported(dt, s), "") << what;
      const int64_t in_px = int64_t(k.n) * k.h * k.w, out_px = int64_t(k.n) * s.out_h * s.out_w;
      const auto xwide = round_all(random_values(size_t(in_px) * k.xw, 11), dt);
      const auto awide = k.aw ? round_all(random_values(size_t(in_px) * k.aw, 12), dt) : std::vector<float>{};
      const float wscale = 1.f / std::sqrt(float(k.c * k.r * k.r));
      const auto wk = round_all(random_values(size_t(k.k) * k.c * k.r * k.r, 13, -wscale, wscale), dt);  // KRSC
      const auto bias = round_all(random_values(size_t(k.k), 14, -0.5f, 0.5f), dt);
      const auto y0 = round_all(random_values(size_t(out_px) * k.yw, 15), dt);

      // Reference: the CPU conv of the sum, rounded to dt as an add node stores it.
      const auto xd = window(xwide, in_px, k.xw, k.xo, k.c);
      const auto ad = k.aw ? window(awide, in_px, k.aw, k.ao, k.c) : std::vector<float>{};
      const std::vector<float> ref =
          test::reference_conv_nhwc({k.n, k.h, k.w, k.c, k.k, k.r, k.stride, k.pad, k.dil, k.act}, dt, xd, ad, wk, bias, {});
      float ref_max = 0.f;
      for (float v : ref) ref_max = std::max(ref_max, std::fabs(v));

      const size_t es = dtype_size(dt);
      const auto dx = upload(xwide, dt), dw = upload(wk, dt), db = upload(bias, dt), dy = upload(y0, dt);
      const auto da = k.aw ? upload(awide, dt) : nullptr;
      auto at = [&](const std::unique_ptr<test::DevBuf>& b, int off) {
        return b ? static_cast<void*>(static_cast<char*>(b->ptr()) + off * es) : nullptr;
      };
      window_conv_nhwc(at(dx, k.xo), at(da, k.ao), dw->ptr(), db->ptr(), at(dy, k.yo), dt, s, k.act, nullptr);
      const auto got = download(dy->ptr(), y0.size(), dt);

      // f16: max|d| <= 5e-3 * max|ref| (f32 accumulation, one rounding of the output); bf16: 3e-2.
      const double tol = (dt == DType::F16 ? 5e-3 : 3e-2) * std::max(1.f, ref_max);
      double worst = 0;
      size_t touched = 0;
      for (int64_t px = 0; px < out_px; ++px)
        for (int ch = 0; ch < k.yw; ++ch) {
          const float g = got[size_t(px) * k.yw + ch];
          if (ch >= k.yo && ch < k.yo + k.k) {
            const double d = std::fabs(double(g) - ref[size_t(px) * k.k + ch - k.yo]);
            worst = std::isnan(d) ? INFINITY : std::max(worst, d);
          } else if (g != y0[size_t(px) * k.yw + ch]) {
            ++touched;
          }
        }
      EXPECT_LE(worst, tol) << what;
      EXPECT_EQ(touched, 0u) << what << ": wrote outside its output window";

      // The fused add is bit-identical to storing the add and convolving the result.
      if (k.aw) {
        const auto sum = alloc(size_t(in_px) * k.c, dt), y1 = alloc(size_t(out_px) * k.k, dt),
                   y2 = alloc(size_t(out_px) * k.k, dt);
        add_strided_nhwc(at(dx, k.xo), k.xw, at(da, k.ao), k.aw, sum->ptr(), k.c, in_px, k.c, dt, Activation::None, nullptr);
        WindowConvShape dense = s;
        dense.x_stride = k.c, dense.x_add_stride = k.c, dense.y_stride = k.k;
        window_conv_nhwc(sum->ptr(), nullptr, dw->ptr(), db->ptr(), y1->ptr(), dt, dense, k.act, nullptr);
        WindowConvShape fused = s;
        fused.y_stride = k.k;
        window_conv_nhwc(at(dx, k.xo), at(da, k.ao), dw->ptr(), db->ptr(), y2->ptr(), dt, fused, k.act, nullptr);
        const auto a = download(y1->ptr(), size_t(out_px) * k.k, dt), b = download(y2->ptr(), size_t(out_px) * k.k, dt);
        size_t differ = 0;
        for (size_t i = 0; i < a.size(); ++i) differ += a[i] != b[i];
        EXPECT_EQ(differ, 0u) << what << ": fused add differs from a stored add";
      }
    }
}

// Grouped launches (a first Res2Net block's chunk convs side by side) and
// side jobs (the pass-through chunk pooled or copied into the concat) give
// exactly what separate launches and the pool/copy kernels give; every
// launch override stays within the tolerance of the reference.
TEST(CudaWindowConv, GroupsSideJobsAndLaunchShapes) {
  KILN_REQUIRE_GPU();
  for (DType dt : {DType::F16, DType::BF16})
    for (int stride : {1, 2}) {
      // conv1's output: 4 chunks of 24 channels in a 96-wide buffer; the concat likewise.
      const int n = 2, h = 11, w = 9, c = 24, chunks = 4, wide = c * chunks;
      Case k{n, h, w, c, c, 3, stride, 1, 1, wide, 0, 0, 0, wide, 0, Activation::Relu};
      WindowConvShape s = shape_of(k);
      const int64_t in_px = int64_t(n) * h * w, out_px = int64_t(n) * s.out_h * s.out_w;
      const std::string what = describe(k, dt);
      const auto x = round_all(random_values(size_t(in_px) * wide, 21), dt);
      const float ws = 1.f / std::sqrt(float(c * 9));
      const auto wts = round_all(random_values(size_t(3) * c * 9 * c, 22, -ws, ws), dt);  // 3 filters side by side
      const auto bias = round_all(random_values(size_t(3) * c, 23, -0.5f, 0.5f), dt);
      const auto y0 = round_all(random_values(size_t(out_px) * wide, 24), dt);
      const size_t es = dtype_size(dt), wsz = size_t(c) * 9 * c;
      const auto dx = upload(x, dt), dw = upload(wts, dt), db = upload(bias, dt);
      const auto grouped = upload(y0, dt), separate = upload(y0, dt);
      auto at = [&](const std::unique_ptr<test::DevBuf>& b, size_t elems) {
        return static_cast<void*>(static_cast<char*>(b->ptr()) + elems * es);
      };
      // Separate: three convs, then the pool (or copy) of chunk 3 into the concat's last window.
      WindowConvShape sg = s;
      sg.groups = 3, sg.x_group_step = c, sg.y_group_step = c;
      const WindowLaunch same = window_conv_launch(sg);  // same split-K order, so the same bits
      for (int j = 0; j < 3; ++j)
        window_conv_nhwc(at(dx, j * c), nullptr, at(dw, j * wsz), at(db, j * c), at(separate, j * c), dt, s, k.act, nullptr,
                         {}, same);
      PoolShape ps{n, h, w, c, s.out_h, s.out_w, 3, 3, stride, stride, 1, 1, true, 1, 1};
      if (stride == 1) ps = PoolShape{n, h, w, c, h, w, 1, 1, 1, 1, 0, 0, true, 0, 0};  // the chained block's copy
      ps.x_stride = wide, ps.y_stride = wide;
      if (stride == 1) copy_channels_nhwc(at(dx, 3 * c), wide, 0, at(separate, 3 * c), wide, 0, c, in_px, dt, nullptr);
      else avg_pool_nhwc(at(dx, 3 * c), at(separate, 3 * c), dt, ps, nullptr);
      // Grouped: one launch does all of it.
      WindowSide side;
      side.src = at(dx, 3 * c), side.dst = at(grouped, 3 * c), side.pool = ps;
      ASSERT_EQ(window_conv_unsupported(dt, sg, &ps), "") << what;
      window_conv_nhwc(dx->ptr(), nullptr, dw->ptr(), db->ptr(), grouped->ptr(), dt, sg, k.act, nullptr, side);
      const auto a = download(grouped->ptr(), y0.size(), dt), b = download(separate->ptr(), y0.size(), dt);
      size_t differ = 0;
      for (size_t i = 0; i < a.size(); ++i) differ += a[i] != b[i];
      EXPECT_EQ(differ, 0u) << what << (stride == 1 ? " +copy" : " +pool") << ": grouped launch differs from separate ones";

      // Launch overrides: every tile width and split-K depth against the default launch.
      for (int nt : {1, 2, 4})
        for (int warps : {1, 2, 4, 8, 16}) {
          const auto yo = upload(y0, dt);
          window_conv_nhwc(dx->ptr(), nullptr, dw->ptr(), db->ptr(), yo->ptr(), dt, sg, k.act, nullptr, {}, {nt, warps});
          const auto got = download(yo->ptr(), y0.size(), dt);
          double worst = 0, ref_max = 0;
          for (int64_t px = 0; px < out_px; ++px)
            for (int ch = 0; ch < 3 * c; ++ch) {
              const size_t i = size_t(px) * wide + ch;
              worst = std::max(worst, std::fabs(double(got[i]) - double(a[i])));
              ref_max = std::max(ref_max, std::fabs(double(a[i])));
            }
          // Only the f32 summation order differs: two roundings of the output apart at most.
          EXPECT_LE(worst, (dt == DType::F16 ? 2e-3 : 1.6e-2) * std::max(1.0, ref_max))
              << what << " nt " << nt << " warps " << warps;
        }
    }
}

// Needs no GPU: the shape check runs before any launch.
TEST(CudaWindowConv, RefusesWhatItCannotRun) {
  WindowConvShape s = shape_of(kCases[0]);
  EXPECT_NE(window_conv_unsupported(DType::F32, s).find("f16/bf16"), std::string::npos);
  WindowConvShape odd = s;
  odd.c = 26, odd.x_stride = 104;
  EXPECT_NE(window_conv_unsupported(DType::F16, odd).find("channels 26"), std::string::npos);
  WindowConvShape narrow = s;
  narrow.y_stride = 16;  // narrower than k
  EXPECT_NE(window_conv_unsupported(DType::F16, narrow).find("pixel strides"), std::string::npos);
  EXPECT_THROW(window_conv_nhwc(nullptr, nullptr, nullptr, nullptr, nullptr, DType::F32, s, Activation::Relu, nullptr),
               Error);
  PoolShape side{s.n, s.h, s.w, 32, s.out_h + 1, s.out_w, 1, 1, 1, 1, 0, 0, true, 0, 0};
  side.x_stride = side.y_stride = 128;
  EXPECT_NE(window_conv_unsupported(DType::F16, s, &side).find("side job over"), std::string::npos);
  side.out_h = s.out_h, side.c = 31;
  EXPECT_NE(window_conv_unsupported(DType::F16, s, &side).find("side job of 31"), std::string::npos);
}

}  // namespace
}  // namespace kiln::cuda
