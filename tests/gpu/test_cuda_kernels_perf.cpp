// CUDA-graph capture of the kernels and their timings at realistic sizes.
// Timings are printed, not asserted (they depend on the GPU); the bandwidth
// is bytes read + written per launch over the mean of 100 launches.
#include <gtest/gtest.h>

#include <cstdio>
#include <functional>

#include "backends/cuda/kernels.hpp"
#include "backends/cuda/cublaslt_linear.hpp"
#include "cuda_test_util.hpp"

namespace kiln::cuda::test {
namespace {

// A small network tail enqueued on one stream: input transpose, BN+SiLU,
// max pool, global pool, Linear (bias, ReLU6 as a post kernel). Captured into
// a graph it must reproduce the eager result bit for bit.
TEST(CudaKernels, CapturedGraphMatchesEager) {
  KILN_REQUIRE_GPU();
  const DType dt = DType::F16;
  const int n = 2, c = 16, h = 17, w = 13, oh = 9, ow = 7, classes = 10;
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  cublasLtHandle_t lt = nullptr;
  ASSERT_EQ(cublasLtCreate(&lt), CUBLAS_STATUS_SUCCESS);
  LinearOp fc(lt, dt, n, c, classes, true, Activation::Relu6);
  const DevBuf ws(LinearOp::kMaxWorkspace);
  const auto x = upload(random_values(size_t(n) * c * h * w, 30), DType::F32);
  const auto scale = upload(random_values(size_t(c), 31, 0.5f, 2.f), DType::F32);
  const auto shift = upload(random_values(size_t(c), 32), DType::F32);
  const auto fw = upload(random_values(size_t(classes) * c, 33, -0.5f, 0.5f), dt);
  const auto fb = upload(random_values(size_t(classes), 34), dt);
  const auto a = alloc(size_t(n) * c * h * w, dt), p = alloc(size_t(n) * c * oh * ow, dt);
  const auto g = alloc(size_t(n) * c, dt), y = alloc(size_t(n) * classes, dt);
  const PoolShape ps{n, h, w, c, oh, ow, 3, 3, 2, 2, 1, 1, true, 1, 1};
  const auto enqueue = [&] {
    nchw_f32_to_nhwc(x->as<float>(), a->ptr(), dt, n, c, h, w, st);
    batch_norm_nhwc(a->ptr(), a->ptr(), dt, int64_t(n) * h * w, c, scale->as<float>(), shift->as<float>(),
                    Activation::Silu, st);
    max_pool_nhwc(a->ptr(), p->ptr(), dt, ps, st);
    global_avg_pool_nhwc(p->ptr(), g->ptr(), dt, n, oh * ow, c, st);
    fc.run(g->ptr(), fw->ptr(), fb->ptr(), y->ptr(), ws.ptr(), LinearOp::kMaxWorkspace, st);
  };
  enqueue();
  const auto eager = download(y->ptr(), size_t(n) * classes, dt);
  CK(cudaMemsetAsync(y->ptr(), 0xff, size_t(n) * classes * 2, st));
  cudaGraph_t graph;
  CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
  enqueue();
  CK(cudaStreamEndCapture(st, &graph));
  cudaGraphExec_t exec;
  CK(cudaGraphInstantiate(&exec, graph, 0));
  CK(cudaGraphLaunch(exec, st));
  CK(cudaGraphLaunch(exec, st));
  expect_close(download(y->ptr(), size_t(n) * classes, dt), eager, 0.0, "graph replay");
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cublasLtDestroy(lt);
  cudaStreamDestroy(st);
}

void report(const char* name, double us, double bytes) {
  const double gbs = bytes / (us * 1e-6) / 1e9;
  std::printf("  %-52s %9.2f us  %8.1f GB/s  %5.1f%% of 4.8 TB/s\n", name, us, gbs, 100.0 * gbs / 4800.0);
}

TEST(CudaKernelsPerf, Timings) {
  KILN_REQUIRE_GPU();
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  const size_t big = size_t(32) * 56 * 56 * 256;  // 25.7M elements: 51 MB in f16, well past the 60 MB L2 x3
  DevBuf a(big * 4), b(big * 4), y(big * 4);
  CK(cudaMemset(a.ptr(), 0, big * 4));
  CK(cudaMemset(b.ptr(), 0, big * 4));
  DevBuf sc(4096 * 4), sh(4096 * 4);
  CK(cudaMemset(sc.ptr(), 0, 4096 * 4));
  CK(cudaMemset(sh.ptr(), 0, 4096 * 4));
  const DType h = DType::F16;
  std::printf("kernel timings (mean of 100 launches; small cases are L2-resident after warm-up)\n");

  const PoolShape mp1{1, 112, 112, 64, 56, 56, 3, 3, 2, 2, 1, 1, true, 1, 1};
  report("max_pool 3x3/2 1x112x112x64 f16",
         mean_launch_us(st, [&] { max_pool_nhwc(a.ptr(), y.ptr(), h, mp1, st); }), (112.0 * 112 + 56 * 56) * 64 * 2);
  const PoolShape mp32{32, 112, 112, 64, 56, 56, 3, 3, 2, 2, 1, 1, true, 1, 1};
  report("max_pool 3x3/2 32x112x112x64 f16",
         mean_launch_us(st, [&] { max_pool_nhwc(a.ptr(), y.ptr(), h, mp32, st); }), 32.0 * (112 * 112 + 56 * 56) * 64 * 2);
  report("avg_pool 3x3/2 32x112x112x64 f16",
         mean_launch_us(st, [&] { avg_pool_nhwc(a.ptr(), y.ptr(), h, mp32, st); }), 32.0 * (112 * 112 + 56 * 56) * 64 * 2);
  report("global_avg_pool 32x7x7x2048 f16",
         mean_launch_us(st, [&] { global_avg_pool_nhwc(a.ptr(), y.ptr(), h, 32, 49, 2048, st); }),
         32.0 * 2048 * 50 * 2);
  report("global_avg_pool 32x56x56x256 f16",
         mean_launch_us(st, [&] { global_avg_pool_nhwc(a.ptr(), y.ptr(), h, 32, 3136, 256, st); }), double(big) * 2);
  report("global_avg_pool 1x112x112x32 f16 (SE at batch 1)",
         mean_launch_us(st, [&] { global_avg_pool_nhwc(a.ptr(), y.ptr(), h, 1, 12544, 32, st); }), 12544.0 * 32 * 2);
  for (DType dt : kFloatTypes) {
    const double es = double(dtype_size(dt));
    char name[96];
    std::snprintf(name, sizeof name, "add+relu 32x56x56x256 %s", dtype_name(dt));
    report(name, mean_launch_us(st, [&] { add(a.ptr(), b.ptr(), y.ptr(), dt, int64_t(big), Activation::Relu, st); }),
           3.0 * big * es);
    std::snprintf(name, sizeof name, "batch_norm+silu 32x56x56x256 %s", dtype_name(dt));
    report(name, mean_launch_us(st, [&] {
             batch_norm_nhwc(a.ptr(), y.ptr(), dt, int64_t(32) * 56 * 56, 256, sc.as<float>(), sh.as<float>(),
                             Activation::Silu, st);
           }),
           2.0 * big * es);
  }
  report("activation silu 32x56x56x256 f16",
         mean_launch_us(st, [&] { activation(a.ptr(), y.ptr(), h, int64_t(big), Activation::Silu, st); }), 4.0 * big);
  report("mul_channel 32x56x56x256 f16",
         mean_launch_us(st, [&] { mul_channel_nhwc(a.ptr(), b.ptr(), y.ptr(), h, 32, 3136, 256, st); }), 4.0 * big);
  report("cast f32->f16 25.7M", mean_launch_us(st, [&] { cast(a.ptr(), DType::F32, y.ptr(), h, int64_t(big), st); }),
         6.0 * big);
  report("nchw_f32_to_nhwc 32x3x224x224 -> f16",
         mean_launch_us(st, [&] { nchw_f32_to_nhwc(a.as<float>(), y.ptr(), h, 32, 3, 224, 224, st); }),
         32.0 * 3 * 224 * 224 * 6);
  report("nchw_f32_to_nhwc 32x256x56x56 -> f16",
         mean_launch_us(st, [&] { nchw_f32_to_nhwc(a.as<float>(), y.ptr(), h, 32, 256, 56, 56, st); }), 6.0 * big);
  report("copy_channels 128 of 256, 32x56x56 f16", mean_launch_us(st, [&] {
           copy_channels_nhwc(a.ptr(), 256, 64, y.ptr(), 128, 0, 128, int64_t(32) * 3136, h, st);
         }),
         2.0 * big);

  cublasLtHandle_t lt = nullptr;
  ASSERT_EQ(cublasLtCreate(&lt), CUBLAS_STATUS_SUCCESS);
  const DevBuf ws(LinearOp::kMaxWorkspace);
  for (DType dt : kFloatTypes) {
    LinearOp fc(lt, dt, 32, 2048, 1000, true, Activation::None);
    for (int t = 0; t < fc.tactic_count(); ++t) {
      fc.select(t);
      char name[160];
      std::snprintf(name, sizeof name, "linear %s 32x2048x1000 t%d (%s)", dtype_name(dt), t,
                    fc.tactic_name(t).c_str());
      const double us = mean_launch_us(st, [&] {
        fc.run(a.ptr(), b.ptr(), sc.ptr(), y.ptr(), ws.ptr(), LinearOp::kMaxWorkspace, st);
      });
      std::printf("  %s: %.2f us, %.1f TFLOP/s\n", name, us, 2.0 * 32 * 2048 * 1000 / (us * 1e-6) / 1e12);
    }
  }
  cublasLtDestroy(lt);
  CK(cudaStreamSynchronize(st));
  CK(cudaGetLastError());
  cudaStreamDestroy(st);
}

}  // namespace
}  // namespace kiln::cuda::test
