// Tests for the CPU fp32 kernels against naive direct loops (double
// accumulation) and against hand-computed PyTorch values.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <numeric>
#include <random>
#include <stdexcept>
#include <vector>

#include "backends/cpu/kernels.hpp"
#include "core/error.hpp"
#include "core/half.hpp"

namespace kiln::cpu {
namespace {

std::vector<float> random_vec(size_t count, uint32_t seed, float lo = -1.f, float hi = 1.f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(count);
  for (auto& e : v) e = dist(rng);
  return v;
}

// The tolerance used throughout: max abs error <= 1e-4 * max(1, max|ref|).
void expect_close(const std::vector<float>& got, const std::vector<double>& ref, const std::string& what) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  double max_ref = 0, max_err = 0;
  size_t non_finite = 0;  // std::max would silently skip NaN, so count them apart
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(got[i]) && got[i] != ref[i]) {
      ++non_finite;
      continue;
    }
    max_ref = std::max(max_ref, std::abs(ref[i]));
    if (std::isfinite(ref[i])) max_err = std::max(max_err, std::abs(double(got[i]) - ref[i]));
  }
  EXPECT_EQ(non_finite, 0u) << what;
  EXPECT_LE(max_err, 1e-4 * std::max(1.0, max_ref)) << what;
}

double act_ref(Activation a, double v) {
  switch (a) {
    case Activation::None: return v;
    case Activation::Relu: return v > 0 ? v : 0;
    case Activation::Relu6: return std::min(std::max(v, 0.0), 6.0);
    case Activation::Silu: return v / (1 + std::exp(-v));
    case Activation::Sigmoid: return 1 / (1 + std::exp(-v));
    case Activation::Gelu: return 0.5 * v * (1 + std::erf(v / std::sqrt(2.0)));
    default: fail_unknown_activation(a, "test act_ref");
  }
}

// ---------------------------------------------------------------- thread pool

TEST(ThreadPool, SumsMillionElements) {
  const int64_t n = 1000000;
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = float(i % 1000);
  const double expected = 1000.0 * (999.0 * 1000.0 / 2.0);
  for (int threads : {1, 2, 3, 8}) {
    ThreadPool pool(threads);
    std::atomic<int64_t> total{0};
    std::atomic<int> calls{0};
    pool.parallel_for(n, [&](int64_t b, int64_t e) {
      int64_t s = 0;
      for (int64_t i = b; i < e; ++i) s += int64_t(v[i]);
      total += s;
      ++calls;
    });
    EXPECT_EQ(double(total.load()), expected) << threads;
    EXPECT_EQ(calls.load(), threads) << "one contiguous chunk per thread";
  }
}

TEST(ThreadPool, ChunksCoverRangeExactlyOnce) {
  ThreadPool pool(4);
  for (int64_t n : {0, 1, 3, 4, 5, 17, 1000}) {
    std::vector<std::atomic<int>> hits(size_t(std::max<int64_t>(n, 1)));
    pool.parallel_for(n, [&](int64_t b, int64_t e) {
      ASSERT_LE(b, e);
      for (int64_t i = b; i < e; ++i) ++hits[size_t(i)];
    });
    for (int64_t i = 0; i < n; ++i) EXPECT_EQ(hits[size_t(i)].load(), 1) << "n=" << n << " i=" << i;
  }
}

TEST(ThreadPool, GrainLimitsChunks) {
  ThreadPool pool(4);
  std::atomic<int> calls{0};
  pool.parallel_for(10, [&](int64_t, int64_t) { ++calls; }, 6);
  EXPECT_EQ(calls.load(), 2);
}

TEST(ThreadPool, PropagatesWorkerException) {
  ThreadPool pool(3);
  for (int rep = 0; rep < 20; ++rep) {
    // Throw from the last chunk, which a worker (not the caller) usually runs.
    EXPECT_THROW(pool.parallel_for(300, [&](int64_t, int64_t e) {
      if (e == 300) throw std::runtime_error("boom");
    }), std::runtime_error);
  }
  // The pool stays usable after a failure.
  std::atomic<int64_t> total{0};
  pool.parallel_for(100, [&](int64_t b, int64_t e) { total += e - b; });
  EXPECT_EQ(total.load(), 100);
}

