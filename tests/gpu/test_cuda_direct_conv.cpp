// kiln's direct conv (direct_conv.cu: convs of at most 4 input channels, an
// RGB stem) against the CPU reference conv: 1-4 input channels, 3x3 and 7x7
// filters, stride 2 and 1, padding, dilation, residual, every activation, f16
// and bf16, batches, odd sizes. Also: refusals name the reason, and a timing
// probe (printed, never asserted) next to cuDNN's fastest tactic on RT-DETR v2
// r18vd's and ResNet-50's stems:
//   kiln_gpu_tests --gtest_filter='CudaDirectConv*'
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "backends/cuda/cuda_check.hpp"
#include "backends/cuda/cudnn_conv.hpp"
#include "backends/cuda/kernels.hpp"
#include "core/error.hpp"
#include "conv_reference.hpp"
#include "cuda_test_util.hpp"

namespace kiln::cuda::test {
namespace {

struct Case {
  int n, h, w, c, k, r, stride, pad, dil;
  bool residual, bias;
  Activation act;
};

std::string describe(const Case& k, DType dt) {
  return cat(dtype_name(dt), " n", k.n, " ", k.h, "x", k.w, " c", k.c, " -> k", k.k, " ", k.r, "x", k.r, " s", k.stride, " p",
             k.pad, " d", k.dil, k.residual ? " +res" : "", k.bias ? "" : " no bias", " ", activation_name(k.act));
}

DirectConvShape shape_of(const Case& k) {
  return square_conv_shape<DirectConvShape>({k.n, k.h, k.w, k.c, k.k, k.r, k.stride, k.pad, k.dil, k.act});
}

TEST(CudaDirectConv, MatchesCpuReference) {
  KILN_REQUIRE_GPU();
  const Case cases[] = {
      {1, 34, 34, 3, 32, 3, 2, 1, 1, false, true, Activation::Relu},   // r18vd's stem conv, smaller
      {2, 29, 31, 3, 64, 7, 2, 3, 1, false, true, Activation::Relu},   // ResNet-50's stem
      {1, 16, 16, 3, 24, 3, 1, 1, 1, true, true, Activation::Silu},    // stride 1, residual
      {3, 9, 13, 1, 8, 3, 1, 1, 2, false, false, Activation::None},    // one channel, dilation, no bias
      {1, 12, 10, 2, 16, 5, 2, 2, 1, true, true, Activation::Relu6},
      {2, 11, 11, 4, 40, 3, 2, 0, 1, false, true, Activation::Sigmoid},
      {1, 15, 15, 3, 16, 3, 2, 1, 1, false, true, Activation::Gelu},
      {2, 40, 37, 3, 32, 7, 1, 3, 1, true, true, Activation::Relu},    // 7x7 stride 1: several blocks, a ragged last one
  };
  for (DType dt : {DType::F16, DType::BF16})
    for (const Case& k : cases) {
      const std::string what = describe(k, dt);
      const DirectConvShape s = shape_of(k);
      ASSERT_EQ(direct_conv_unsupported(dt, s), "") << what;
      const int64_t in_px = int64_t(k.n) * k.h * k.w, out_px = int64_t(k.n) * s.out_h * s.out_w;
      const auto x_raw = random_values(size_t(in_px) * k.c, 51);  // NHWC, f32
      const auto x = round_all(x_raw, dt);
      const float wscale = 1.f / std::sqrt(float(k.c * k.r * k.r));
      const auto wk = round_all(random_values(size_t(k.k) * k.c * k.r * k.r, 52, -wscale, wscale), dt);  // KRSC
      const auto bias = k.bias ? round_all(random_values(size_t(k.k), 53, -0.5f, 0.5f), dt) : std::vector<float>(k.k, 0.f);
      const auto resid = round_all(random_values(size_t(out_px) * k.k, 54, -1.f, 1.f), dt);
      const std::vector<float> ref = reference_conv_nhwc({k.n, k.h, k.w, k.c, k.k, k.r, k.stride, k.pad, k.dil, k.act}, dt, x,
                                                         {}, wk, bias, k.residual ? resid : std::vector<float>{});
      float ref_max = 0.f;
      for (float v : ref) ref_max = std::max(ref_max, std::fabs(v));
      const auto dx = upload(x, dt), dw = upload(wk, dt), db = upload(bias, dt), dr = upload(resid, dt);
      const auto dy = alloc(size_t(out_px) * k.k, dt);
      direct_conv_nhwc(dx->ptr(), dw->ptr(), k.bias ? db->ptr() : nullptr, k.residual ? dr->ptr() : nullptr, dy->ptr(), dt, s,
                       k.act, nullptr);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << what;
      const auto got = download(dy->ptr(), ref.size(), dt);
      // The NCHW f32 form gets the unrounded input and must round it to dt as the cast step would: the same bits.
      std::vector<float> x_nchw(x_raw.size());
      for (int64_t b = 0; b < k.n; ++b)
        for (int64_t p = 0; p < int64_t(k.h) * k.w; ++p)
          for (int c = 0; c < k.c; ++c)
            x_nchw[size_t((b * k.c + c) * k.h * k.w + p)] = x_raw[size_t((b * k.h * k.w + p) * k.c + c)];
      const auto dxp = upload(x_nchw, DType::F32);
      const auto dyp = alloc(size_t(out_px) * k.k, dt);
      direct_conv_nchw_f32(static_cast<const float*>(dxp->ptr()), dw->ptr(), k.bias ? db->ptr() : nullptr,
                           k.residual ? dr->ptr() : nullptr, dyp->ptr(), dt, s, k.act, nullptr);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << what;
      EXPECT_EQ(download(dyp->ptr(), ref.size(), dt), got) << what << ": NCHW f32 input";
      // One rounding of the output after an f32 sum (f16: 2^-11 relative, bf16: 2^-8), as igemm_conv's test.
      const double tol = (dt == DType::F16 ? 5e-3 : 3e-2) * std::max(1.f, ref_max);
      double worst = 0;
      for (size_t i = 0; i < ref.size(); ++i) {
        const double d = std::fabs(double(got[i]) - ref[i]);
        worst = std::isnan(d) ? INFINITY : std::max(worst, d);
      }
      EXPECT_LE(worst, tol) << what;
    }
}

TEST(CudaDirectConv, RefusesWhatItCannotRun) {
  const DirectConvShape ok = shape_of({1, 16, 16, 3, 32, 3, 2, 1, 1, false, true, Activation::Relu});
  EXPECT_EQ(direct_conv_unsupported(DType::F16, ok), "");
  EXPECT_NE(direct_conv_unsupported(DType::F32, ok).find("dtype f32"), std::string::npos);
  DirectConvShape s = ok;
  s.c = 5;
  EXPECT_NE(direct_conv_unsupported(DType::F16, s).find("5 input channels (at most 4)"), std::string::npos);
  s = ok, s.k = 20;
  EXPECT_NE(direct_conv_unsupported(DType::F16, s).find("20 output channels"), std::string::npos);
  s = ok, s.r = s.s = 23, s.c = 4;  // 23 * 23 * 4 * 8 f32 = 66 KiB per 8 output channels
  EXPECT_NE(direct_conv_unsupported(DType::F16, s).find("in shared memory"), std::string::npos);
  s = ok, s.k = 8 * 65536;
  EXPECT_NE(direct_conv_unsupported(DType::F16, s).find("524288 output channels (at most 524280)"), std::string::npos);
  s = ok, s.x_stride = 16;
  EXPECT_NE(direct_conv_unsupported(DType::F16, s).find("pixel strides"), std::string::npos);
  s = ok, s.out_w = 0;
  EXPECT_NE(direct_conv_unsupported(DType::F16, s).find("empty"), std::string::npos);
  // The launcher refuses before anything runs.
  EXPECT_THROW(direct_conv_nhwc(nullptr, nullptr, nullptr, nullptr, nullptr, DType::F32, ok, Activation::None, nullptr), Error);
}

TEST(CudaDirectConvPerf, Stems) {
  KILN_REQUIRE_GPU();
  cudnnHandle_t h;
  KILN_CUDNN_CHECK(cudnnCreate(&h));
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  const DType dt = DType::F16;
  struct Stem {
    const char* name;
    Case k;
  };
  const Stem stems[] = {{"r18vd stem.0 640 3->32 3x3 s2", {1, 640, 640, 3, 32, 3, 2, 1, 1, false, true, Activation::Relu}},
                        {"r18vd b8", {8, 640, 640, 3, 32, 3, 2, 1, 1, false, true, Activation::Relu}},
                        {"resnet50 stem 224 3->64 7x7 s2", {1, 224, 224, 3, 64, 7, 2, 3, 1, false, true, Activation::Relu}}};
  std::printf("%-32s %10s %10s %16s %16s\n", "stem", "cudnn us", "direct us", "cast+cudnn us", "direct nchw us");
  for (const Stem& sm : stems) {
    const Case& k = sm.k;
    const DirectConvShape s = shape_of(k);
    const size_t in_px = size_t(k.n) * k.h * k.w, out_px = size_t(k.n) * s.out_h * s.out_w;
    const auto x = upload(random_values(in_px * k.c, 1), dt);
    const auto x32 = upload(random_values(in_px * k.c, 1), DType::F32);  // the engine's NCHW f32 input
    const auto w = upload(random_values(size_t(k.k) * k.r * k.r * k.c, 2, -0.1f, 0.1f), dt);
    const auto b = upload(random_values(size_t(k.k), 3), dt);
    const auto y = alloc(out_px * k.k, dt);
    ConvDesc d;
    d.dtype = dt, d.n = k.n, d.c = k.c, d.k = k.k, d.h = k.h, d.w = k.w, d.r = d.s = k.r;
    d.stride_h = d.stride_w = k.stride, d.pad_t = d.pad_l = d.pad_b = d.pad_r = k.pad;
    d.has_bias = true, d.act = k.act;
    ConvOp op(h, d);
    const DevBuf ws(size_t(256) << 20);
    op.autotune(h, x->ptr(), w->ptr(), b->ptr(), nullptr, y->ptr(), ws.ptr(), size_t(256) << 20, st, 1 << 20);
    const double cudnn_us = graph_us(st, [&] { op.run(h, x->ptr(), w->ptr(), b->ptr(), nullptr, y->ptr(), ws.ptr(), st); });
    PdlDefault scope(true);
    const double direct_us =
        graph_us(st, [&] { direct_conv_nhwc(x->ptr(), w->ptr(), b->ptr(), nullptr, y->ptr(), dt, s, k.act, st); });
    // The engine's first step and the stem as they run today (the input's NHWC cast, then cuDNN), against one launch.
    const auto* xf = static_cast<const float*>(x32->ptr());
    const double cast_cudnn_us = graph_us(st, [&] {
      nchw_f32_to_nhwc(xf, x->ptr(), dt, k.n, k.c, k.h, k.w, st);
      op.run(h, x->ptr(), w->ptr(), b->ptr(), nullptr, y->ptr(), ws.ptr(), st);
    });
    const double nchw_us =
        graph_us(st, [&] { direct_conv_nchw_f32(xf, w->ptr(), b->ptr(), nullptr, y->ptr(), dt, s, k.act, st); });
    std::printf("%-32s %10.2f %10.2f %16.2f %16.2f\n", sm.name, cudnn_us, direct_us, cast_cudnn_us, nchw_us);
  }
  cudaStreamDestroy(st);
  cudnnDestroy(h);
}

}  // namespace
}  // namespace kiln::cuda::test
