// kiln's small linear (small_gemm.cu) against a host reference: the same
// 16-bit operands widened, sums in double, bias and ReLU, then rounded to the
// storage type; and refusals of what it does not take. The probe times it
// against cuBLASLt's LinearOp on RT-DETR's batch-1 linears (printed only).
// small_gemm_norm (a post-norm's projection, residual add and layer norm in
// one launch) against the unfused kernels it replaces, bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "backends/cuda/cublaslt_linear.hpp"
#include "backends/cuda/kernels.hpp"
#include "core/error.hpp"
#include "core/half.hpp"
#include "cuda_test_util.hpp"

namespace kiln::cuda::test {
namespace {

struct GemmCase {
  int m, n, k;
  Activation act;
  bool bias;
};

// A probe's stream, cuBLASLt handle and workspace, released at scope end.
struct LtProbe {
  cudaStream_t st = nullptr;
  cublasLtHandle_t lt = nullptr;
  DevBuf ws{LinearOp::kMaxWorkspace};
  LtProbe() {
    if (cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking) != cudaSuccess) st = nullptr;
    if (cublasLtCreate(&lt) != CUBLAS_STATUS_SUCCESS) lt = nullptr;
  }
  ~LtProbe() {
    if (lt) cublasLtDestroy(lt);
    if (st) cudaStreamDestroy(st);
  }
  LtProbe(const LtProbe&) = delete;
  LtProbe& operator=(const LtProbe&) = delete;
  bool ok() const { return st && lt; }
};

// The values a 16-bit upload holds, as f32.
std::vector<float> rounded(const std::vector<float>& v, DType dt) {
  const auto d = upload(v, dt);
  return download(d->ptr(), v.size(), dt);
}

TEST(CudaSmallGemm, MatchesTheHostReference) {
  KILN_REQUIRE_GPU();
  const std::vector<GemmCase> cases = {
      {300, 256, 256, Activation::None, true},   // RT-DETR decoder out_proj
      {300, 512, 256, Activation::None, true},   // merged q/k projection
      {400, 1024, 256, Activation::Relu, true},  // an FFN's first layer (ReLU)
      {300, 256, 512, Activation::Relu, false},  // k at the limit, no bias
      {1, 8, 16, Activation::None, true},        // the smallest
      {77, 40, 48, Activation::Relu, true},      // tails in m and n, k not a multiple of 32
      {2400, 256, 256, Activation::None, true},  // batch 8's rows
      {400, 1024, 256, Activation::Gelu, true},  // AIFI's fc1 (GELU, erf)
      {45, 72, 32, Activation::Gelu, false},     // GELU with tails, no bias
  };
  for (DType dt : {DType::F16, DType::BF16}) {
    for (const GemmCase& c : cases) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " m " + std::to_string(c.m) + " n " + std::to_string(c.n) + " k " +
                   std::to_string(c.k));
      const auto xh = rounded(random_values(size_t(c.m) * c.k, 11, -1.f, 1.f), dt);
      const auto wh = rounded(random_values(size_t(c.n) * c.k, 12, -0.2f, 0.2f), dt);
      const auto bh = rounded(random_values(size_t(c.n), 13, -0.5f, 0.5f), dt);
      const auto x = upload(xh, dt), w = upload(wh, dt), b = upload(bh, dt);
      std::vector<double> want(size_t(c.m) * c.n);
      double scale = 0;
      for (int r = 0; r < c.m; ++r)
        for (int j = 0; j < c.n; ++j) {
          double s = c.bias ? bh[size_t(j)] : 0.0;
          for (int q = 0; q < c.k; ++q) s += double(xh[size_t(r) * c.k + q]) * wh[size_t(j) * c.k + q];
          if (c.act == Activation::Relu) s = std::max(s, 0.0);
          if (c.act == Activation::Gelu) s = 0.5 * s * (1.0 + std::erf(s / std::sqrt(2.0)));
          scale = std::max(scale, std::abs(s));
          want[size_t(r) * c.n + j] = s;
        }
      // One rounding to the storage type (2^-8 relative for bf16, 2^-11 for f16) of the largest output, plus f32 sums.
      // GELU: two roundings (the product as stored, then the activation's result).
      const double tol = (dt == DType::BF16 ? 1.0 / 256 : 1.0 / 2048) * std::max(scale, 1e-3) * (c.act == Activation::Gelu ? 2 : 1) +
                         1e-4 * c.k / 256;
      for (int tile_m : {16, 64}) {
        const auto y = alloc(size_t(c.m) * c.n, dt);
        small_gemm(x->ptr(), w->ptr(), c.bias ? b->ptr() : nullptr, y->ptr(), dt, c.m, c.n, c.k, c.act, nullptr, tile_m);
        CK(cudaDeviceSynchronize());
        const auto got = download(y->ptr(), size_t(c.m) * c.n, dt);
        double worst = 0;
        for (size_t i = 0; i < want.size(); ++i) worst = std::max(worst, std::abs(want[i] - double(got[i])));
        EXPECT_LE(worst, tol) << "tile_m " << tile_m << ", largest |y| " << scale;
      }
    }
  }
}