TEST(ThreadPool, NestedCallRunsInline) {
  ThreadPool pool(2);
  std::atomic<int64_t> total{0};
  pool.parallel_for(4, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i)
      pool.parallel_for(10, [&](int64_t b2, int64_t e2) { total += e2 - b2; });
  });
  EXPECT_EQ(total.load(), 40);
}

TEST(ThreadPool, DefaultPoolHasThreads) { EXPECT_GE(default_pool().threads(), 1); }

// --------------------------------------------------------------------- conv2d

struct ConvCase {
  Conv2dParams p;
  bool bias, residual;
  Activation act;
};

std::vector<double> conv_ref(const ConvCase& cc, const std::vector<float>& x, const std::vector<float>& w,
                             const std::vector<float>& bias, const std::vector<float>& res) {
  const Conv2dParams& p = cc.p;
  const int oh = p.out_h(), ow = p.out_w(), cg = p.c_in / p.groups, mg = p.c_out / p.groups;
  std::vector<double> y(size_t(p.n) * p.c_out * oh * ow);
  for (int b = 0; b < p.n; ++b)
    for (int oc = 0; oc < p.c_out; ++oc)
      for (int oy = 0; oy < oh; ++oy)
        for (int ox = 0; ox < ow; ++ox) {
          double acc = cc.bias ? bias[oc] : 0.0;
          const int g = oc / mg;
          for (int ic = 0; ic < cg; ++ic)
            for (int i = 0; i < p.kh; ++i)
              for (int j = 0; j < p.kw; ++j) {
                const int iy = oy * p.stride_h - p.pad_t + i * p.dil_h;
                const int ix = ox * p.stride_w - p.pad_l + j * p.dil_w;
                if (iy < 0 || iy >= p.h || ix < 0 || ix >= p.w) continue;
                acc += double(x[((size_t(b) * p.c_in + g * cg + ic) * p.h + iy) * p.w + ix]) *
                       w[((size_t(oc) * cg + ic) * p.kh + i) * p.kw + j];
              }
          const size_t idx = ((size_t(b) * p.c_out + oc) * oh + oy) * ow + ox;
          if (cc.residual) acc += res[idx];
          y[idx] = act_ref(cc.act, acc);
        }
  return y;
}

std::string describe(const ConvCase& c) {
  const auto& p = c.p;
  return cat("n=", p.n, " c=", p.c_in, "->", p.c_out, " g=", p.groups, " in=", p.h, "x", p.w, " k=", p.kh, "x",
             p.kw, " s=", p.stride_h, ",", p.stride_w, " pad(tlbr)=", p.pad_t, ",", p.pad_l, ",", p.pad_b, ",",
             p.pad_r, " dil=", p.dil_h, ",", p.dil_w, " bias=", c.bias, " res=", c.residual,
             " act=", activation_name(c.act));
}

void run_conv_case(const ConvCase& cc, ThreadPool& pool, uint32_t seed) {
  const Conv2dParams& p = cc.p;
  const size_t y_size = size_t(p.n) * p.c_out * p.out_h() * p.out_w();
  auto x = random_vec(size_t(p.n) * p.c_in * p.h * p.w, seed);
  auto w = random_vec(size_t(p.c_out) * (p.c_in / p.groups) * p.kh * p.kw, seed + 1);
  auto bias = random_vec(p.c_out, seed + 2);
  auto res = random_vec(y_size, seed + 3);
  std::vector<float> y(y_size, std::nanf(""));  // NaN fill catches unwritten outputs
  conv2d(p, x.data(), w.data(), cc.bias ? bias.data() : nullptr, cc.residual ? res.data() : nullptr, cc.act,
         y.data(), pool);
  expect_close(y, conv_ref(cc, x, w, bias, res), describe(cc) + " threads=" + std::to_string(pool.threads()));
}

