// kiln's sm90 conv (conv_sm90.hpp: CUTLASS's implicit-GEMM fprop with TMA and
// wgmma, the conv layer's epilogue in its epilogue visitor tree) against the
// CPU reference conv, with every configuration that takes the case: RT-DETR
// v2 r18vd's conv kinds at small sizes (the stem's 32-channel convs, stride-2
// downsampling, basic blocks with their residual, the encoder's 1x1 and 3x3
// SiLU convs), output channels that leave part of an N tile empty, batches,
// odd sizes, dilation with stride, no bias, pixel strides on x and y; with
// and without the PDL attribute. Also: nothing outside the output window is
// written, and unsupported convs are refused with a reason.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "backends/cuda/conv_sm90.hpp"
#include "backends/cuda/kernels.hpp"
#include "core/error.hpp"
#include "conv_reference.hpp"
#include "cuda_test_util.hpp"

namespace kiln::cuda::test {
namespace {

struct Case {
  int n, h, w, c, k, r, stride, pad, dil;
  bool residual, bias;
  int xw, yw;  // pixel strides of x and y (0: dense)
  Activation act;
};

std::string describe(const Case& k, int cfg) {
  return cat("n", k.n, " ", k.h, "x", k.w, " c", k.c, " -> k", k.k, " ", k.r, "x", k.r, " s", k.stride, " p", k.pad, " d", k.dil,
             k.residual ? " +res" : "", k.bias ? "" : " no bias", k.xw ? cat(" x_stride ", k.xw) : "",
             k.yw ? cat(" y_stride ", k.yw) : "", " ", activation_name(k.act), " | ",
             cfg >= 0 ? conv_sm90_config_name(cfg) : "");
}

IgemmConvShape shape_of(const Case& k) {
  IgemmConvShape s = square_conv_shape<IgemmConvShape>({k.n, k.h, k.w, k.c, k.k, k.r, k.stride, k.pad, k.dil, k.act});
  s.x_stride = k.xw, s.y_stride = k.yw;
  return s;
}

const Case kCases[] = {
    // r18vd's stem (32-channel inputs) and basic blocks, smaller maps.
    {1, 17, 17, 32, 32, 3, 1, 1, 1, false, true, 0, 0, Activation::Relu},
    {1, 17, 17, 32, 64, 3, 1, 1, 1, false, true, 0, 0, Activation::Relu},
    {1, 20, 20, 64, 64, 3, 1, 1, 1, true, true, 0, 0, Activation::Relu},
    {1, 21, 21, 64, 128, 3, 2, 1, 1, false, true, 0, 0, Activation::Relu},
    {1, 10, 10, 128, 128, 3, 1, 1, 1, true, true, 0, 0, Activation::Relu},
    {1, 9, 9, 256, 512, 3, 2, 1, 1, false, true, 0, 0, Activation::Relu},
    {1, 5, 5, 512, 512, 3, 1, 1, 1, true, true, 0, 0, Activation::Relu},
    // The encoder's 1x1 and 3x3 convs (SiLU), a 1x1 projection without activation.
    {1, 10, 10, 256, 128, 1, 1, 0, 1, false, true, 0, 0, Activation::Silu},
    {1, 10, 10, 128, 128, 3, 1, 1, 1, false, true, 0, 0, Activation::Silu},
    {1, 6, 6, 256, 256, 1, 1, 0, 1, false, true, 0, 0, Activation::None},
    // k not a multiple of the tile, batches, odd sizes, dilation with stride, no bias, 5x5.
    {2, 7, 9, 64, 40, 3, 1, 1, 1, true, true, 0, 0, Activation::Relu6},
    {3, 5, 11, 64, 24, 1, 1, 0, 1, false, false, 0, 0, Activation::Relu},
    {2, 9, 7, 64, 16, 5, 1, 2, 1, false, true, 0, 0, Activation::Sigmoid},
    {1, 13, 10, 64, 136, 3, 2, 2, 2, true, true, 0, 0, Activation::Relu},
    // Channel windows: x and y inside wider buffers.
    {1, 12, 12, 64, 64, 3, 1, 1, 1, false, true, 96, 128, Activation::Relu},
};

TEST(CudaSm90Conv, EveryConfigurationMatchesCpuReference) {
  KILN_REQUIRE_GPU();
  if (conv_sm90_configs() == 0) GTEST_SKIP() << "built without CUTLASS's headers";
  const IgemmConvShape probe = shape_of(kCases[2]);
  if (conv_sm90_unsupported(0, DType::F16, probe, false, Activation::Relu).find("compute capability") != std::string::npos)
    GTEST_SKIP() << "not a compute capability 9.0 device";
  const DType dt = DType::F16;
  for (const Case& k : kCases) {
    const IgemmConvShape s = shape_of(k);
    const int xw = k.xw ? k.xw : k.c, yw = k.yw ? k.yw : k.k;
    const int64_t in_px = int64_t(k.n) * k.h * k.w, out_px = int64_t(k.n) * s.out_h * s.out_w;
    const auto xwide = round_all(random_values(size_t(in_px) * xw, 41), dt);
    const float wscale = 1.f / std::sqrt(float(k.c * k.r * k.r));
    const auto wk = round_all(random_values(size_t(k.k) * k.c * k.r * k.r, 42, -wscale, wscale), dt);  // KRSC
    const auto bias = k.bias ? round_all(random_values(size_t(k.k), 43, -0.5f, 0.5f), dt) : std::vector<float>(k.k, 0.f);
    const auto resid = round_all(random_values(size_t(out_px) * k.k, 44, -1.f, 1.f), dt);
    const auto y0 = round_all(random_values(size_t(out_px) * yw, 45), dt);

    std::vector<float> xd(size_t(in_px) * k.c);
    for (int64_t p = 0; p < in_px; ++p)
      for (int ch = 0; ch < k.c; ++ch) xd[size_t(p) * k.c + ch] = xwide[size_t(p) * xw + ch];
    const std::vector<float> ref = reference_conv_nhwc({k.n, k.h, k.w, k.c, k.k, k.r, k.stride, k.pad, k.dil, k.act}, dt, xd,
                                                       {}, wk, bias, k.residual ? resid : std::vector<float>{});
    float ref_max = 0.f;
    for (float v : ref) ref_max = std::max(ref_max, std::fabs(v));

    const auto dx = upload(xwide, dt), dw = upload(wk, dt), db = upload(bias, dt), dr = upload(resid, dt);
    int ran = 0;
    for (int cfg = 0; cfg < conv_sm90_configs(); ++cfg) {
      const std::string what = describe(k, cfg);
      if (const std::string why = conv_sm90_unsupported(cfg, dt, s, k.residual, k.act); !why.empty()) {
        // Only the K chunk may refuse these cases: the 64-channel chunks on 32-channel inputs.
        EXPECT_NE(why.find("not a multiple of the tile's K chunk"), std::string::npos) << what << ": " << why;
        continue;
      }
      for (bool pdl : {false, true}) {
        const auto dy = upload(y0, dt);
        conv_sm90_nhwc(cfg, dx->ptr(), dw->ptr(), k.bias ? db->ptr() : nullptr, k.residual ? dr->ptr() : nullptr, dy->ptr(), dt,
                       s, k.act, pdl, nullptr);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << what;
        const auto got = download(dy->ptr(), y0.size(), dt);
        // f16: max|d| <= 5e-3 * max|ref| (f32 accumulation, one rounding of the output), as igemm_conv's test.
        const double tol = 5e-3 * std::max(1.f, ref_max);
        const auto [worst, touched] = check_output_window(got, ref, y0, out_px, k.k, yw);
        EXPECT_LE(worst, tol) << what << (pdl ? " (PDL)" : "");
        EXPECT_EQ(touched, 0u) << what << ": wrote outside its output window";
      }
      ++ran;
    }
    EXPECT_GE(ran, k.c % 64 ? 2 : 5) << describe(k, -1);
  }
}

TEST(CudaSm90Conv, RefusesWhatItCannotRun) {
  if (conv_sm90_configs() == 0) GTEST_SKIP() << "built without CUTLASS's headers";
  // Names: every configuration is found by its name, and nothing else is.
  for (int cfg = 0; cfg < conv_sm90_configs(); ++cfg) {
    EXPECT_EQ(conv_sm90_config_of(conv_sm90_config_name(cfg)), cfg);
    EXPECT_EQ(std::string(conv_sm90_config_name(cfg)).rfind("kiln sm90 conv ", 0), 0u);
  }
  EXPECT_EQ(conv_sm90_config_of("kiln sm90 conv 1x1x1"), -1);
  EXPECT_EQ(conv_sm90_config_of("kiln igemm 64x64 s1"), -1);
  const int c64 = conv_sm90_config_of("kiln sm90 conv 64x64x64");
  const int c32 = conv_sm90_config_of("kiln sm90 conv 128x32x32");
  ASSERT_GE(c64, 0);
  ASSERT_GE(c32, 0);
  // What no device is needed to refuse (the device check comes after these).
  const Case base{1, 8, 8, 64, 64, 3, 1, 1, 1, false, true, 0, 0, Activation::Relu};
  const IgemmConvShape ok = shape_of(base);
  auto why = [](int cfg, DType dt, const IgemmConvShape& s, Activation a = Activation::Relu) {
    return conv_sm90_unsupported(cfg, dt, s, false, a);
  };
  EXPECT_NE(why(c64, DType::BF16, ok).find("dtype bf16 (f16 only)"), std::string::npos);
  IgemmConvShape s = ok;
  s.c = 12;
  EXPECT_NE(why(c64, DType::F16, s).find("channels 12 -> 64"), std::string::npos);
  s = ok, s.c = 32;
  EXPECT_NE(why(c64, DType::F16, s).find("not a multiple of the tile's K chunk of 64"), std::string::npos);
  s = ok, s.c = 96;
  EXPECT_NE(why(c64, DType::F16, s).find("96 input channels"), std::string::npos);
  s = ok, s.x_stride = 68;
  EXPECT_NE(why(c64, DType::F16, s).find("pixel strides"), std::string::npos);
  s = ok, s.out_h = 0;
  EXPECT_NE(why(c64, DType::F16, s).find("empty"), std::string::npos);
  EXPECT_NE(why(c64, DType::F16, ok, Activation::Gelu).find("activation gelu"), std::string::npos);
  EXPECT_NE(conv_sm90_unsupported(-1, DType::F16, ok, false, Activation::Relu).find("no configuration -1"), std::string::npos);
  // The launcher refuses before anything runs.
  EXPECT_THROW(conv_sm90_nhwc(c64, nullptr, nullptr, nullptr, nullptr, nullptr, DType::BF16, ok, Activation::None, false, nullptr),
               Error);
  KILN_REQUIRE_GPU();
  if (why(c64, DType::F16, ok).find("compute capability") != std::string::npos) GTEST_SKIP() << "not sm_90";
  // On sm_90 the shapes above that pass the checks are taken: r18vd's conv kinds at 640x640.
  EXPECT_EQ(why(c64, DType::F16, ok), "");
  for (const Case& k : {Case{1, 160, 160, 64, 64, 3, 1, 1, 1, true, true, 0, 0, Activation::Relu},
                        Case{1, 20, 20, 512, 512, 3, 1, 1, 1, true, true, 0, 0, Activation::Relu},
                        Case{1, 40, 40, 256, 512, 3, 2, 1, 1, false, true, 0, 0, Activation::Relu},
                        Case{1, 80, 80, 512, 128, 1, 1, 0, 1, false, true, 0, 0, Activation::Silu}})
    EXPECT_EQ(conv_sm90_unsupported(c64, DType::F16, shape_of(k), k.residual, k.act), "") << describe(k, c64);
  const Case stem{1, 320, 320, 32, 64, 3, 1, 1, 1, false, true, 0, 0, Activation::Relu};
  EXPECT_EQ(conv_sm90_unsupported(c32, DType::F16, shape_of(stem), false, stem.act), "") << describe(stem, c32);
}

// Session 30 and 31: an engine whose convs all run the sm90 conv gave different
// bits in two calls of one context (Fixtures/CudaRtDetr.Sm90ConvRunsTheConvsTheCacheNames),
// with and without PDL. This narrows it to the kernel or to the engine: r18vd's
// conv kinds at full size (640x640 input), each configuration that takes them,
// three launches into output buffers filled with different garbage each time,
// with and without PDL: every launch must give the first one's bits.
TEST(CudaSm90Conv, RepeatedLaunchesGiveTheSameBits) {
  KILN_REQUIRE_GPU();
  if (conv_sm90_configs() == 0) GTEST_SKIP() << "built without CUTLASS's headers";
  const DType dt = DType::F16;
  const Case full[] = {
      {1, 320, 320, 32, 32, 3, 1, 1, 1, false, true, 0, 0, Activation::Relu},  // the stem's second and third convs
      {1, 320, 320, 32, 64, 3, 1, 1, 1, false, true, 0, 0, Activation::Relu},
      {1, 160, 160, 64, 64, 3, 1, 1, 1, true, true, 0, 0, Activation::Relu},   // basic blocks with their residual
      {1, 160, 160, 64, 128, 3, 2, 1, 1, false, true, 0, 0, Activation::Relu}, // stride-2 downsampling
      {1, 20, 20, 512, 512, 3, 1, 1, 1, true, true, 0, 0, Activation::Relu},
      {1, 40, 40, 128, 128, 3, 1, 1, 1, false, true, 0, 0, Activation::Silu},  // the encoder's RepVGG convs
  };
  if (conv_sm90_unsupported(0, dt, shape_of(full[2]), true, Activation::Relu).find("compute capability") != std::string::npos)
    GTEST_SKIP() << "not a compute capability 9.0 device";
  for (const Case& k : full) {
    const IgemmConvShape s = shape_of(k);
    const int64_t in_px = int64_t(k.n) * k.h * k.w, out_px = int64_t(k.n) * s.out_h * s.out_w;
    const float wscale = 1.f / std::sqrt(float(k.c * k.r * k.r));
    const auto dx = upload(round_all(random_values(size_t(in_px) * k.c, 51), dt), dt);
    const auto dw = upload(round_all(random_values(size_t(k.k) * k.c * k.r * k.r, 52, -wscale, wscale), dt), dt);
    const auto db = upload(round_all(random_values(size_t(k.k), 53, -0.5f, 0.5f), dt), dt);
    const auto dr = upload(round_all(random_values(size_t(out_px) * k.k, 54, -1.f, 1.f), dt), dt);
    const size_t bytes = size_t(out_px) * k.k * dtype_size(dt);
    for (int cfg = 0; cfg < conv_sm90_configs(); ++cfg) {
      if (!conv_sm90_unsupported(cfg, dt, s, k.residual, k.act).empty()) continue;
      const std::string what = describe(k, cfg);
      std::vector<uint8_t> first;
      int launch = 0;
      for (bool pdl : {false, true})
        for (int rep = 0; rep < 3; ++rep, ++launch) {
          const auto dy = upload(random_values(size_t(out_px) * k.k, 60 + uint32_t(launch), -1e3f, 1e3f), dt);
          conv_sm90_nhwc(cfg, dx->ptr(), dw->ptr(), db->ptr(), k.residual ? dr->ptr() : nullptr, dy->ptr(), dt, s, k.act, pdl,
                         nullptr);
          std::vector<uint8_t> got = download_bytes(dy->ptr(), bytes);
          if (first.empty()) first = std::move(got);
          else EXPECT_TRUE(got == first) << what << ": launch " << launch << (pdl ? " (PDL)" : "") << " differs from the first";
        }
    }
  }
}

}  // namespace
}  // namespace kiln::cuda::test
