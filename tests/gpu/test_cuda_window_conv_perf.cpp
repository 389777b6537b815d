// Timings (printed, never asserted) of kiln's window conv on Res2Net-50's
// chunk-conv shapes next to cuDNN's fastest tactic for the same conv (dense,
// bias + ReLU fused), each as 20 launches captured in one CUDA graph, so the
// per-launch time includes what a launch costs inside an engine's graph.
// Every launch shape (tile width, split-K warps) is timed, which is how the
// defaults in window_conv.cu's plan_launch were chosen.
//   kiln_gpu_tests --gtest_filter='CudaWindowConvPerf.*'
#include <gtest/gtest.h>

#include <cstdio>

#include "backends/cuda/cudnn_conv.hpp"
#include "backends/cuda/cuda_check.hpp"
#include "backends/cuda/kernels.hpp"
#include "cuda_test_util.hpp"

namespace kiln::cuda::test {
namespace {

TEST(CudaWindowConvPerf, Res2NetChunkShapes) {
  KILN_REQUIRE_GPU();
  cudnnHandle_t h;
  KILN_CUDNN_CHECK(cudnnCreate(&h));
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  const DType dt = DType::F16;
  struct Shape {
    const char* name;
    int n, hw, c, stride, groups;
    bool add;
  };
  // res2net50_26w_4s after pad_channels: chunk widths 32, 56, 104, 208.
  const Shape shapes[] = {
      {"layer1 chained 56x56 c32 +add", 1, 56, 32, 1, 1, true},  {"layer2 chained 28x28 c56 +add", 1, 28, 56, 1, 1, true},
      {"layer3 chained 14x14 c104 +add", 1, 14, 104, 1, 1, true}, {"layer4 chained 7x7 c208 +add", 1, 7, 208, 1, 1, true},
      {"layer1.0 56x56 c32 x3", 1, 56, 32, 1, 3, false},          {"layer2.0 56->28 c56 x3", 1, 56, 56, 2, 3, false},
      {"layer3.0 28->14 c104 x3", 1, 28, 104, 2, 3, false},       {"layer4.0 14->7 c208 x3", 1, 14, 208, 2, 3, false},
      {"layer1 chained b2", 2, 56, 32, 1, 1, true},                {"layer4 chained b2", 2, 7, 208, 1, 1, true},
      {"layer1 chained b4", 4, 56, 32, 1, 1, true},                {"layer4 chained b4", 4, 7, 208, 1, 1, true},
  };
  std::printf("%-32s %9s %9s %14s %9s\n", "shape (batch 1 unless bN)", "cudnn us", "kiln us", "(default nt/w)", "best us");
  for (const Shape& sh : shapes) {
    const int wide = sh.c * 4, out_hw = (sh.hw + 2 - 3) / sh.stride + 1;
    const size_t in_px = size_t(sh.n) * sh.hw * sh.hw, out_px = size_t(sh.n) * out_hw * out_hw;
    const auto x = upload(random_values(in_px * wide, 1), dt), xa = upload(random_values(in_px * wide, 2), dt);
    const auto w = upload(random_values(size_t(sh.groups) * sh.c * 9 * sh.c, 3, -0.05f, 0.05f), dt);
    const auto b = upload(random_values(size_t(sh.groups) * sh.c, 4), dt);
    const auto y = alloc(out_px * wide, dt);
    WindowConvShape s{};
    s.n = sh.n, s.h = s.w = sh.hw, s.c = s.k = sh.c, s.r = s.s = 3, s.out_h = s.out_w = out_hw;
    s.stride_h = s.stride_w = sh.stride, s.pad_t = s.pad_l = 1, s.dil_h = s.dil_w = 1;
    s.x_stride = s.x_add_stride = s.y_stride = wide;
    s.groups = sh.groups, s.x_group_step = s.y_group_step = sh.c;
    const void* add = sh.add ? xa->ptr() : nullptr;
    const WindowLaunch def = window_conv_launch(s);
    const double kiln_us =
        graph_us(st, [&] { window_conv_nhwc(x->ptr(), add, w->ptr(), b->ptr(), y->ptr(), dt, s, Activation::Relu, st); });
    double best = 1e30;
    int best_nt = 0, best_w = 0;
    for (int nt : {1, 2, 4})
      for (int warps : {1, 2, 4, 8, 16}) {
        const double us = graph_us(st, [&] {
          window_conv_nhwc(x->ptr(), add, w->ptr(), b->ptr(), y->ptr(), dt, s, Activation::Relu, st, {}, {nt, warps});
        });
        if (us < best) best = us, best_nt = nt, best_w = warps;
      }
    // cuDNN: the same conv on dense tensors (one conv of the group), fastest tactic.
    ConvDesc d;
    d.dtype = dt, d.n = sh.n, d.c = d.k = sh.c, d.h = d.w = sh.hw, d.r = d.s = 3;
    d.stride_h = d.stride_w = sh.stride, d.pad_t = d.pad_l = d.pad_b = d.pad_r = 1;
    d.has_bias = true, d.act = Activation::Relu;
    ConvOp op(h, d);
    const DevBuf ws(size_t(256) << 20);
    op.autotune(h, x->ptr(), w->ptr(), b->ptr(), nullptr, y->ptr(), ws.ptr(), size_t(256) << 20, st, 1 << 20);
    const double cudnn_us =
        sh.groups * graph_us(st, [&] { op.run(h, x->ptr(), w->ptr(), b->ptr(), nullptr, y->ptr(), ws.ptr(), st); });
    std::printf("%-32s %9.2f %9.2f %8d/%-5d %9.2f (nt %d, %d warps)%s\n", sh.name, cudnn_us, kiln_us, def.nt, def.warps, best,
                best_nt, best_w, sh.groups > 1 ? "  [cudnn: x groups]" : "");
  }
  cudaStreamDestroy(st);
  cudnnDestroy(h);
}

}  // namespace
}  // namespace kiln::cuda::test