// The option matrix: channel/group configurations x kernel geometries x
// spatial sizes x batch; bias/residual/activation rotate with the case index
// so every combination of those three appears many times.
std::vector<ConvCase> conv_matrix() {
  struct Ch { int c_in, c_out, groups; };
  const Ch channels[] = {{1, 1, 1}, {3, 12, 1}, {13, 13, 13}, {12, 24, 2}, {24, 24, 4}, {13, 3, 1}, {24, 12, 1}};
  struct Geo { int kh, kw, sh, sw, pt, pl, pb, pr, dh, dw; };
  const Geo geos[] = {
      {1, 1, 1, 1, 0, 0, 0, 0, 1, 1},  // pointwise: the no-im2col path
      {1, 1, 2, 2, 0, 0, 0, 0, 1, 1},  // strided pointwise
      {3, 3, 1, 1, 1, 1, 1, 1, 1, 1},
      {3, 3, 2, 2, 1, 1, 1, 1, 1, 1},
      {3, 3, 2, 2, 0, 0, 1, 1, 1, 1},  // TF "same" with stride 2: pad only at the end
      {3, 3, 1, 2, 2, 1, 0, 2, 1, 1},  // asymmetric, t != b, l != r
      {3, 3, 1, 1, 2, 2, 2, 2, 2, 2},  // dilation 2
      {7, 7, 2, 2, 3, 3, 3, 3, 1, 1},  // stem
      {1, 3, 1, 1, 0, 1, 0, 1, 1, 1},
      {3, 3, 1, 1, 0, 0, 0, 0, 1, 1},  // valid, no padding
  };
  struct Sp { int h, w; };
  const Sp spatial[] = {{1, 1}, {5, 7}, {17, 13}};
  const Activation acts[] = {Activation::None, Activation::Relu, Activation::Relu6, Activation::Silu,
                             Activation::Sigmoid, Activation::Gelu};
  std::vector<ConvCase> cases;
  int idx = 0;
  for (const Ch& ch : channels)
    for (const Geo& g : geos)
      for (const Sp& sp : spatial)
        for (int n : {1, 3}) {
          Conv2dParams p;
          p.n = n, p.c_in = ch.c_in, p.c_out = ch.c_out, p.groups = ch.groups, p.h = sp.h, p.w = sp.w;
          p.kh = g.kh, p.kw = g.kw, p.stride_h = g.sh, p.stride_w = g.sw;
          p.pad_t = g.pt, p.pad_l = g.pl, p.pad_b = g.pb, p.pad_r = g.pr, p.dil_h = g.dh, p.dil_w = g.dw;
          // Skip geometries whose kernel does not fit the padded input.
          if (p.h + p.pad_t + p.pad_b < p.dil_h * (p.kh - 1) + 1 || p.w + p.pad_l + p.pad_r < p.dil_w * (p.kw - 1) + 1)
            continue;
          cases.push_back({p, idx % 2 == 0, idx % 3 == 0, acts[idx % 6]});
          ++idx;
        }
  return cases;
}

TEST(Conv2d, OptionMatrixSingleThread) {
  ThreadPool pool(1);
  auto cases = conv_matrix();
  EXPECT_GT(cases.size(), 300u);
  uint32_t seed = 1;
  for (const auto& c : cases) run_conv_case(c, pool, seed += 10);
}

TEST(Conv2d, OptionMatrixMultiThread) {
  // 2 threads: batch 3 takes the item-parallel path, batch 1 with one group
  // the threaded-BLAS path; 5 threads pushes more cases to threaded BLAS.
  for (int threads : {2, 5}) {
    ThreadPool pool(threads);
    uint32_t seed = 7;
    for (const auto& c : conv_matrix()) run_conv_case(c, pool, seed += 10);
  }
}

TEST(Conv2d, LargerLayersMatchReference) {
  // Big enough that OpenBLAS really threads and im2col/epilogue are split.
  ThreadPool pool(2);
  ConvCase a{{}, true, true, Activation::Relu};
  a.p.n = 1, a.p.c_in = 32, a.p.c_out = 48, a.p.h = 28, a.p.w = 30, a.p.kh = 3, a.p.kw = 3;
  a.p.pad_t = a.p.pad_l = a.p.pad_b = a.p.pad_r = 1;
  run_conv_case(a, pool, 99);
  ConvCase b{{}, true, false, Activation::Silu};
  b.p.n = 2, b.p.c_in = 64, b.p.c_out = 64, b.p.h = 20, b.p.w = 20, b.p.kh = 3, b.p.kw = 3, b.p.groups = 64;
  b.p.stride_h = b.p.stride_w = 2, b.p.pad_t = b.p.pad_l = b.p.pad_b = b.p.pad_r = 1;
  run_conv_case(b, pool, 123);
  ConvCase c{{}, false, true, Activation::None};
  c.p.n = 1, c.p.c_in = 96, c.p.c_out = 40, c.p.h = 14, c.p.w = 14;  // 1x1 direct path
  run_conv_case(c, pool, 321);
}