TEST(CudaSmallGemm, RefusesWhatItDoesNotTake) {
  KILN_REQUIRE_GPU();
  const auto x = alloc(size_t(64) * 1024, DType::F16), w = alloc(size_t(64) * 1024, DType::F16),
             y = alloc(size_t(64) * 64, DType::F16);
  const auto run = [&](int n, int k, Activation act, DType dt = DType::F16, int m = 8, int tile_m = 0) {
    small_gemm(x->ptr(), w->ptr(), nullptr, y->ptr(), dt, m, n, k, act, nullptr, tile_m);
  };
  EXPECT_THROW(run(64, 1024, Activation::None), Error);  // k over the limit
  EXPECT_THROW(run(64, 24, Activation::None), Error);    // k not a multiple of 16
  EXPECT_THROW(run(60, 64, Activation::None), Error);    // n not a multiple of 8
  EXPECT_THROW(run(64, 64, Activation::Silu), Error);    // an activation it has no epilogue for
  EXPECT_THROW(run(64, 64, Activation::None, DType::F32), Error);
  EXPECT_THROW(run(64, 64, Activation::None, DType::F16, int(kMaxSmallGemmRows) + 1), Error);  // rows over the limit
  EXPECT_THROW(run(64, 64, Activation::None, DType::F16, 8, 32), Error);                       // no 32-row tile
  EXPECT_EQ(small_gemm_unsupported(DType::F16, 8400, 256, 256, Activation::None), "m 8400 (1 to 4096 rows)");
  CK(cudaDeviceSynchronize());
}

// The auto setting of switch small_gemm takes the shapes where it beat
// cuBLASLt in the engine's graph (H100, session 27): RT-DETR's 300/400-row
// projections with n 128-512 and k 256, not the FFN's 1024-wide first layer,
// the 80-class head, k 512 or batch 8's rows. Host-side: no GPU needed.
TEST(CudaSmallGemm, AutoTakesTheShapesWhereItWon) {
  EXPECT_TRUE(small_gemm_preferred(300, 256, 256));   // out_proj, output_proj
  EXPECT_TRUE(small_gemm_preferred(300, 512, 256));   // merged q/k
  EXPECT_TRUE(small_gemm_preferred(300, 288, 256));   // sampling offsets + attention weights
  EXPECT_TRUE(small_gemm_preferred(400, 256, 256));   // AIFI
  EXPECT_FALSE(small_gemm_preferred(300, 1024, 256)); // fc1
  EXPECT_FALSE(small_gemm_preferred(300, 80, 256));   // class_embed
  EXPECT_FALSE(small_gemm_preferred(300, 256, 512));
  EXPECT_FALSE(small_gemm_preferred(2400, 256, 256)); // batch 8
  // GELU: the shapes of the other activations until its epilogue has run on a
  // GPU (session 28 got no device time), so not AIFI's 1024-wide fc1 yet.
  EXPECT_TRUE(small_gemm_preferred(300, 256, 256, Activation::Gelu));
  EXPECT_FALSE(small_gemm_preferred(400, 1024, 256, Activation::Gelu));
  EXPECT_FALSE(small_gemm_preferred(400, 1024, 256, Activation::Relu));
}

