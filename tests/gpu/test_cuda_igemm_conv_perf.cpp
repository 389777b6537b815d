// Timings (printed, never asserted) of kiln's implicit-GEMM conv on RT-DETR
// v2 r18vd's conv shapes at 640x640 next to cuDNN's fastest tactic for the
// same conv (bias, residual and activation fused), each as 20 launches
// captured in one CUDA graph (graph_us), so the per-launch time includes what
// a launch costs inside an engine's graph. Every tile and K split is timed,
// with PDL (what an engine at batch <= 4 launches) and without. Last column:
// kiln's GEMM conv (gemm_conv.hpp: im2col + cuBLASLt with its epilogue), the
// fastest of the algorithms cuBLASLt's heuristic offers, with its split-K.
// Then kiln's sm90 conv (conv_sm90.hpp: CUTLASS's TMA + wgmma implicit GEMM,
// launched with PDL): the fastest configuration, and each one on the line below.
//   kiln_gpu_tests --gtest_filter='CudaIgemmConvPerf.*'
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <string>
#include <utility>

#include "backends/cuda/conv_sm90.hpp"
#include "backends/cuda/cuda_check.hpp"
#include "backends/cuda/cudnn_conv.hpp"
#include "backends/cuda/device_buffer.hpp"
#include "backends/cuda/gemm_conv.hpp"
#include "backends/cuda/kernels.hpp"
#include "cuda_test_util.hpp"