TEST(Conv2d, DepthwiseWithMultiplierUsesGemmPath) {
  ThreadPool pool(2);
  ConvCase c{{}, true, false, Activation::Relu6};
  c.p.n = 2, c.p.c_in = 6, c.p.c_out = 12, c.p.groups = 6, c.p.h = 9, c.p.w = 8, c.p.kh = 3, c.p.kw = 3;
  c.p.pad_t = c.p.pad_l = 1, c.p.pad_b = c.p.pad_r = 1;
  run_conv_case(c, pool, 5);
}

// conv2d_of_sum equals conv2d of the separately formed sum, rounded to the
// sum's storage type, bit for bit: every path (im2col, 1x1 direct,
// depthwise, grouped), every thread layout, f32 and the f16/bf16 emulation.
TEST(Conv2d, OfSumEqualsConvOfStoredSum) {
  int idx = 0;
  for (int threads : {1, 2})
    for (DType t : {DType::F32, DType::F16, DType::BF16})
      for (const ConvCase& cc : conv_matrix()) {
        if (++idx % 7 != 0) continue;  // a spread of the matrix keeps this quick
        ThreadPool pool(threads);
        const Conv2dParams& p = cc.p;
        const size_t nx = size_t(p.n) * p.c_in * p.h * p.w, ny = size_t(p.n) * p.c_out * p.out_h() * p.out_w();
        const auto a = random_vec(nx, idx), b = random_vec(nx, idx + 1);
        const auto w = random_vec(size_t(p.c_out) * (p.c_in / p.groups) * p.kh * p.kw, idx + 2);
        const auto bias = random_vec(p.c_out, idx + 3), res = random_vec(ny, idx + 4);
        std::vector<float> sum(nx);
        for (size_t i = 0; i < nx; ++i) sum[i] = round_to_storage(t, a[i] + b[i]);
        const float* bp = cc.bias ? bias.data() : nullptr;
        const float* rp = cc.residual ? res.data() : nullptr;
        std::vector<float> want(ny), got(ny, std::nanf(""));
        conv2d(p, sum.data(), w.data(), bp, rp, cc.act, want.data(), pool);
        conv2d_of_sum(p, a.data(), b.data(), t, w.data(), bp, rp, cc.act, got.data(), pool);
        ASSERT_EQ(got, want) << describe(cc) << " " << dtype_name(t) << " threads=" << threads;
      }
  ThreadPool pool(1);
  Conv2dParams p;
  std::vector<float> x(1), y(1);
  EXPECT_THROW(conv2d_of_sum(p, x.data(), nullptr, DType::F32, x.data(), nullptr, nullptr, Activation::None, y.data(), pool),
               Error);
}

TEST(Conv2d, OutputDims) {
  Conv2dParams p;
  p.h = 224, p.w = 224, p.kh = p.kw = 7, p.stride_h = p.stride_w = 2, p.pad_t = p.pad_l = p.pad_b = p.pad_r = 3;
  EXPECT_EQ(p.out_h(), 112);
  EXPECT_EQ(p.out_w(), 112);
  p.h = p.w = 224, p.kh = p.kw = 3, p.pad_t = p.pad_l = 0, p.pad_b = p.pad_r = 1;  // TF "same", stride 2
  EXPECT_EQ(p.out_h(), 112);
  p.h = 225, p.pad_t = p.pad_b = 1;  // TF "same" on an odd size pads 1/1
  EXPECT_EQ(p.out_h(), 113);
}

TEST(Conv2d, RejectsInvalidParams) {
  ThreadPool pool(1);
  std::vector<float> buf(4096);
  Conv2dParams p;
  p.c_in = 3, p.c_out = 4, p.groups = 2, p.h = p.w = 4;
  EXPECT_THROW(conv2d(p, buf.data(), buf.data(), nullptr, nullptr, Activation::None, buf.data(), pool), Error);
  p.groups = 1, p.kh = p.kw = 5;  // kernel larger than unpadded input
  EXPECT_THROW(conv2d(p, buf.data(), buf.data(), nullptr, nullptr, Activation::None, buf.data(), pool), Error);
  p.kh = p.kw = 1, p.stride_h = 0;
  EXPECT_THROW(conv2d(p, buf.data(), buf.data(), nullptr, nullptr, Activation::None, buf.data(), pool), Error);
}

