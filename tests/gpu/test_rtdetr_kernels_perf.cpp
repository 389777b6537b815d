// Probes, not tests of behaviour (the op harness' group_mlp_chain* and
// top_k* cases check the numbers): kiln's own RT-DETR kernels at r18vd's
// batch-1 shapes. Each prints the mean time per launch (plain launches in a
// stream with PDL, 100 after 5 warm-ups); nothing is asserted on time. Run on
// the GPU machine:
//   kiln_gpu_tests --gtest_filter='CudaRtDetrKernelsPerf.*'
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "backends/cuda/cublaslt_linear.hpp"
#include "backends/cuda/kernels.hpp"
#include "core/error.hpp"
#include "cuda_test_util.hpp"

namespace kiln::cuda::test {
namespace {

struct ChainShape {
  const char* name;
  int rows;
  std::vector<int> widths;  // input width, then each layer's output width
  std::vector<Activation> acts;
  bool norm = false;    // the last layer through residual add + layer norm
  int refine = -1;      // layer whose rows are the box refinement (then the sum on the last layer)
};

int pad32(int v) { return (v + 31) / 32 * 32; }
int pad8(int v) { return (v + 7) / 8 * 8; }

// mlp_chain on the batch-1 chains (300 query rows, 400 AIFI rows) with each
// cluster size it takes, against the unfused cuBLASLt GEMMs and layer norm.
TEST(CudaRtDetrKernelsPerf, MlpChains) {
  KILN_REQUIRE_GPU();
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  cublasLtHandle_t lt = nullptr;
  ASSERT_EQ(cublasLtCreate(&lt), CUBLAS_STATUS_SUCCESS);
  const DType dt = DType::F16;
  const Activation R = Activation::Relu, N = Activation::None;
  const std::vector<ChainShape> shapes = {
      {"box head 300x256-256-256-4", 300, {256, 256, 256, 4}, {R, R, N}},
      {"box head + refine + query pos 300 (linked)", 300, {256, 256, 256, 4, 512, 256}, {R, R, N, R, N}, false, 2},
      {"out_proj + norm 300x256", 300, {256, 256}, {N}, true},
      {"FFN + norm 300x256-1024-256", 300, {256, 1024, 256}, {R, N}, true},
      {"AIFI FFN + norm 400x256-1024-256", 400, {256, 1024, 256}, {Activation::Gelu, N}, true},
  };
  const DevBuf ws(LinearOp::kMaxWorkspace);
  std::printf("mlp_chain per launch (us; plain launches with PDL, mean of 100), f16\n");
  for (const ChainShape& s : shapes) {
    const int layers_n = static_cast<int>(s.acts.size());
    std::vector<std::unique_ptr<DevBuf>> bufs;
    auto zeros = [&](size_t bytes) -> void* {
      bufs.push_back(std::make_unique<DevBuf>(bytes));
      EXPECT_EQ(cudaMemset(bufs.back()->ptr(), 0, bytes), cudaSuccess);
      return bufs.back()->ptr();
    };
    std::vector<MlpChainLayer> layers(static_cast<size_t>(layers_n));
    size_t widest = 0;
    for (int l = 0; l < layers_n; ++l) {
      MlpChainLayer& L = layers[static_cast<size_t>(l)];
      L.k_pad = pad32(s.widths[static_cast<size_t>(l)]);
      L.n = s.widths[static_cast<size_t>(l) + 1];
      L.n_pad = l + 1 < layers_n ? pad32(L.n) : pad8(L.n);
      L.act = s.acts[static_cast<size_t>(l)];
      L.w = zeros(size_t(L.k_pad) * L.n_pad * 2);
      L.b = static_cast<const float*>(zeros(size_t(L.n_pad) * 4));
      widest = std::max({widest, size_t(L.k_pad), size_t(L.n_pad)});
    }
    const size_t rows = size_t(s.rows), n_last = size_t(s.widths.back());
    void* x = zeros(rows * widest * 2);
    void* y = zeros(rows * widest * 2);
    MlpChainNorm nm;
    nm.io.x2 = zeros(rows * n_last * 2);
    nm.io.weight = zeros(n_last * 2);
    nm.io.bias = zeros(n_last * 2);
    MlpChainRefine rf;
    MlpChainSum sum;
    if (s.refine >= 0) {
      rf.layer = s.refine;
      rf.ref = static_cast<const float*>(zeros(rows * 4 * 4));
      rf.eps = 1e-5f;
      rf.act = Activation::Sigmoid;
      rf.y = static_cast<float*>(zeros(rows * 4 * 4));
      rf.y_narrow = zeros(rows * 4 * 2);
      sum.add_to = zeros(rows * n_last * 2);
      sum.y = zeros(rows * n_last * 2);
    }
    auto chain = [&](int cluster) {
      return mean_launch_us(st, [&] {
        mlp_chain(x, y, dt, s.rows, s.widths[0], layers.data(), layers_n, cluster, st, s.norm ? &nm : nullptr,
                  s.refine >= 0 ? &sum : nullptr, s.refine >= 0 ? &rf : nullptr);
      });
    };
    std::printf("  %s\n", s.name);
    std::printf("    cluster 4 %8.2f   cluster 2 %8.2f   cluster 1 %8.2f\n", chain(4), chain(2), chain(1));
    // The unfused form: one cuBLASLt GEMM a layer (and the norm), as the graph runs without chains.
    if (s.refine < 0) {
      std::vector<std::unique_ptr<LinearOp>> ops;
      std::vector<void*> w16, b16;
      for (int l = 0; l < layers_n; ++l) {
        const int k = s.widths[static_cast<size_t>(l)], n = s.widths[static_cast<size_t>(l) + 1];
        ops.push_back(std::make_unique<LinearOp>(lt, dt, s.rows, k, n, true, s.acts[static_cast<size_t>(l)]));
        w16.push_back(zeros(size_t(k) * n * 2));
        b16.push_back(zeros(size_t(n) * 2));
      }
      void* t0 = zeros(rows * widest * 2);
      void* t1 = zeros(rows * widest * 2);
      LayerNormIo io;
      io.x = t0;
      io.x2 = nm.io.x2;
      io.weight = nm.io.weight;
      io.bias = nm.io.bias;
      io.y = y;
      const double gemms = mean_launch_us(st, [&] {
        const void* in = x;
        for (int l = 0; l < layers_n; ++l) {
          void* out = l % 2 ? t1 : t0;
          ops[static_cast<size_t>(l)]->run(in, w16[static_cast<size_t>(l)], b16[static_cast<size_t>(l)], out, ws.ptr(),
                                           LinearOp::kMaxWorkspace, st);
          in = out;
        }
        if (s.norm) {
          io.x = in;
          layer_norm_rows(io, dt, s.rows, s.widths.back(), 1e-5f, st);
        }
      });
      std::printf("    unfused: %d cuBLASLt GEMMs%s %8.2f\n", layers_n, s.norm ? " + layer norm" : "", gemms);
    }
  }
  CK(cudaStreamSynchronize(st));
  cublasLtDestroy(lt);
  cudaStreamDestroy(st);
}

// top_k 8400 -> 300 (query selection: the best class logit of each anchor,
// f32) and the arg-max over 80 classes before it, on two score shapes: spread
// logits (a trained detector's) and near-flat ones (a seeded model's, where
// most keys share their high digits).
TEST(CudaRtDetrKernelsPerf, TopK) {
  KILN_REQUIRE_GPU();
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  const int64_t anchors = 8400;
  const int k = 300;
  DevBuf values(size_t(k) * 4), indices(size_t(k) * 8), best(size_t(anchors) * 4), best_i(size_t(anchors) * 8);
  std::printf("top_k per launch (us; plain launches with PDL, mean of 100 | a replayed graph of dependent launches)\n");
  const std::vector<std::pair<const char*, std::vector<float>>> cases = {
      {"spread logits, uniform in [-9, 1]", random_values(size_t(anchors), 71, -9.f, 1.f)},
      {"near-flat logits -2.5 +- 0.01", random_values(size_t(anchors), 72, -2.51f, -2.49f)},
  };
  for (const auto& [name, host] : cases) {
    const auto x = upload(host, DType::F32);
    for (const TopKPath path : {TopKPath::Auto, TopKPath::OneBlock}) {
      const auto launch = [&] {
        top_k_rows(x->ptr(), values.ptr(), indices.as<int64_t>(), DType::F32, 1, anchors, 1, k, true, st, path);
      };
      const double us = mean_launch_us(st, launch), graph = mean_graph_us(st, launch);
      std::printf("  8400 -> 300, %-32s %-18s %8.2f | graph %8.2f\n", name,
                  path == TopKPath::Auto ? "cluster of 8" : "one block", us, graph);
    }
  }
  const auto classes = upload(random_values(size_t(anchors) * 80, 73, -9.f, 1.f), DType::F32);
  const double top1 = mean_launch_us(st, [&] {
    top_k_rows(classes->ptr(), best.ptr(), best_i.as<int64_t>(), DType::F32, anchors, 80, 1, 1, true, st);
  });
  std::printf("  8400 x 80 -> 1 (the best class)         %8.2f\n", top1);
  CK(cudaStreamSynchronize(st));
  cudaStreamDestroy(st);
}

// attention's tensor-core kernel at r18vd's batch-1 shapes (AIFI: 400 tokens;
// the decoder's self-attention: 300 queries; 8 heads of 32), per key split,
// as plain launches and as a replayed graph of four dependent launches (how
// the engine runs it); the default split is the one mma_split picks; "4x2g"
// and "4x4g" are split 4 with 2 and 4 query groups a block (wide_attention).
TEST(CudaRtDetrKernelsPerf, AttentionSplits) {
  KILN_REQUIRE_GPU();
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  const DType dt = DType::F16;
  std::printf("attention per launch (us; plain | graph of four dependent launches / 4), f16, 8 heads of 32\n");
  for (const int l : {400, 300, 2400}) {
    AttentionShape s;
    s.n = l == 2400 ? 8 : 1;
    s.lq = s.lk = l == 2400 ? 300 : l;
    s.heads = 8, s.d = s.dv = 32, s.scale = 1.f / std::sqrt(32.f);
    // q and k as windows of one projection row [q | k] (plan_row_windows), v packed.
    s.q_ld = s.k_ld = 512;
    const size_t rows = size_t(s.n) * s.lq;
    const auto qk = upload(random_values(rows * 512, 81, -1.f, 1.f), dt), v = upload(random_values(rows * 256, 82), dt);
    const auto y = alloc(rows * 256, dt), y2 = alloc(rows * 256, dt);
    std::printf("  %d x %d tokens:", int(s.n), s.lq);
    // (split, query groups): auto, the 4-warp forms, and the wide forms (switch wide_attention).
    for (const auto& [split, groups] : std::vector<std::pair<int, int>>{{0, 0}, {1, 0}, {2, 0}, {4, 0}, {4, 2}, {4, 4}}) {
      AttentionShape a = s;
      a.split = split, a.groups = groups;
      const auto one = [&] { attention(qk->ptr(), static_cast<char*>(qk->ptr()) + 512, v->ptr(), y->ptr(), dt, a, st); };
      const auto four = [&] {
        for (int r = 0; r < 4; ++r)  // y of one launch is the next one's v
          attention(qk->ptr(), static_cast<char*>(qk->ptr()) + 512, r % 2 ? y->ptr() : y2->ptr(), r % 2 ? y2->ptr() : y->ptr(), dt, a,
                    st);
      };
      const std::string form = !split ? "auto" : groups ? cat(split, "x", groups, "g") : std::to_string(split);
      std::printf("   split %s %6.2f | %6.2f", form.c_str(), mean_launch_us(st, one), mean_graph_us(st, four) / 4);
    }
    std::printf("\n");
  }
  CK(cudaStreamSynchronize(st));
  cudaStreamDestroy(st);
}

// ms_deform_attn at r18vd's decoder shape (batch 1 and 8: 300 queries, 8
// heads of 32, 3 levels 80/40/20 with 4 points each, value a window of the
// merged 768-wide value projection), block form against the warp form
// (switch warp_deform), plain launches and a replayed graph of four.
TEST(CudaRtDetrKernelsPerf, Deform) {
  KILN_REQUIRE_GPU();
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  const DType dt = DType::F16;
  std::printf("ms_deform_attn per launch (us; plain | graph of four launches / 4), f16\n");
  for (const int64_t n : {1, 8}) {
    DeformAttnShape s;
    s.n = n, s.q = 300, s.heads = 8, s.d = 32, s.levels = 3, s.p = 12, s.value_ld = 768;
    const int64_t side[3] = {80, 40, 20};
    for (int l = 0; l < 3; ++l) {
      s.level_h[l] = s.level_w[l] = side[l];
      s.level_start[l] = l ? s.level_start[l - 1] + side[l - 1] * side[l - 1] : 0;
      s.points[l] = 4;
    }
    s.s = 8400;
    const size_t nq = size_t(n) * 300;
    const auto value = upload(random_values(size_t(n) * 8400 * 768, 91, -1.f, 1.f), dt);
    const auto ref = upload(random_values(nq * 4, 92, 0.05f, 0.95f), dt);
    const auto off = upload(random_values(nq * 8 * 12 * 2, 93, -2.f, 2.f), dt);
    const auto logits = upload(random_values(nq * 8 * 12, 94, -3.f, 3.f), dt);
    const auto y = alloc(nq * 256, dt);
    std::printf("  batch %d:", int(n));
    for (const DeformPath path : {DeformPath::Block, DeformPath::Warp}) {
      const auto one = [&] { ms_deform_attn(value->ptr(), ref->ptr(), off->ptr(), logits->ptr(), y->ptr(), dt, s, st, path); };
      const auto four = [&] {
        for (int r = 0; r < 4; ++r) one();
      };
      std::printf("   %s %6.2f | %6.2f", path == DeformPath::Warp ? "warp" : "block", mean_launch_us(st, one),
                  mean_graph_us(st, four) / 4);
    }
    std::printf("\n");
  }
  CK(cudaStreamSynchronize(st));
  cudaStreamDestroy(st);
}

}  // namespace
}  // namespace kiln::cuda::test