namespace kiln::cuda::test {
namespace {

// The GEMM conv of d timed (graph_us, the im2col launched with PDL) with each
// algorithm cuBLASLt's heuristic offers: the fastest time and its split-K
// ("splitk 4"), or 0 and why the GEMM conv does not take d.
std::pair<double, std::string> best_gemm_conv(cublasLtHandle_t lt, const ConvDesc& d, cudaStream_t st,
                                              const std::function<void(const GemmConvOp&)>& run) {
  if (const std::string why = gemm_conv_unsupported(d); !why.empty()) return {0.0, "(" + why + ")"};
  GemmConvOp g(lt, d);
  PdlDefault scope(true);
  double best = 1e30;
  std::string split;
  for (int t = 0; t < g.tactic_count(); ++t) {
    g.select(t);
    if (g.workspace_bytes() > (size_t(256) << 20)) continue;
    const double us = graph_us(st, [&] { run(g); });
    const std::string name = g.tactic_name(t);
    const size_t at = name.find("splitk ");
    if (us < best) best = us, split = at == std::string::npos ? name : name.substr(at, name.find(" red") - at);
  }
  return {best < 1e29 ? best : 0.0, split};
}

TEST(CudaIgemmConvPerf, RtDetrR18vdShapes) {
  KILN_REQUIRE_GPU();
  cudnnHandle_t h;
  KILN_CUDNN_CHECK(cudnnCreate(&h));
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  const CublasLtHandle lt;
  const DType dt = DType::F16;
  struct Conv {
    const char* name;
    int n, hw, c, k, r, stride;
    bool residual;
    Activation act;
  };
  // r18vd at 640x640 (backbone: ReLU, basic blocks with residual; encoder: SiLU).
  const Conv convs[] = {
      {"stem.1 320 c32 k32", 1, 320, 32, 32, 3, 1, false, Activation::Relu},
      {"stem.2 320 c32 k64", 1, 320, 32, 64, 3, 1, false, Activation::Relu},
      {"stage0 160 c64 +res", 1, 160, 64, 64, 3, 1, true, Activation::Relu},
      {"stage1.0 160->80 c64 k128", 1, 160, 64, 128, 3, 2, false, Activation::Relu},
      {"stage1 80 c128 +res", 1, 80, 128, 128, 3, 1, true, Activation::Relu},
      {"stage2.0 80->40 c128 k256", 1, 80, 128, 256, 3, 2, false, Activation::Relu},
      {"stage2 40 c256 +res", 1, 40, 256, 256, 3, 1, true, Activation::Relu},
      {"stage3.0 40->20 c256 k512", 1, 40, 256, 512, 3, 2, false, Activation::Relu},
      {"stage3 20 c512 +res", 1, 20, 512, 512, 3, 1, true, Activation::Relu},
      {"fpn conv1 80 1x1 c512 k128", 1, 80, 512, 128, 1, 1, false, Activation::Silu},
      {"repvgg 80 c128", 1, 80, 128, 128, 3, 1, false, Activation::Silu},
      {"repvgg 40 c128", 1, 40, 128, 128, 3, 1, false, Activation::Silu},
      {"repvgg 20 c128", 1, 20, 128, 128, 3, 1, false, Activation::Silu},
      {"conv3 80 1x1 c128 k256", 1, 80, 128, 256, 1, 1, false, Activation::Silu},
      {"downsample 80->40 c256", 1, 80, 256, 256, 3, 2, false, Activation::Silu},
      {"b8 stage0 160 c64 +res", 8, 160, 64, 64, 3, 1, true, Activation::Relu},
      {"b8 stage3 20 c512 +res", 8, 20, 512, 512, 3, 1, true, Activation::Relu},
  };
  std::printf("%-28s %9s | PDL on: %9s %-22s %9s %-26s | PDL off: %9s | %9s %s | sm90 %9s %s\n", "conv (batch 1 unless b8)",
              "cudnn us", "im2col us", "(tile)", "halo us", "(tile)", "best us", "gemm us", "(split-K)", "us", "(tile)");
  for (const Conv& cv : convs) {
    IgemmConvShape s{};
    s.n = cv.n, s.h = s.w = cv.hw, s.c = cv.c, s.k = cv.k, s.r = s.s = cv.r;
    const int pad = cv.r / 2;
    s.out_h = s.out_w = (cv.hw + 2 * pad - cv.r) / cv.stride + 1;
    s.stride_h = s.stride_w = cv.stride, s.pad_t = s.pad_l = pad, s.dil_h = s.dil_w = 1;
    const size_t in_px = size_t(cv.n) * cv.hw * cv.hw, out_px = size_t(cv.n) * s.out_h * s.out_w;
    const auto x = upload(random_values(in_px * cv.c, 1), dt);
    const auto w = upload(random_values(size_t(cv.k) * cv.r * cv.r * cv.c, 2, -0.05f, 0.05f), dt);
    const auto b = upload(random_values(size_t(cv.k), 3), dt);
    const auto r = upload(random_values(out_px * cv.k, 4), dt);
    const auto y = alloc(out_px * cv.k, dt);
    const void* res = cv.residual ? r->ptr() : nullptr;
    double best[2] = {1e30, 1e30}, off = 1e30;  // PDL on: im2col, halo; PDL off: either
    IgemmTile best_tile[2];
    for (int pdl = 1; pdl >= 0; --pdl) {
      PdlDefault scope(pdl == 1);
      for (const IgemmTile& t : igemm_conv_tiles(s)) {
        if (!igemm_conv_unsupported(dt, s, t).empty()) continue;
        const double us = graph_us(st, [&] { igemm_conv_nhwc(x->ptr(), w->ptr(), b->ptr(), res, y->ptr(), dt, s, cv.act, t, st); });
        const int form = t.th > 0 ? 1 : 0;
        if (pdl == 0) off = std::min(off, us);
        else if (us < best[form]) best[form] = us, best_tile[form] = t;
      }
    }
    ConvDesc d;
    d.dtype = dt, d.n = cv.n, d.c = cv.c, d.k = cv.k, d.h = d.w = cv.hw, d.r = d.s = cv.r;
    d.stride_h = d.stride_w = cv.stride, d.pad_t = d.pad_l = d.pad_b = d.pad_r = pad;
    d.has_bias = true, d.has_residual = cv.residual, d.act = cv.act;
    ConvOp op(h, d);
    const DevBuf ws(size_t(256) << 20);
    op.autotune(h, x->ptr(), w->ptr(), b->ptr(), res, y->ptr(), ws.ptr(), size_t(256) << 20, st, 1 << 20);
    const double cudnn_us = graph_us(st, [&] { op.run(h, x->ptr(), w->ptr(), b->ptr(), res, y->ptr(), ws.ptr(), st); });
    const auto [gemm_us, gemm_split] = best_gemm_conv(lt.h, d, st, [&](const GemmConvOp& g) {
      g.run(x->ptr(), w->ptr(), b->ptr(), res, y->ptr(), ws.ptr(), size_t(256) << 20, st);
    });
    double sm90_best = 1e30;
    std::string sm90_tile = "-", sm90_each;
    {
      PdlDefault scope(true);
      for (int cfg = 0; cfg < conv_sm90_configs(); ++cfg) {
        if (!conv_sm90_unsupported(cfg, dt, s, cv.residual, cv.act).empty()) continue;
        const double us = graph_us(st, [&] { conv_sm90_nhwc(cfg, x->ptr(), w->ptr(), b->ptr(), res, y->ptr(), dt, s, cv.act, true, st); });
        const std::string name = std::string(conv_sm90_config_name(cfg)).substr(15);  // past "kiln sm90 conv "
        sm90_each += cat(" ", name, " ", us);
        if (us < sm90_best) sm90_best = us, sm90_tile = name;
      }
    }
    std::printf("%-28s %9.2f | PDL on: %9.2f %-22s %9.2f %-26s | PDL off: %9.2f | %9.2f %s | sm90 %9.2f %s\n", cv.name, cudnn_us,
                best[0], igemm_tile_name(best_tile[0]).c_str(), best[1] < 1e29 ? best[1] : 0.0,
                best[1] < 1e29 ? igemm_tile_name(best_tile[1]).c_str() : "-", off, gemm_us, gemm_split.c_str(),
                sm90_best < 1e29 ? sm90_best : 0.0, sm90_tile.c_str());
    std::printf("%-28s sm90 each:%s\n", "", sm90_each.c_str());
  }
  cudaStreamDestroy(st);
  cudnnDestroy(h);
}

}  // namespace
}  // namespace kiln::cuda::test