// Per launch, mean of 100: a chain of four dependent linears of each shape
// (kiln's with PDL), as plain launches in a stream and as one CUDA graph
// replayed, as the engine runs them. Session 26's plain-launch numbers had
// small_gemm well ahead (4.1 against 6.8 us) where the engine's graph had it
// behind (session 27): a library kernel's launch cost is what a graph hides.
TEST(CudaSmallGemmPerf, RtDetrLinears) {
  KILN_REQUIRE_GPU();
  const LtProbe probe;
  ASSERT_TRUE(probe.ok());
  const auto& [st, lt, ws] = probe;
  const DType dt = DType::F16;
  std::printf("linear per launch (us; four dependent launches a round, mean of 100 rounds / 4), f16: plain | graph\n");
  for (const GemmCase& c : std::vector<GemmCase>{{300, 256, 256, Activation::None, true},
                                                 {300, 512, 256, Activation::None, true},
                                                 {400, 256, 256, Activation::None, true},
                                                 {300, 256, 512, Activation::Relu, true},
                                                 {300, 1024, 256, Activation::Relu, true},
                                                 {2400, 256, 256, Activation::None, true}}) {
    const int wide = std::max(c.n, c.k);
    const auto a = upload(random_values(size_t(c.m) * wide, 21, -1.f, 1.f), dt);
    const auto bufb = alloc(size_t(c.m) * wide, dt);
    const auto w = upload(random_values(size_t(c.n) * c.k, 22, -0.1f, 0.1f), dt);
    const auto b = upload(random_values(size_t(c.n), 23), dt);
    LinearOp op(lt, dt, c.m, c.k, c.n, true, c.act);
    // x -> y -> x ... (the shapes are square in the chain's sense only when n == k; else the same input each time).
    const bool chain = c.n == c.k;
    const auto ours = [&](int tile_m) {
      return [&, tile_m] {
        for (int r = 0; r < 4; ++r)
          small_gemm(chain && r % 2 ? bufb->ptr() : a->ptr(), w->ptr(), b->ptr(), chain && r % 2 ? a->ptr() : bufb->ptr(),
                     dt, c.m, c.n, c.k, c.act, st, tile_m);
      };
    };
    const auto lib = [&] {
      for (int r = 0; r < 4; ++r)
        op.run(chain && r % 2 ? bufb->ptr() : a->ptr(), w->ptr(), b->ptr(), chain && r % 2 ? a->ptr() : bufb->ptr(), ws.ptr(),
               LinearOp::kMaxWorkspace, st);
    };
    std::printf("  m %4d n %4d k %4d %-5s  small_gemm 16x64 %6.2f | %6.2f   64x64 %6.2f | %6.2f   cuBLASLt %6.2f | %6.2f\n",
                c.m, c.n, c.k, c.act == Activation::Relu ? "relu" : "", mean_launch_us(st, ours(16)) / 4,
                mean_graph_us(st, ours(16)) / 4, mean_launch_us(st, ours(64)) / 4, mean_graph_us(st, ours(64)) / 4,
                mean_launch_us(st, lib) / 4, mean_graph_us(st, lib) / 4);
  }
  CK(cudaStreamSynchronize(st));
}

struct NormCase {
  int m, n, k;
  Activation act;
  bool bias, norm_affine, pos, widen;
};