// --------------------------------------------------------------------- linear

TEST(Linear, MatchesNaive) {
  ThreadPool pool(2);
  int idx = 0;
  for (int n : {1, 3, 7})
    for (int in : {1, 13, 64})
      for (int out : {1, 5, 33}) {
        const bool has_bias = idx % 2 == 0;
        const Activation act = Activation(idx % 6);
        ++idx;
        auto x = random_vec(size_t(n) * in, idx), w = random_vec(size_t(out) * in, idx + 100);
        auto bias = random_vec(out, idx + 200);
        std::vector<float> y(size_t(n) * out, std::nanf(""));
        linear(n, in, out, x.data(), w.data(), has_bias ? bias.data() : nullptr, act, y.data(), pool);
        std::vector<double> ref(y.size());
        for (int r = 0; r < n; ++r)
          for (int o = 0; o < out; ++o) {
            double acc = has_bias ? bias[o] : 0.0;
            for (int i = 0; i < in; ++i) acc += double(x[size_t(r) * in + i]) * w[size_t(o) * in + i];
            ref[size_t(r) * out + o] = act_ref(act, acc);
          }
        expect_close(y, ref, cat("linear n=", n, " in=", in, " out=", out, " act=", activation_name(act)));
      }
}

// ---------------------------------------------------------------------- pools

TEST(Pool, OutDimMatchesPyTorch) {
  // Values as torch.nn.MaxPool2d / AvgPool2d report them.
  EXPECT_EQ(pool_out_dim(112, 3, 2, 1, 1, false), 56);  // resnet stem max pool
  EXPECT_EQ(pool_out_dim(7, 2, 2, 0, 0, false), 3);
  EXPECT_EQ(pool_out_dim(7, 2, 2, 0, 0, true), 4);
  EXPECT_EQ(pool_out_dim(6, 3, 2, 1, 1, false), 3);
  EXPECT_EQ(pool_out_dim(6, 3, 2, 1, 1, true), 4);
  EXPECT_EQ(pool_out_dim(5, 2, 2, 1, 1, true), 3);  // 4th window would start in end padding: dropped
  EXPECT_EQ(pool_out_dim(5, 2, 2, 1, 1, false), 3);
  EXPECT_EQ(pool_out_dim(4, 3, 2, 1, 1, true), 3);
  EXPECT_EQ(pool_out_dim(4, 3, 2, 1, 1, false), 2);
  EXPECT_EQ(pool_out_dim(1, 1, 1, 0, 0, true), 1);
  EXPECT_EQ(pool_out_dim(147, 3, 2, 0, 0, true), 73);  // inception-style
  EXPECT_EQ(pool_out_dim(14, 3, 2, 0, 0, true), 7);
  EXPECT_EQ(pool_out_dim(14, 3, 2, 0, 0, false), 6);
  EXPECT_THROW(pool_out_dim(2, 5, 1, 0, 0, false), Error);
}

TEST(Pool, AvgCeilModeHandValues) {
  // torch.nn.AvgPool2d(2, 2, ceil_mode=True)(arange(1..9).view(1,1,3,3))
  // = [[3, 4.5], [7.5, 9]]: the extra windows divide by their in-input size
  // even with count_include_pad=True.
  ThreadPool pool(1);
  std::vector<float> x = {1, 2, 3, 4, 5, 6, 7, 8, 9}, y(4);
  Pool2dParams p;
  p.h = p.w = 3, p.kh = p.kw = 2, p.stride_h = p.stride_w = 2, p.ceil_mode = true;
  avg_pool2d(p, x.data(), y.data(), pool);
  EXPECT_EQ(y, (std::vector<float>{3.f, 4.5f, 7.5f, 9.f}));
  // AvgPool2d(3, 2, padding=1, ceil_mode=True) on 4x4 arange(1..16): the last
  // window covers input row/col 3 plus one padded row/col, so with
  // count_include_pad its divisor is 2*2 = 4 (not 9); corner = 16/4.
  std::vector<float> x4(16);
  std::iota(x4.begin(), x4.end(), 1.f);
  std::vector<float> y4(9);
  p.h = p.w = 4, p.kh = p.kw = 3, p.pad_t = p.pad_l = p.pad_b = p.pad_r = 1;
  avg_pool2d(p, x4.data(), y4.data(), pool);
  EXPECT_FLOAT_EQ(y4[8], 16.f / 4.f);
  EXPECT_FLOAT_EQ(y4[0], (1 + 2 + 5 + 6) / 9.f);
  p.count_include_pad = false;
  avg_pool2d(p, x4.data(), y4.data(), pool);
  EXPECT_FLOAT_EQ(y4[8], 16.f);
  EXPECT_FLOAT_EQ(y4[0], (1 + 2 + 5 + 6) / 4.f);
}

