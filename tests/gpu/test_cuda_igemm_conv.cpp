// kiln's implicit-GEMM conv (igemm_conv.cu) against the CPU reference conv,
// with every tile and every K split: RT-DETR v2 r18vd's conv shapes at small
// sizes (the stem's stride-2 and 32-channel convs, basic blocks with their
// residual, the 1x1 projections), channel counts that leave part of a
// 32-channel K stage empty, batches, odd sizes, dilation, asymmetric output
// windows, pixel strides on x and y. Also: a K split gives the same result
// as the unsplit tile within rounding, nothing outside the output window is
// written, and unsupported shapes or tiles are refused with a reason. The
// halo forms (patches whose input window is loaded once for every tap; the
// persistent one walking patches with its filter share held) run every case
// too.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "backends/cuda/kernels.hpp"
#include "core/error.hpp"
#include "conv_reference.hpp"
#include "cuda_test_util.hpp"

namespace kiln::cuda::test {
namespace {

struct Case {
  int n, h, w, c, k, r, stride, pad, dil;
  bool residual;
  int xw, yw;  // pixel strides of x and y (0: dense)
  Activation act;
};

std::string describe(const Case& k, DType dt, const IgemmTile& t) {
  return cat(dtype_name(dt), " n", k.n, " ", k.h, "x", k.w, " c", k.c, " -> k", k.k, " ", k.r, "x", k.r, " s", k.stride,
             " p", k.pad, " d", k.dil, k.residual ? " +res" : "", k.xw ? cat(" x_stride ", k.xw) : "",
             k.yw ? cat(" y_stride ", k.yw) : "", " ", activation_name(k.act), " | ", igemm_tile_name(t));
}

IgemmConvShape shape_of(const Case& k) {
  IgemmConvShape s = square_conv_shape<IgemmConvShape>({k.n, k.h, k.w, k.c, k.k, k.r, k.stride, k.pad, k.dil, k.act});
  s.x_stride = k.xw, s.y_stride = k.yw;
  return s;
}

const Case kCases[] = {
    // RT-DETR v2 r18vd's conv kinds, smaller maps: stem (stride 2, then 32 -> 32 / 64), basic blocks with residual.
    {1, 34, 34, 8, 32, 3, 2, 1, 1, false, 0, 0, Activation::Relu},
    {1, 17, 17, 32, 32, 3, 1, 1, 1, false, 0, 0, Activation::Relu},
    {1, 17, 17, 32, 64, 3, 1, 1, 1, false, 0, 0, Activation::Relu},
    {1, 20, 20, 64, 64, 3, 1, 1, 1, true, 0, 0, Activation::Relu},
    {1, 10, 10, 128, 128, 3, 1, 1, 1, true, 0, 0, Activation::Relu},
    {1, 9, 9, 256, 512, 3, 2, 1, 1, false, 0, 0, Activation::Relu},
    {1, 5, 5, 512, 512, 3, 1, 1, 1, true, 0, 0, Activation::Relu},
    // The encoder's 1x1 and 3x3 convs (SiLU), a 1x1 projection without activation.
    {1, 10, 10, 256, 128, 1, 1, 0, 1, false, 0, 0, Activation::Silu},
    {1, 10, 10, 128, 128, 3, 1, 1, 1, false, 0, 0, Activation::Silu},
    {1, 6, 6, 256, 256, 1, 1, 0, 1, false, 0, 0, Activation::None},
    // Partial K stages (c % 32 != 0), k not a multiple of the tile, batches, odd sizes, dilation, GELU.
    {2, 7, 9, 24, 40, 3, 1, 1, 1, true, 0, 0, Activation::Gelu},
    {3, 5, 11, 8, 24, 1, 1, 0, 1, false, 0, 0, Activation::Relu6},
    {2, 9, 7, 16, 8, 5, 1, 2, 1, false, 0, 0, Activation::Sigmoid},
    {1, 13, 10, 48, 136, 3, 2, 2, 2, true, 0, 0, Activation::Relu},
    // Channel windows: x and y inside wider buffers.
    {1, 12, 12, 32, 64, 3, 1, 1, 1, false, 96, 128, Activation::Relu},
};

const IgemmTile kAllTiles[] = {{64, 32, 1},           {64, 32, 2},           {64, 64, 1},          {64, 64, 2},
                               {64, 64, 4},           {128, 64, 1},          {128, 64, 4},         {64, 128, 1},
                               {64, 128, 2},          {128, 32, 1, 8},       {128, 64, 1, 8},      {64, 32, 1, 8},
                               {64, 64, 1, 8},        {128, 32, 1, 8, true}, {128, 64, 1, 8, true}, {64, 32, 1, 8, true},
                               {64, 64, 1, 8, true}};

TEST(CudaIgemmConv, EveryTileMatchesCpuReference) {
  KILN_REQUIRE_GPU();
  for (DType dt : {DType::F16, DType::BF16})
    for (const Case& k : kCases) {
      const IgemmConvShape s = shape_of(k);
      const int xw = k.xw ? k.xw : k.c, yw = k.yw ? k.yw : k.k;
      const int64_t in_px = int64_t(k.n) * k.h * k.w, out_px = int64_t(k.n) * s.out_h * s.out_w;
      const auto xwide = round_all(random_values(size_t(in_px) * xw, 31), dt);
      const float wscale = 1.f / std::sqrt(float(k.c * k.r * k.r));
      const auto wk = round_all(random_values(size_t(k.k) * k.c * k.r * k.r, 32, -wscale, wscale), dt);  // KRSC
      const auto bias = round_all(random_values(size_t(k.k), 33, -0.5f, 0.5f), dt);
      const auto resid = round_all(random_values(size_t(out_px) * k.k, 34, -1.f, 1.f), dt);
      const auto y0 = round_all(random_values(size_t(out_px) * yw, 35), dt);

      // Reference: the CPU conv.
      std::vector<float> xd(size_t(in_px) * k.c);
      for (int64_t p = 0; p < in_px; ++p)
        for (int ch = 0; ch < k.c; ++ch) xd[size_t(p) * k.c + ch] = xwide[size_t(p) * xw + ch];
      const std::vector<float> ref = reference_conv_nhwc({k.n, k.h, k.w, k.c, k.k, k.r, k.stride, k.pad, k.dil, k.act},
                                                               dt, xd, {}, wk, bias, k.residual ? resid : std::vector<float>{});
      float ref_max = 0.f;
      for (float v : ref) ref_max = std::max(ref_max, std::fabs(v));

      const auto dx = upload(xwide, dt), dw = upload(wk, dt), db = upload(bias, dt), dr = upload(resid, dt);
      int ran = 0;
      std::vector<float> unsplit;
      for (const IgemmTile& t : kAllTiles) {
        const std::string what = describe(k, dt, t);
        if (!igemm_conv_unsupported(dt, s, t).empty()) {
          // Only a split deeper than K may be refused for these shapes, and a persistent halo
          // tile whose whole filter share does not fit in shared memory.
          const int iters = k.r * k.r * ((k.c + 31) / 32);
          const std::string why = igemm_conv_unsupported(dt, s, t);
          EXPECT_TRUE(t.th == 0 ? t.splits > iters : t.persist && why.find("bytes of shared memory") != std::string::npos)
              << what << ": " << why;
          continue;
        }
        const auto dy = upload(y0, dt);
        igemm_conv_nhwc(dx->ptr(), dw->ptr(), db->ptr(), k.residual ? dr->ptr() : nullptr, dy->ptr(), dt, s, k.act, t,
                        nullptr);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << what;
        const auto got = download(dy->ptr(), y0.size(), dt);
        // f16: max|d| <= 5e-3 * max|ref| (f32 accumulation, one rounding of the output); bf16: 3e-2.
        const double tol = (dt == DType::F16 ? 5e-3 : 3e-2) * std::max(1.f, ref_max);
        const auto [worst, touched] = check_output_window(got, ref, y0, out_px, k.k, yw);
        EXPECT_LE(worst, tol) << what;
        EXPECT_EQ(touched, 0u) << what << ": wrote outside its output window";
        ++ran;
      }
      EXPECT_GE(ran, 8) << describe(k, dt, {});
    }
}

TEST(CudaIgemmConv, RefusesWhatItCannotRun) {
  Case k{1, 8, 8, 32, 32, 3, 1, 1, 1, false, 0, 0, Activation::Relu};
  const IgemmConvShape ok = shape_of(k);
  EXPECT_EQ(igemm_conv_unsupported(DType::F16, ok, {64, 64, 1}), "");
  EXPECT_NE(igemm_conv_unsupported(DType::F32, ok, {64, 64, 1}).find("dtype f32"), std::string::npos);
  IgemmConvShape s = ok;
  s.c = 12;
  EXPECT_NE(igemm_conv_unsupported(DType::F16, s, {64, 64, 1}).find("channels 12 -> 32"), std::string::npos);
  s = ok, s.x_stride = 36;
  EXPECT_NE(igemm_conv_unsupported(DType::F16, s, {64, 64, 1}).find("pixel strides"), std::string::npos);
  EXPECT_NE(igemm_conv_unsupported(DType::F16, ok, {32, 32, 1}).find("tile 32x32"), std::string::npos);
  EXPECT_NE(igemm_conv_unsupported(DType::F16, ok, {64, 64, 3}).find("K split in 3"), std::string::npos);
  s = ok, s.r = s.s = 1;  // one K stage: no split
  EXPECT_NE(igemm_conv_unsupported(DType::F16, s, {64, 64, 2}).find("with 1 K stages"), std::string::npos);
  s = ok, s.out_h = 0;
  EXPECT_NE(igemm_conv_unsupported(DType::F16, s, {64, 64, 1}).find("empty"), std::string::npos);
  EXPECT_EQ(igemm_tile_name({128, 64, 4}), "kiln igemm 128x64 s4");
  EXPECT_EQ(igemm_tile_name({128, 64, 1, 8}), "kiln igemm halo 8x16 n64");
  EXPECT_EQ(igemm_tile_name({64, 32, 1, 8, true}), "kiln igemm halo persistent 8x8 n32");
  EXPECT_NE(igemm_conv_unsupported(DType::F16, ok, {128, 64, 2, 8}).find("halo tile kiln igemm halo 8x16 n64"),
            std::string::npos);
  EXPECT_NE(igemm_conv_unsupported(DType::F16, ok, {128, 128, 1, 8}).find("halo tile"), std::string::npos);
  s = ok, s.r = s.s = 7, s.c = 256;  // a 7x7 filter of 256 channels for 64 outputs: 201 KiB per stage
  EXPECT_NE(igemm_conv_unsupported(DType::F16, s, {64, 64, 1, 8}).find("bytes of shared memory"), std::string::npos);
  KILN_REQUIRE_GPU();
  // The launcher refuses too, before anything runs.
  EXPECT_THROW(igemm_conv_nhwc(nullptr, nullptr, nullptr, nullptr, nullptr, DType::F32, ok, Activation::None,
                               {64, 64, 1}, nullptr),
               Error);
}

TEST(CudaIgemmConv, TilesToTimeAreRunnable) {
  KILN_REQUIRE_GPU();
  // r18vd's convs at 640x640, batch 1: every tile offered is one the kernel takes.
  const Case shapes[] = {{1, 160, 160, 64, 64, 3, 1, 1, 1, true, 0, 0, Activation::Relu},
                         {1, 20, 20, 512, 512, 3, 1, 1, 1, true, 0, 0, Activation::Relu},
                         {1, 320, 320, 32, 64, 3, 1, 1, 1, false, 0, 0, Activation::Relu},
                         {1, 40, 40, 256, 128, 1, 1, 0, 1, false, 0, 0, Activation::Silu}};
  for (const Case& k : shapes) {
    const IgemmConvShape s = shape_of(k);
    const std::vector<IgemmTile> tiles = igemm_conv_tiles(s);
    EXPECT_FALSE(tiles.empty());
    for (const IgemmTile& t : tiles) EXPECT_EQ(igemm_conv_unsupported(DType::F16, s, t), "") << igemm_tile_name(t);
  }
  // 20x20x512 makes 56 tiles of 64x64: splits are offered; the 320x320x32 stem conv gets the halo form.
  const std::vector<IgemmTile> deep = igemm_conv_tiles(shape_of(shapes[1]));
  EXPECT_TRUE(std::any_of(deep.begin(), deep.end(), [](const IgemmTile& t) { return t.splits == 4; }));
  const std::vector<IgemmTile> stem = igemm_conv_tiles(shape_of(shapes[2]));
  EXPECT_TRUE(std::any_of(stem.begin(), stem.end(), [](const IgemmTile& t) { return t.th > 0; }));
}

}  // namespace
}  // namespace kiln::cuda::test