// small_gemm_norm gives the bits of the steps it replaces: small_gemm (the
// linear), the residual add (inside layer_norm_rows' x2) and layer_norm_rows
// with its position add and f32 copy. Rows of RT-DETR's out_proj and
// output_proj (300 / 400 x 256 x 256), tails of a 16-row block, the narrow
// widths (16, 48: two warps ... three) and ReLU.
TEST(CudaSmallGemmNorm, GivesTheBitsOfTheUnfusedSteps) {
  KILN_REQUIRE_GPU();
  const std::vector<NormCase> cases = {
      {300, 256, 256, Activation::None, true, true, true, false},  // a decoder layer's self_attn out_proj + norm + query pos
      {400, 256, 256, Activation::None, true, true, false, true},  // AIFI, with an f32 copy
      {33, 128, 64, Activation::Relu, true, false, true, true},    // 4 warps of 32 columns, no norm weight or bias
      {17, 48, 32, Activation::None, false, true, false, false},   // 3 warps of 16 columns, no bias
      {5, 16, 16, Activation::None, true, true, true, true},       // the smallest: one warp
      {2400, 256, 256, Activation::None, true, true, true, false}, // batch 8's rows
  };
  for (DType dt : {DType::F16, DType::BF16})
    for (const NormCase& c : cases) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " m " + std::to_string(c.m) + " n " + std::to_string(c.n) + " k " +
                   std::to_string(c.k));
      const size_t mn = size_t(c.m) * c.n;
      const auto x = upload(random_values(size_t(c.m) * c.k, 31, -1.f, 1.f), dt);
      const auto w = upload(random_values(size_t(c.n) * c.k, 32, -0.2f, 0.2f), dt);
      const auto b = upload(random_values(size_t(c.n), 33, -0.5f, 0.5f), dt);
      const auto res = upload(random_values(mn, 34, 1.f, 3.f), dt);  // a mean away from 0: the subtraction matters
      const auto lw = upload(random_values(size_t(c.n), 35, 0.5f, 1.5f), dt);
      const auto lb = upload(random_values(size_t(c.n), 36, -0.5f, 0.5f), dt);
      const auto pos = upload(random_values(mn, 37, -1.f, 1.f), dt);
      const auto lin = alloc(mn, dt);
      LayerNormIo io;
      io.x2 = res->ptr();
      if (c.norm_affine) io.weight = lw->ptr(), io.bias = lb->ptr();
      if (c.pos) io.pos = pos->ptr();
      // The unfused steps.
      const auto y0 = alloc(mn, dt), yp0 = alloc(mn, dt), yf0 = alloc(mn, DType::F32);
      small_gemm(x->ptr(), w->ptr(), c.bias ? b->ptr() : nullptr, lin->ptr(), dt, c.m, c.n, c.k, c.act, nullptr);
      LayerNormIo u = io;
      u.x = lin->ptr(), u.y = y0->ptr();
      if (c.pos) u.y_pos = yp0->ptr();
      if (c.widen) u.y_f32 = static_cast<float*>(yf0->ptr());
      layer_norm_rows(u, dt, c.m, c.n, 1e-5f, nullptr);
      // One launch.
      const auto y1 = alloc(mn, dt), yp1 = alloc(mn, dt), yf1 = alloc(mn, DType::F32);
      LayerNormIo f = io;
      f.y = y1->ptr();
      if (c.pos) f.y_pos = yp1->ptr();
      if (c.widen) f.y_f32 = static_cast<float*>(yf1->ptr());
      small_gemm_norm(x->ptr(), w->ptr(), c.bias ? b->ptr() : nullptr, dt, c.m, c.n, c.k, c.act, f, 1e-5f, nullptr);
      CK(cudaDeviceSynchronize());
      const auto same = [&](const DevBuf& want, const DevBuf& got, DType t, const char* what) {
        const auto a = download(want.ptr(), mn, t), g = download(got.ptr(), mn, t);
        size_t diff = 0, first = mn;
        for (size_t i = 0; i < mn; ++i)
          if (!(std::isfinite(a[i]) && a[i] == g[i])) {
            ++diff;
            if (first == mn) first = i;
          }
        EXPECT_EQ(diff, 0u) << what << ": first at row " << first / c.n << " column " << first % c.n << " (" << a[first % mn]
                            << " unfused, " << g[first % mn] << " fused)";
      };
      same(*y0, *y1, dt, "y");
      if (c.pos) same(*yp0, *yp1, dt, "y + pos");
      if (c.widen) same(*yf0, *yf1, DType::F32, "f32(y)");
    }
}

// Host-side rules (no GPU needed).
TEST(CudaSmallGemmNorm, RulesNameWhatItDoesNotTake) {
  EXPECT_EQ(small_gemm_norm_unsupported(DType::F16, 300, 256, 256, Activation::None), "");
  EXPECT_EQ(small_gemm_norm_unsupported(DType::BF16, 4096, 16, 16, Activation::Relu), "");
  EXPECT_NE(small_gemm_norm_unsupported(DType::F32, 300, 256, 256, Activation::None), "");
  EXPECT_EQ(small_gemm_norm_unsupported(DType::F16, 300, 256, 512, Activation::None), "k 512 (a multiple of 16 up to 256)");
  EXPECT_EQ(small_gemm_norm_unsupported(DType::F16, 300, 264, 256, Activation::None), "n 264 (a multiple of 16 up to 256)");
  EXPECT_NE(small_gemm_norm_unsupported(DType::F16, 300, 24, 256, Activation::None), "");  // n not a multiple of 16
  EXPECT_NE(small_gemm_norm_unsupported(DType::F16, 300, 256, 24, Activation::None), "");  // k not a multiple of 16
  EXPECT_NE(small_gemm_norm_unsupported(DType::F16, 300, 256, 256, Activation::Gelu), "");
  EXPECT_NE(small_gemm_norm_unsupported(DType::F16, kMaxSmallGemmRows + 1, 256, 256, Activation::None), "");
}