// Naive pools written from the definition: visit every window cell, pad
// cells are those outside [0, h) but inside [-pad_t, h + pad_b).
void pool_ref(const Pool2dParams& p, bool is_max, const std::vector<float>& x, std::vector<double>& y) {
  const int oh = p.out_h(), ow = p.out_w();
  y.assign(size_t(p.n) * p.c * oh * ow, 0);
  for (int pl = 0; pl < p.n * p.c; ++pl)
    for (int oy = 0; oy < oh; ++oy)
      for (int ox = 0; ox < ow; ++ox) {
        double m = -INFINITY, sum = 0;
        int real = 0, padded = 0;
        for (int i = 0; i < p.kh; ++i)
          for (int j = 0; j < p.kw; ++j) {
            const int iy = oy * p.stride_h - p.pad_t + i, ix = ox * p.stride_w - p.pad_l + j;
            const bool in_y = iy >= 0 && iy < p.h, in_x = ix >= 0 && ix < p.w;
            if (in_y && in_x) {
              const double v = x[(size_t(pl) * p.h + iy) * p.w + ix];
              m = std::max(m, v), sum += v, ++real;
            }
            if (iy >= -p.pad_t && iy < p.h + p.pad_b && ix >= -p.pad_l && ix < p.w + p.pad_r) ++padded;
          }
        y[(size_t(pl) * oh + oy) * ow + ox] = is_max ? m : sum / (p.count_include_pad ? padded : real);
      }
}

TEST(Pool, MatchNaive) {
  ThreadPool pool(2);
  struct Geo { int kh, kw, sh, sw, pt, pl, pb, pr; };
  const Geo geos[] = {{2, 2, 2, 2, 0, 0, 0, 0}, {3, 3, 2, 2, 1, 1, 1, 1}, {3, 3, 1, 1, 1, 1, 1, 1},
                      {3, 2, 2, 1, 0, 1, 2, 0}, {5, 5, 3, 3, 2, 2, 2, 2}, {3, 3, 3, 3, 0, 0, 0, 0},
                      {1, 1, 2, 2, 0, 0, 0, 0}};
  const int sizes[][2] = {{1, 1}, {5, 7}, {17, 13}, {8, 8}};
  uint32_t seed = 3;
  int checked = 0;
  for (const Geo& g : geos)
    for (const auto& sz : sizes)
      for (bool ceil : {false, true})
        for (bool incl : {false, true}) {
          Pool2dParams p;
          p.n = 2, p.c = 3, p.h = sz[0], p.w = sz[1], p.kh = g.kh, p.kw = g.kw, p.stride_h = g.sh,
          p.stride_w = g.sw, p.pad_t = g.pt, p.pad_l = g.pl, p.pad_b = g.pb, p.pad_r = g.pr, p.ceil_mode = ceil,
          p.count_include_pad = incl;
          if (p.h + p.pad_t + p.pad_b < p.kh || p.w + p.pad_l + p.pad_r < p.kw) continue;
          auto x = random_vec(size_t(p.n) * p.c * p.h * p.w, seed++);
          std::vector<float> y(size_t(p.n) * p.c * p.out_h() * p.out_w(), std::nanf(""));
          std::vector<double> ref;
          const std::string what = cat("in=", p.h, "x", p.w, " k=", p.kh, "x", p.kw, " s=", p.stride_h, ",",
                                       p.stride_w, " pads=", p.pad_t, ",", p.pad_l, ",", p.pad_b, ",", p.pad_r,
                                       " ceil=", ceil, " incl=", incl);
          max_pool2d(p, x.data(), y.data(), pool);
          pool_ref(p, true, x, ref);
          expect_close(y, ref, "max " + what);
          std::fill(y.begin(), y.end(), std::nanf(""));
          avg_pool2d(p, x.data(), y.data(), pool);
          pool_ref(p, false, x, ref);
          expect_close(y, ref, "avg " + what);
          ++checked;
        }
  EXPECT_GT(checked, 80);
}