TEST(CudaSmallGemmNorm, RefusesWhatItDoesNotTake) {
  KILN_REQUIRE_GPU();
  const auto x = alloc(size_t(64) * 256, DType::F16), w = alloc(size_t(256) * 256, DType::F16),
             r = alloc(size_t(64) * 256, DType::F16), y = alloc(size_t(64) * 256, DType::F16);
  LayerNormIo io;
  io.x2 = r->ptr(), io.y = y->ptr();
  EXPECT_THROW(small_gemm_norm(x->ptr(), w->ptr(), nullptr, DType::F16, 8, 256, 512, Activation::None, io, 1e-5f, nullptr), Error);
  LayerNormIo no_res = io;
  no_res.x2 = nullptr;
  EXPECT_THROW(small_gemm_norm(x->ptr(), w->ptr(), nullptr, DType::F16, 8, 256, 256, Activation::None, no_res, 1e-5f, nullptr),
               Error);
  LayerNormIo odd = io;
  odd.y = static_cast<char*>(y->ptr()) + 2;  // off 16 bytes
  EXPECT_THROW(small_gemm_norm(x->ptr(), w->ptr(), nullptr, DType::F16, 8, 256, 256, Activation::None, odd, 1e-5f, nullptr), Error);
  CK(cudaDeviceSynchronize());
}

// Per launch in a replayed graph (four dependent rounds), f16: small_gemm_norm
// against small_gemm + layer_norm_rows (residual and position add inside) and
// cuBLASLt + layer_norm_rows, on RT-DETR's post-norm projections (printed only).
TEST(CudaSmallGemmNormPerf, RtDetrPostNorms) {
  KILN_REQUIRE_GPU();
  const LtProbe probe;
  ASSERT_TRUE(probe.ok());
  const auto& [st, lt, ws] = probe;
  const DType dt = DType::F16;
  std::printf("post-norm projection + residual layer norm per round (us; graph of four dependent rounds / 4), f16\n");
  for (const int m : {300, 400, 2400}) {
    const int n = 256, k = 256;
    const size_t mn = size_t(m) * n;
    const auto a = upload(random_values(mn, 41, -1.f, 1.f), dt), bb = alloc(mn, dt), lin = alloc(mn, dt);
    const auto w = upload(random_values(size_t(n) * k, 42, -0.1f, 0.1f), dt), b = upload(random_values(size_t(n), 43), dt);
    const auto lw = upload(random_values(size_t(n), 44, 0.5f, 1.5f), dt), lb = upload(random_values(size_t(n), 45), dt);
    const auto res = upload(random_values(mn, 46), dt), pos = upload(random_values(mn, 47), dt), yp = alloc(mn, dt);
    LinearOp op(lt, dt, m, k, n, true, Activation::None);
    const auto io_for = [&](int r) {
      LayerNormIo io;
      io.x2 = res->ptr(), io.weight = lw->ptr(), io.bias = lb->ptr(), io.pos = pos->ptr(), io.y_pos = yp->ptr();
      io.y = r % 2 ? a->ptr() : bb->ptr();
      return io;
    };
    const auto fused = [&] {
      for (int r = 0; r < 4; ++r)
        small_gemm_norm(r % 2 ? bb->ptr() : a->ptr(), w->ptr(), b->ptr(), dt, m, n, k, Activation::None, io_for(r), 1e-5f, st);
    };
    const auto two = [&](bool library) {
      return [&, library] {
        for (int r = 0; r < 4; ++r) {
          const void* x = r % 2 ? bb->ptr() : a->ptr();
          if (library)
            op.run(x, w->ptr(), b->ptr(), lin->ptr(), ws.ptr(), LinearOp::kMaxWorkspace, st);
          else
            small_gemm(x, w->ptr(), b->ptr(), lin->ptr(), dt, m, n, k, Activation::None, st);
          LayerNormIo io = io_for(r);
          io.x = lin->ptr();
          layer_norm_rows(io, dt, m, n, 1e-5f, st);
        }
      };
    };
    std::printf("  m %4d n %d k %d  small_gemm_norm %6.2f   small_gemm + norm %6.2f   cuBLASLt + norm %6.2f\n", m, n, k,
                mean_graph_us(st, fused) / 4, mean_graph_us(st, two(false)) / 4, mean_graph_us(st, two(true)) / 4);
  }
  CK(cudaStreamSynchronize(st));
}

}  // namespace
}  // namespace kiln::cuda::test