TEST(Pool, RejectsPadNotSmallerThanKernel) {
  ThreadPool pool(1);
  std::vector<float> buf(64);
  Pool2dParams p;
  p.h = p.w = 4, p.kh = p.kw = 2, p.stride_h = p.stride_w = 1, p.pad_t = 2;
  EXPECT_THROW(max_pool2d(p, buf.data(), buf.data(), pool), Error);
}

TEST(Pool, GlobalAverage) {
  auto x = random_vec(2 * 5 * 49, 11);
  std::vector<float> y(10);
  global_avg_pool(2, 5, 49, x.data(), y.data());
  std::vector<double> ref(10);
  for (int pl = 0; pl < 10; ++pl) {
    for (int i = 0; i < 49; ++i) ref[pl] += x[size_t(pl) * 49 + i];
    ref[pl] /= 49;
  }
  expect_close(y, ref, "global_avg_pool");
}

// ---------------------------------------------------------------- elementwise

TEST(Elementwise, AddWithEveryActivation) {
  const int64_t count = 1003;
  auto a = random_vec(count, 1, -8, 8), b = random_vec(count, 2, -8, 8);
  for (int ai = 0; ai < 5; ++ai) {
    const Activation act = Activation(ai);
    std::vector<float> y(count);
    add(count, a.data(), b.data(), act, y.data());
    std::vector<double> ref(count);
    for (int64_t i = 0; i < count; ++i) ref[i] = act_ref(act, double(a[i]) + b[i]);
    expect_close(y, ref, cat("add ", activation_name(act)));
  }
}

TEST(Elementwise, ActivationInPlace) {
  const int64_t count = 517;
  const auto x = random_vec(count, 3, -10, 10);
  for (int ai = 0; ai < 5; ++ai) {
    const Activation act = Activation(ai);
    std::vector<float> y = x;
    activation(count, y.data(), act, y.data());
    std::vector<double> ref(count);
    for (int64_t i = 0; i < count; ++i) ref[i] = act_ref(act, x[i]);
    expect_close(y, ref, cat("activation ", activation_name(act)));
  }
}

TEST(Elementwise, MulChannel) {
  const int n = 2, c = 3, hw = 5;
  auto x = random_vec(n * c * hw, 4), s = random_vec(n * c, 5);
  std::vector<float> y(x.size());
  mul_channel(n, c, hw, x.data(), s.data(), y.data());
  std::vector<double> ref(x.size());
  for (int b = 0; b < n; ++b)
    for (int ch = 0; ch < c; ++ch)
      for (int i = 0; i < hw; ++i) ref[(b * c + ch) * hw + i] = double(x[(b * c + ch) * hw + i]) * s[b * c + ch];
  expect_close(y, ref, "mul_channel");
}

TEST(Elementwise, ConcatThenSliceRoundTrips) {
  const int n = 3, hw = 6;
  auto a = random_vec(n * 2 * hw, 6), b = random_vec(n * 5 * hw, 7), c = random_vec(n * 1 * hw, 8);
  std::vector<float> y(n * 8 * hw);
  concat_channels(n, hw, {{a.data(), 2}, {b.data(), 5}, {c.data(), 1}}, y.data());
  // Spot-check the layout directly: batch 1, channel 2 is b's batch 1, channel 0.
  EXPECT_EQ(y[(1 * 8 + 2) * hw + 3], b[(1 * 5 + 0) * hw + 3]);
  EXPECT_EQ(y[(2 * 8 + 7) * hw + 0], c[(2 * 1 + 0) * hw + 0]);
  std::vector<float> back_a(a.size()), back_b(b.size()), back_c(c.size());
  slice_channels(n, 8, hw, 0, 2, y.data(), back_a.data());
  slice_channels(n, 8, hw, 2, 5, y.data(), back_b.data());
  slice_channels(n, 8, hw, 7, 1, y.data(), back_c.data());
  EXPECT_EQ(back_a, a);
  EXPECT_EQ(back_b, b);
  EXPECT_EQ(back_c, c);
  EXPECT_THROW(slice_channels(n, 8, hw, 6, 3, y.data(), back_a.data()), Error);
}

}  // namespace
}  // namespace kiln::cpu
