// ConvOp against the CPU reference conv2d: every tactic cuDNN offers, for
// f32/f16/bf16, on awkward shapes (odd channels, asymmetric pads, groups,
// depthwise, 1x1 spatial). Layouts are converted on the host: the reference is
// NCHW/KCRS, the GPU op NHWC/KRSC. Also checks CUDA-graph capture and prints
// (never asserts) default-vs-autotuned timings for ResNet-50 shapes.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "backends/cpu/kernels.hpp"
#include "backends/cuda/cudnn_conv.hpp"
#include "backends/cuda/cuda_check.hpp"
#include "core/half.hpp"
#include "cuda_test_util.hpp"

namespace kiln::cuda {
namespace {


cudnnHandle_t handle() {
  static cudnnHandle_t h = [] {
    cudnnHandle_t x = nullptr;
    KILN_CUDNN_CHECK(cudnnCreate(&x));
    return x;
  }();
  return h;
}

cpu::ThreadPool& pool() {
  static cpu::ThreadPool p(0);
  return p;
}

using test::DevBuf;
using test::nchw_to_nhwc;
using test::nhwc_to_nchw;

void upload(const DevBuf& d, const std::vector<float>& v, DType t) {
  const auto raw = test::encode(v, t);
  KILN_CUDA_CHECK(cudaMemcpy(d.ptr(), raw.data(), raw.size(), cudaMemcpyHostToDevice));
}

std::vector<float> download(const DevBuf& d, size_t count, DType t) { return test::download(d.ptr(), count, t); }

std::vector<float> random_vec(size_t n, float scale, std::mt19937& rng, DType t) {
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> v(n);
  for (auto& x : v) x = test::round_to(u(rng) * scale, t);  // the reference sees exactly what the GPU sees
  return v;
}

// One conv's device operands in d.dtype, random (x and the residual in
// [-1, 1], w in [-0.05, 0.05], bias in [-0.5, 0.5]), and room for y.
struct ConvIo {
  ConvIo(const ConvDesc& d, std::mt19937& rng)
      : es(dtype_size(d.dtype)),
        nx(size_t(d.n) * d.c * d.h * d.w),
        nw(size_t(d.k) * (d.c / d.groups) * d.r * d.s),
        ny(size_t(d.n) * d.k * d.out_h() * d.out_w()),
        x(nx * es), w(nw * es), b(d.k * es), r(ny * es), y(ny * es),
        residual(d.has_residual) {
    upload(x, random_vec(nx, 1.f, rng, d.dtype), d.dtype);
    upload(w, random_vec(nw, 0.05f, rng, d.dtype), d.dtype);
    upload(b, random_vec(d.k, 0.5f, rng, d.dtype), d.dtype);
    upload(r, random_vec(ny, 1.f, rng, d.dtype), d.dtype);
  }
  void* res() const { return residual ? r.ptr() : nullptr; }
  // One run of op's selected tactic (y first filled with NaN patterns), y read back.
  std::vector<float> run(const ConvOp& op, DType t) const {
    DevBuf ws(op.workspace_bytes());
    KILN_CUDA_CHECK(cudaMemset(y.ptr(), 0xff, ny * es));
    op.run(handle(), x.ptr(), w.ptr(), b.ptr(), res(), y.ptr(), ws.ptr(), nullptr);
    KILN_CUDA_CHECK(cudaDeviceSynchronize());
    return download(y, ny, t);
  }
  size_t es, nx, nw, ny;
  DevBuf x, w, b, r, y;
  bool residual;
};

// Per-dtype tolerances, as stated in the task: f32 (TF32 off) elementwise
// |d| <= 1e-4 * max(1, |ref|); f16 max|d| <= 5e-3 * max|ref|; bf16 max|d| <= 3e-2 * max|ref|.
constexpr float kTolF32 = 1e-4f, kTolF16 = 5e-3f, kTolBF16 = 3e-2f;

struct Case {
  std::string name;
  ConvDesc d;
};

ConvDesc make(int n, int c, int h, int w, int k, int rs, int stride, int pad, int groups, bool bias, bool residual,
              Activation act) {
  ConvDesc d;
  d.n = n, d.c = c, d.h = h, d.w = w, d.k = k, d.r = d.s = rs;
  d.stride_h = d.stride_w = stride;
  d.pad_t = d.pad_l = d.pad_b = d.pad_r = pad;
  d.groups = groups, d.has_bias = bias, d.has_residual = residual, d.act = act;
  return d;
}

std::vector<Case> cases() {
  using A = Activation;
  std::vector<Case> v = {
      {"stem7x7s2_c3", make(1, 3, 33, 29, 64, 7, 2, 3, 1, true, false, A::Relu)},
      {"pw1x1s1_c13_b3", make(3, 13, 17, 13, 24, 1, 1, 0, 1, true, false, A::None)},
      {"pw1x1s2_c64_res", make(1, 64, 17, 13, 24, 1, 2, 0, 1, true, true, A::None)},
      {"c3x3s1_c64_b3_relu", make(3, 64, 17, 13, 64, 3, 1, 1, 1, true, false, A::Relu)},
      {"c3x3s2_c24_res_relu", make(1, 24, 17, 13, 13, 3, 2, 1, 1, true, true, A::Relu)},
      {"tf_same_3x3s2_silu", make(1, 24, 17, 13, 24, 3, 2, 0, 1, true, false, A::Silu)},
      {"group4_3x3_b3_relu", make(3, 64, 17, 13, 64, 3, 1, 1, 4, true, false, A::Relu)},
      {"dw3x3s1_c32_silu", make(1, 32, 17, 13, 32, 3, 1, 1, 32, true, false, A::Silu)},
      {"dw5x5s2_c32_b3_silu", make(3, 32, 17, 13, 32, 5, 2, 2, 32, true, false, A::Silu)},
      {"spatial1_c64_b3", make(3, 64, 1, 1, 24, 1, 1, 0, 1, true, false, A::Silu)},
      {"spatial1_c24_sigmoid", make(1, 24, 1, 1, 64, 1, 1, 0, 1, true, false, A::Sigmoid)},
      {"plain3x3_c13_nobias", make(1, 13, 17, 13, 13, 3, 1, 1, 1, false, false, A::None)},
      {"res_nobias_1x1_relu", make(1, 24, 17, 13, 64, 1, 1, 0, 1, false, true, A::Relu)},
      {"c3x3s1_c24_bias_relu6", make(1, 24, 17, 13, 24, 3, 1, 1, 1, true, false, A::Relu6)},
  };
  // TF "same" for a 3x3 stride 2 on even-sized input pads only at the end.
  v[5].d.pad_t = 0, v[5].d.pad_l = 0, v[5].d.pad_b = 1, v[5].d.pad_r = 1;
  return v;
}

struct Param {
  Case c;
  DType t;
};

std::string param_name(const testing::TestParamInfo<Param>& info) {
  return info.param.c.name + "_" + dtype_name(info.param.t);
}

std::vector<Param> params() {
  std::vector<Param> out;
  for (DType t : {DType::F32, DType::F16, DType::BF16})
    for (const auto& c : cases()) out.push_back({c, t});
  return out;
}

struct TacticCount {
  int built = 0, passed = 0, variants = 0;
};

// Every tactic of ConvOp(d) that builds against the CPU reference conv2d
// (d.dtype's tolerance); what built, passed and how many were knob variants.
TacticCount check_every_tactic(const std::string& name, const ConvDesc& d);

class ConvTactics : public testing::TestWithParam<Param> {};

TEST_P(ConvTactics, EveryTacticMatchesCpuReference) {
  KILN_REQUIRE_GPU();
  ConvDesc d = GetParam().c.d;
  d.dtype = GetParam().t;
  EXPECT_GT(check_every_tactic(GetParam().c.name, d).built, 0);
}

TacticCount check_every_tactic(const std::string& name, const ConvDesc& d) {
  const DType t = d.dtype;
  const int cg = d.c / d.groups, oh = d.out_h(), ow = d.out_w();
  std::mt19937 rng(1234);
  auto x = random_vec(static_cast<size_t>(d.n) * d.c * d.h * d.w, 1.f, rng, t);
  auto w = random_vec(static_cast<size_t>(d.k) * cg * d.r * d.s, 1.f / std::sqrt(float(cg * d.r * d.s)), rng, t);
  auto bias = random_vec(d.k, 0.5f, rng, t);
  const size_t ny = static_cast<size_t>(d.n) * d.k * oh * ow;
  auto res = random_vec(ny, 1.f, rng, t);

  cpu::Conv2dParams p;
  p.n = d.n, p.c_in = d.c, p.h = d.h, p.w = d.w, p.c_out = d.k, p.kh = d.r, p.kw = d.s;
  p.stride_h = d.stride_h, p.stride_w = d.stride_w;
  p.pad_t = d.pad_t, p.pad_l = d.pad_l, p.pad_b = d.pad_b, p.pad_r = d.pad_r;
  p.dil_h = d.dil_h, p.dil_w = d.dil_w, p.groups = d.groups;
  std::vector<float> ref(ny);
  cpu::conv2d(p, x.data(), w.data(), d.has_bias ? bias.data() : nullptr, d.has_residual ? res.data() : nullptr, d.act,
              ref.data(), pool());
  float ref_max = 0.f;
  for (float v : ref) ref_max = std::max(ref_max, std::fabs(v));

  const size_t es = dtype_size(t);
  DevBuf dx(x.size() * es), dw(w.size() * es), db(bias.size() * es), dr(ny * es), dy(ny * es);
  upload(dx, nchw_to_nhwc(x, d.n, d.c, d.h, d.w), t);
  upload(dw, kcrs_to_krsc(w.data(), d.k, cg, d.r, d.s), t);
  upload(db, bias, t);
  upload(dr, nchw_to_nhwc(res, d.n, d.k, oh, ow), t);

  auto t0 = std::chrono::steady_clock::now();
  ConvOp op(handle(), d);
  EXPECT_GT(op.tactic_count(), 0);
  TacticCount count;
  float worst = 0.f;
  for (int i = 0; i < op.tactic_count(); ++i) {
    if (!op.try_select(i)) continue;
    ++count.built;
    count.variants += op.tactic_is_variant(i) ? 1 : 0;
    DevBuf ws(op.workspace_bytes());
    KILN_CUDA_CHECK(cudaMemset(dy.ptr(), 0xff, ny * es));  // NaN pattern: unwritten outputs fail
    op.run(handle(), dx.ptr(), dw.ptr(), d.has_bias ? db.ptr() : nullptr, d.has_residual ? dr.ptr() : nullptr, dy.ptr(), ws.ptr(), nullptr);
    KILN_CUDA_CHECK(cudaDeviceSynchronize());
    auto y = nhwc_to_nchw(download(dy, ny, t), d.n, d.k, oh, ow);
    if (!op.epilogue_fused()) {
      // The caller's job when cuDNN could not fuse: bias, residual, activation.
      const size_t plane = static_cast<size_t>(oh) * ow;
      for (size_t j = 0; j < ny; ++j) {
        float v = y[j];
        if (d.has_bias) v += bias[(j / plane) % d.k];
        if (d.has_residual) v += res[j];
        y[j] = apply_activation(d.act, v);
      }
    }
    float err = 0.f;  // normalized so that err <= tolerance passes
    for (size_t j = 0; j < ny; ++j) {
      float diff = std::fabs(y[j] - ref[j]);
      if (std::isnan(y[j])) diff = INFINITY;
      float e = t == DType::F32 ? diff / std::max(1.f, std::fabs(ref[j])) : diff / std::max(ref_max, 1e-6f);
      err = std::max(err, e);
    }
    const float tol = t == DType::F32 ? kTolF32 : t == DType::F16 ? kTolF16 : kTolBF16;
    EXPECT_LE(err, tol) << name << " tactic " << i << " " << op.tactic_name(i) << " [" << op.tactic_notes(i) << "]";
    if (err <= tol) ++count.passed;
    worst = std::max(worst, err);
  }
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("[conv] %-24s %-4s fused=%d tactics=%d built=%d variants=%d passed=%d worst=%.2e (%.2fs) default=%s\n",
              name.c_str(), dtype_name(t), op.epilogue_fused() ? 1 : 0, op.tactic_count(), count.built, count.variants,
              count.passed, worst, secs, op.tactic_name(0).c_str());
  std::fflush(stdout);
  return count;
}

// Switch conv_knobs: the knob variants of cuDNN's first engines (split-K,
// tiles, kernel configs) compute the same conv. Shapes where batch 1 leaves
// the SMs idle (RT-DETR's late stages, small); every variant that builds must
// match the reference, and the 3x3 convs must get some.
TEST(CudaConv, KnobVariantsMatchCpuReference) {
  KILN_REQUIRE_GPU();
  using A = Activation;
  const Case shapes[] = {
      {"knobs_3x3_c256_10x10_res", make(1, 256, 10, 10, 256, 3, 1, 1, 1, true, true, A::Relu)},
      {"knobs_3x3s2_c128_20x20", make(1, 128, 20, 20, 256, 3, 2, 1, 1, true, false, A::Relu)},
      {"knobs_1x1_c128_b2_silu", make(2, 128, 9, 11, 64, 1, 1, 0, 1, true, false, A::Silu)},
  };
  for (DType t : {DType::F16, DType::F32})
    for (const Case& c : shapes) {
      ConvDesc d = c.d;
      d.dtype = t;
      d.knob_variants = 24;
      const TacticCount n = check_every_tactic(c.name, d);
      EXPECT_EQ(n.passed, n.built) << c.name;
      if (c.d.r == 3 && t == DType::F16) EXPECT_GT(n.variants, 0) << c.name << ": no knob variant built";
    }
}

// A knob variant recorded in a bundle replays by its tag alone (no
// heuristics query), the same plan and the same bits.
TEST(CudaConv, KnobVariantsReplayFromTheirTags) {
  KILN_REQUIRE_GPU();
  ConvDesc d = make(1, 256, 10, 10, 256, 3, 1, 1, 1, true, true, Activation::Relu);
  d.dtype = DType::F16;
  std::mt19937 rng(5);
  const ConvIo io(d, rng);
  auto run = [&](const ConvOp& op) { return io.run(op, d.dtype); };
  ConvDesc with = d;
  with.knob_variants = 24;
  ConvOp op(handle(), with);
  int replayed = 0;
  for (int i = 0; i < op.tactic_count() && replayed < 4; ++i) {
    if (!op.tactic_is_variant(i) || !op.try_select(i)) continue;
    const std::string name = op.tactic_name(i);
    const auto expect = run(op);
    ConvOp replay(handle(), d, name);  // a load: no variants asked for
    EXPECT_EQ(replay.tactic_count(), 1) << name << " went through the heuristics query";
    EXPECT_EQ(replay.tactic_name(replay.selected()), name);
    EXPECT_EQ(run(replay), expect) << name;
    ++replayed;
  }
  EXPECT_GT(replayed, 0) << "no knob variant built";
}

TEST(CudaConv, KnobValuesCoverTheRangeInAtMostEight) {
  using V = std::vector<int64_t>;
  EXPECT_EQ(knob_values({17, 1, 4, 1}), (V{1, 2, 3, 4}));
  EXPECT_EQ(knob_values({17, -1, 1, 1}), (V{-1, 0, 1}));
  EXPECT_EQ(knob_values({24, 0, 63, 1}), (V{0, 1, 2, 4, 8, 16, 32, 63}));
  EXPECT_EQ(knob_values({17, 2, 20, 2}), (V{2, 4, 8, 16, 20}));  // the stride grid: 2, 4, 6, ...
  EXPECT_EQ(knob_values({17, 5, 5, 1}), (V{5}));
  EXPECT_EQ(knob_values({17, 0, 6, 0}), (V{0, 1, 2, 3, 4, 5, 6}));  // stride 0 counts as 1
  EXPECT_TRUE(knob_values({17, 4, 1, 1}).empty());
  for (const KnobRange& hostile : {KnobRange{17, INT64_MIN, INT64_MAX, 1}, KnobRange{17, INT64_MIN, INT64_MAX, INT64_MAX},
                                   KnobRange{17, 0, INT64_MAX, 3}, KnobRange{17, INT64_MIN, 0, -7}}) {
    const V v = knob_values(hostile);
    EXPECT_FALSE(v.empty());
    EXPECT_LE(v.size(), 8u);
    EXPECT_TRUE(std::is_sorted(v.begin(), v.end()));
    for (int64_t x : v) EXPECT_TRUE(x >= hostile.min && x <= hostile.max);
  }
  // Splits are searched at 1, 2, 4, 8 slices at most; other knobs over their whole range.
  EXPECT_EQ(knob_search_values({17, 1, 128, 1}, 8), (V{1, 2, 4, 8}));
  EXPECT_EQ(knob_search_values({39, 1, 3, 1}, 8), (V{1, 2, 3}));
  EXPECT_EQ(knob_search_values({17, 1, 128, 1}, 2), (V{1, 8}));
  EXPECT_EQ(knob_search_values({24, 0, 63, 1}, 8), knob_values({24, 0, 63, 1}, 8));
  // Split, tile and config knobs vary; the rest keep the heuristic's choice.
  for (int64_t k : {2, 17, 24, 37, 38, 39, 40, 41}) EXPECT_TRUE(knob_varies_work(k)) << k;
  for (int64_t k : {-1, 1, 3, 12, 14, 15, 44, 1000}) EXPECT_FALSE(knob_varies_work(k)) << k;
}

INSTANTIATE_TEST_SUITE_P(All, ConvTactics, testing::ValuesIn(params()), param_name);

TEST(CudaConv, KcrsToKrsc) {
  // k=2, c=3, r=1, s=2: w[k][c][0][x] = 100k + 10c + x.
  std::vector<float> w(12);
  for (int k = 0; k < 2; ++k)
    for (int c = 0; c < 3; ++c)
      for (int x = 0; x < 2; ++x) w[(k * 3 + c) * 2 + x] = 100.f * k + 10.f * c + x;
  auto o = kcrs_to_krsc(w.data(), 2, 3, 1, 2);
  for (int k = 0; k < 2; ++k)
    for (int x = 0; x < 2; ++x)
      for (int c = 0; c < 3; ++c) EXPECT_EQ(o[(k * 2 + x) * 3 + c], 100.f * k + 10.f * c + x);
}

TEST(CudaConv, CapturedGraphMatchesDirectRun) {
  KILN_REQUIRE_GPU();
  ConvDesc d = make(3, 64, 17, 13, 64, 3, 1, 1, 1, true, true, Activation::Relu);
  d.dtype = DType::F16;
  std::mt19937 rng(7);
  const ConvIo io(d, rng);
  const size_t ny = io.ny;
  const DevBuf &dx = io.x, &dw = io.w, &db = io.b, &dr = io.r, &dy = io.y;
  ConvOp op(handle(), d);
  DevBuf ws(op.workspace_bytes());
  cudaStream_t s;
  KILN_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  op.run(handle(), dx.ptr(), dw.ptr(), db.ptr(), dr.ptr(), dy.ptr(), ws.ptr(), s);
  KILN_CUDA_CHECK(cudaStreamSynchronize(s));
  auto direct = download(dy, ny, d.dtype);
  KILN_CUDA_CHECK(cudaMemset(dy.ptr(), 0, ny * 2));

  cudaGraph_t g;
  cudaGraphExec_t ge;
  KILN_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  op.run(handle(), dx.ptr(), dw.ptr(), db.ptr(), dr.ptr(), dy.ptr(), ws.ptr(), s);
  KILN_CUDA_CHECK(cudaStreamEndCapture(s, &g));
  KILN_CUDA_CHECK(cudaGraphInstantiate(&ge, g, 0));
  KILN_CUDA_CHECK(cudaGraphLaunch(ge, s));
  KILN_CUDA_CHECK(cudaStreamSynchronize(s));
  auto replayed = download(dy, ny, d.dtype);
  EXPECT_EQ(direct, replayed) << "tactic " << op.tactic_name(op.selected());
  cudaGraphExecDestroy(ge);
  cudaGraphDestroy(g);
  cudaStreamDestroy(s);
}

TEST(CudaConv, EngineTagsParseAsTheFrontendWritesThem) {
  auto t = parse_engine_tag("eng12_k2=3_k13=1");
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->engine, 12);
  ASSERT_EQ(t->knobs.size(), 2u);
  EXPECT_EQ(t->knobs[0], (std::pair<int64_t, int64_t>{2, 3}));
  EXPECT_EQ(t->knobs[1], (std::pair<int64_t, int64_t>{13, 1}));
  t = parse_engine_tag("eng0");
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->engine, 0);
  EXPECT_TRUE(t->knobs.empty());
  t = parse_engine_tag("eng7_k5=-1");
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->knobs.at(0), (std::pair<int64_t, int64_t>{5, -1}));
  // kiln's own tactics, truncated and hostile strings: no replay (the heuristics query decides).
  for (const char* bad : {"", "eng", "engx", "eng-1", "eng12_", "eng12_k", "eng12_k2", "eng12_k2=", "eng12_k2=3_",
                          "eng12_k2=3x", "eng12_k9999=1", "eng12_k2=3_k2=4", "eng1234567890123456789", "eng12 k2=3",
                          "depthwise", "window_nt2_w4", "Eng12", "eng12_k2=--1", "eng12_k2=3\n"})
    EXPECT_FALSE(parse_engine_tag(bad).has_value()) << bad;
}

// A bundle's load builds each conv's recorded tactic by engine id and knobs,
// without the heuristics query: the same plan (name, outputs) as the build
// picked, one candidate. A tag that cannot replay falls back to the query.
TEST(CudaConv, RecordedTacticReplaysWithoutTheHeuristicsQuery) {
  KILN_REQUIRE_GPU();
  for (DType t : {DType::F16, DType::F32}) {
    for (ConvDesc d : {make(2, 64, 17, 13, 64, 3, 1, 1, 1, true, true, Activation::Relu),
                       make(1, 32, 9, 11, 48, 1, 2, 0, 1, true, false, Activation::None)}) {
      d.dtype = t;
      std::mt19937 rng(11);
      const ConvIo io(d, rng);
      auto run = [&](const ConvOp& op) { return io.run(op, t); };
      ConvOp queried(handle(), d);
      ASSERT_GT(queried.tactic_count(), 1) << "the test wants several candidates to replay";
      const std::string heuristic = queried.tactic_name(queried.selected());
      int replayed = 0;
      for (int i = 0; i < queried.tactic_count() && replayed < 3; ++i) {
        if (!queried.try_select(i)) continue;
        const std::string name = queried.tactic_name(i);
        const auto expect = run(queried);
        ConvOp replay(handle(), d, name);
        EXPECT_EQ(replay.tactic_count(), 1) << name << " went through the heuristics query";
        EXPECT_EQ(replay.tactic_name(replay.selected()), name);
        EXPECT_EQ(replay.epilogue_fused(), queried.epilogue_fused()) << name;
        EXPECT_EQ(run(replay), expect) << name;
        ++replayed;
      }
      EXPECT_GT(replayed, 0);
      // A recorded name that is no engine config of this graph: the query runs.
      for (const char* other : {"eng999999_k2=1", "not_a_tag"}) {
        ConvOp fallback(handle(), d, other);
        EXPECT_EQ(fallback.tactic_count(), queried.tactic_count()) << other;
        EXPECT_EQ(fallback.tactic_name(fallback.selected()), heuristic) << other;
      }
    }
  }
}

// Channel windows (Res2Net on the CUDA backend): x is channels [xo, xo+c) of
// a buffer with `xw` channels per pixel, y goes to [yo, yo+k) of one with `yw`.
// Every tactic that builds for the strided form must match the CPU reference
// on the window and leave the other channels of y's buffer untouched.
TEST(CudaConv, StridedWindowsEveryTactic) {
  KILN_REQUIRE_GPU();
  struct W {
    int c, xw, xo, k, yw, yo, stride;
  };
  const W windows[] = {{32, 128, 32, 32, 128, 64, 1}, {32, 128, 96, 32, 128, 0, 2}, {28, 112, 28, 28, 112, 56, 1}};
  for (DType t : {DType::F32, DType::F16, DType::BF16})
    for (const W& win : windows) {
      ConvDesc d = make(2, win.c, 11, 9, win.k, 3, win.stride, 1, 1, true, false, Activation::Relu);
      d.dtype = t;
      d.x_stride = win.xw, d.y_stride = win.yw;
      const int oh = d.out_h(), ow = d.out_w();
      const size_t px_in = size_t(d.n) * d.h * d.w, px_out = size_t(d.n) * oh * ow;
      std::mt19937 rng(99);
      auto xwide = random_vec(px_in * win.xw, 1.f, rng, t);  // NHWC, wide
      auto w = random_vec(size_t(d.k) * d.c * 9, 1.f / std::sqrt(float(d.c * 9)), rng, t);
      auto bias = random_vec(d.k, 0.5f, rng, t);
      auto yinit = random_vec(px_out * win.yw, 1.f, rng, t);
      std::vector<float> xdense(px_in * d.c);
      for (size_t p = 0; p < px_in; ++p)
        for (int ch = 0; ch < d.c; ++ch) xdense[p * d.c + ch] = xwide[p * win.xw + win.xo + ch];
      cpu::Conv2dParams cp;
      cp.n = d.n, cp.c_in = d.c, cp.h = d.h, cp.w = d.w, cp.c_out = d.k, cp.kh = cp.kw = 3;
      cp.stride_h = cp.stride_w = d.stride_h, cp.pad_t = cp.pad_l = cp.pad_b = cp.pad_r = 1;
      std::vector<float> ref(px_out * d.k);
      cpu::conv2d(cp, nhwc_to_nchw(xdense, d.n, d.c, d.h, d.w).data(), w.data(), bias.data(), nullptr, d.act, ref.data(),
                  pool());
      ref = nchw_to_nhwc(ref, d.n, d.k, oh, ow);
      float ref_max = 0.f;
      for (float v : ref) ref_max = std::max(ref_max, std::fabs(v));
      const size_t es = dtype_size(t);
      DevBuf dx(xwide.size() * es), dw(w.size() * es), db(bias.size() * es), dy(yinit.size() * es);
      upload(dx, xwide, t);
      upload(dw, kcrs_to_krsc(w.data(), d.k, d.c, 3, 3), t);
      upload(db, bias, t);
      ConvOp op(handle(), d);
      const std::string what = std::string(dtype_name(t)) + " c" + std::to_string(d.c) + "@" + std::to_string(win.xo) +
                               "/" + std::to_string(win.xw) + " -> @" + std::to_string(win.yo) + "/" +
                               std::to_string(win.yw) + " s" + std::to_string(win.stride);
      EXPECT_TRUE(op.epilogue_fused()) << what << ": the strided form must fuse bias + relu (views depend on it)";
      int built = 0;
      for (int i = 0; i < op.tactic_count(); ++i) {
        if (!op.try_select(i)) continue;
        ++built;
        DevBuf ws(op.workspace_bytes());
        upload(dy, yinit, t);
        op.run(handle(), static_cast<char*>(dx.ptr()) + win.xo * es, dw.ptr(), db.ptr(), nullptr,
               static_cast<char*>(dy.ptr()) + win.yo * es, ws.ptr(), nullptr);
        KILN_CUDA_CHECK(cudaDeviceSynchronize());
        const auto y = download(dy, yinit.size(), t);
        float err = 0.f;
        size_t touched = 0;
        for (size_t p = 0; p < px_out; ++p)
          for (int ch = 0; ch < win.yw; ++ch) {
            const float got = y[p * win.yw + ch];
            if (ch >= win.yo && ch < win.yo + d.k) {
              const float want = ref[p * d.k + ch - win.yo];
              const float diff = std::isnan(got) ? INFINITY : std::fabs(got - want);
              err = std::max(err, t == DType::F32 ? diff / std::max(1.f, std::fabs(want)) : diff / std::max(ref_max, 1e-6f));
            } else if (!(got == yinit[p * win.yw + ch])) {
              ++touched;
            }
          }
        const float tol = t == DType::F32 ? kTolF32 : t == DType::F16 ? kTolF16 : kTolBF16;
        EXPECT_LE(err, tol) << what << " tactic " << op.tactic_name(i);
        EXPECT_EQ(touched, 0u) << what << " tactic " << op.tactic_name(i) << " wrote outside its window";
      }
      std::printf("[conv strided] %s tactics=%d built=%d\n", what.c_str(), op.tactic_count(), built);
      EXPECT_GT(built, 0) << what;
    }
}

// Median of 20 timed runs of the selected tactic, in microseconds.
float time_selected(ConvOp& op, void* x, void* w, void* b, void* r, void* y, void* ws, cudaStream_t s) {
  constexpr int kRuns = 20;
  cudaEvent_t ev[kRuns + 1];
  for (auto& e : ev) KILN_CUDA_CHECK(cudaEventCreate(&e));
  for (int i = 0; i < 3; ++i) op.run(handle(), x, w, b, r, y, ws, s);
  KILN_CUDA_CHECK(cudaEventRecord(ev[0], s));
  for (int i = 0; i < kRuns; ++i) {
    op.run(handle(), x, w, b, r, y, ws, s);
    KILN_CUDA_CHECK(cudaEventRecord(ev[i + 1], s));
  }
  KILN_CUDA_CHECK(cudaEventSynchronize(ev[kRuns]));
  std::vector<float> t(kRuns);
  for (int i = 0; i < kRuns; ++i) KILN_CUDA_CHECK(cudaEventElapsedTime(&t[i], ev[i], ev[i + 1]));
  for (auto& e : ev) cudaEventDestroy(e);
  std::sort(t.begin(), t.end());
  return t[kRuns / 2] * 1000.f;
}

TEST(CudaConvPerf, ResNet50AndEfficientNetShapes) {
  KILN_REQUIRE_GPU();
  struct Shape {
    const char* name;
    ConvDesc d;
    DType t = DType::F16;
  };
  using A = Activation;
  std::vector<Shape> shapes = {
      {"3x3 64->64 56x56 +b relu", make(1, 64, 56, 56, 64, 3, 1, 1, 1, true, false, A::Relu)},
      {"1x1 256->64 56x56 +b relu", make(1, 256, 56, 56, 64, 1, 1, 0, 1, true, false, A::Relu)},
      {"1x1 64->256 56x56 +b+res relu", make(1, 64, 56, 56, 256, 1, 1, 0, 1, true, true, A::Relu)},
      {"7x7s2 3->64 224x224 +b relu", make(1, 3, 224, 224, 64, 7, 2, 3, 1, true, false, A::Relu)},
      {"dw3x3 144 56x56 +b silu (effnet)", make(1, 144, 56, 56, 144, 3, 1, 1, 144, true, false, A::Silu)},
      // The stem with its 3 input channels zero-padded (host side) to 4 and 8: does alignment pay?
      {"7x7s2 4(3+pad)->64 224x224 +b relu", make(1, 4, 224, 224, 64, 7, 2, 3, 1, true, false, A::Relu)},
      {"7x7s2 8(3+pad)->64 224x224 +b relu", make(1, 8, 224, 224, 64, 7, 2, 3, 1, true, false, A::Relu)},
      {"dw5x5s2 240 28x28 +b silu (effnet)", make(1, 240, 28, 28, 240, 5, 2, 2, 240, true, false, A::Silu)},
      {"dw3x3 144 56x56 +b silu", make(1, 144, 56, 56, 144, 3, 1, 1, 144, true, false, A::Silu), DType::BF16},
      {"3x3 64->64 56x56 +b relu", make(1, 64, 56, 56, 64, 3, 1, 1, 1, true, false, A::Relu), DType::F32},
  };
  constexpr size_t kWsCap = size_t(256) << 20;
  DevBuf ws(kWsCap);
  cudaStream_t s;
  KILN_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  std::printf("[perf] %-36s %-4s %5s %5s %3s %8s %8s %10s %-28s %10s %-28s\n", "shape (NHWC)", "type", "batch",
              "tacs", "fus", "build_ms", "tune_ms", "default_us", "default", "tuned_us", "tuned");
  std::mt19937 rng(3);
  for (int batch : {1, 32}) {
    for (auto sh : shapes) {
      ConvDesc d = sh.d;
      d.n = batch;
      d.dtype = sh.t;
      const ConvIo io(d, rng);
      auto t0 = std::chrono::steady_clock::now();
      ConvOp op(handle(), d);
      auto t1 = std::chrono::steady_clock::now();
      void* r = io.res();
      int def = op.selected();
      float def_us = time_selected(op, io.x.ptr(), io.w.ptr(), io.b.ptr(), r, io.y.ptr(), ws.ptr(), s);
      std::string def_name = op.tactic_name(def);
      auto t2 = std::chrono::steady_clock::now();
      int best = op.autotune(handle(), io.x.ptr(), io.w.ptr(), io.b.ptr(), r, io.y.ptr(), ws.ptr(), kWsCap, s, 64);
      auto t3 = std::chrono::steady_clock::now();
      auto ms = [](auto a, auto b) { return std::chrono::duration<double, std::milli>(b - a).count(); };
      float best_us = time_selected(op, io.x.ptr(), io.w.ptr(), io.b.ptr(), r, io.y.ptr(), ws.ptr(), s);
      std::printf("[perf] %-36s %-4s %5d %5d %3d %8.0f %8.0f %10.1f %-28s %10.1f %-28s\n", sh.name, dtype_name(d.dtype),
                  batch, op.tactic_count(), op.epilogue_fused() ? 1 : 0, ms(t0, t1), ms(t2, t3), def_us,
                  def_name.c_str(), best_us, op.tactic_name(best).c_str());
      std::fflush(stdout);
    }
  }
  cudaStreamDestroy(s);
}

}  // namespace

// Switch conv_knobs on RT-DETR v2 r18vd's conv shapes at 640x640 (batch 1
// unless b8): cuDNN's heuristics list timed in full, then with knob variants;
// each engine's knob ranges printed once. Timings printed, never asserted.
//   kiln_gpu_tests --gtest_filter='CudaConvPerf.KnobVariants*'
TEST(CudaConvPerf, KnobVariantsOnRtDetrShapes) {
  KILN_REQUIRE_GPU();
  using A = Activation;
  const Case shapes[] = {
      {"stem.0 640 c3 k32 s2", make(1, 3, 640, 640, 32, 3, 2, 1, 1, true, false, A::Relu)},
      {"stem.1 320 c32 k32", make(1, 32, 320, 320, 32, 3, 1, 1, 1, true, false, A::Relu)},
      {"stem.2 320 c32 k64", make(1, 32, 320, 320, 64, 3, 1, 1, 1, true, false, A::Relu)},
      {"stage0 160 c64 +res", make(1, 64, 160, 160, 64, 3, 1, 1, 1, true, true, A::Relu)},
      {"stage1.0 160->80 c64 k128", make(1, 64, 160, 160, 128, 3, 2, 1, 1, true, false, A::Relu)},
      {"stage1 80 c128 +res", make(1, 128, 80, 80, 128, 3, 1, 1, 1, true, true, A::Relu)},
      {"stage2.0 80->40 c128 k256", make(1, 128, 80, 80, 256, 3, 2, 1, 1, true, false, A::Relu)},
      {"stage2 40 c256 +res", make(1, 256, 40, 40, 256, 3, 1, 1, 1, true, true, A::Relu)},
      {"stage3.0 40->20 c256 k512", make(1, 256, 40, 40, 512, 3, 2, 1, 1, true, false, A::Relu)},
      {"stage3 20 c512", make(1, 512, 20, 20, 512, 3, 1, 1, 1, true, false, A::Relu)},
      {"stage3 20 c512 +res", make(1, 512, 20, 20, 512, 3, 1, 1, 1, true, true, A::Relu)},
      {"repvgg 80 c128 silu", make(1, 128, 80, 80, 128, 3, 1, 1, 1, true, false, A::Silu)},
      {"repvgg 40 c128 silu", make(1, 128, 40, 40, 128, 3, 1, 1, 1, true, false, A::Silu)},
      {"csp 1x1 80 c256 k128", make(1, 256, 80, 80, 128, 1, 1, 0, 1, true, false, A::Silu)},
      {"downsample 80->40 c256", make(1, 256, 80, 80, 256, 3, 2, 1, 1, true, false, A::Silu)},
      {"b8 stage3 20 c512 +res", make(8, 512, 20, 20, 512, 3, 1, 1, 1, true, true, A::Relu)},
  };
  constexpr size_t kWsCap = size_t(256) << 20;
  DevBuf ws(kWsCap);
  cudaStream_t s;
  KILN_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  std::mt19937 rng(9);
  std::printf("[knobs] %-28s %5s %8s %-40s %8s %-40s %8s %-40s %8s %8s\n", "conv", "tacs", "heur_us", "heuristic",
              "list_us", "best of list", "var_us", "best variant", "graph1", "graph2");
  for (const Case& c : shapes) {
    ConvDesc d = c.d;
    d.dtype = DType::F16;
    d.knob_variants = 64;
    const ConvIo io(d, rng);
    void* r = io.res();
    ConvOp op(handle(), d);
    const int heuristic = op.selected();
    op.autotune(handle(), io.x.ptr(), io.w.ptr(), io.b.ptr(), r, io.y.ptr(), ws.ptr(), kWsCap, s, 1 << 20);
    int best_list = -1, best_var = -1;
    for (int i = 0; i < op.tactic_count(); ++i) {
      const float us = op.tuned_time_us(i);
      if (us < 0) continue;
      int& best = op.tactic_is_variant(i) ? best_var : best_list;
      if (best < 0 || us < op.tuned_time_us(best)) best = i;
    }
    auto graph_time = [&](int i) {
      if (i < 0 || !op.try_select(i)) return 0.0;
      return test::graph_us(s, [&] { op.run(handle(), io.x.ptr(), io.w.ptr(), io.b.ptr(), r, io.y.ptr(), ws.ptr(), s); });
    };
    auto name = [&](int i) { return i < 0 ? std::string("-") : op.tactic_name(i); };
    auto us = [&](int i) { return i < 0 ? 0.f : op.tuned_time_us(i); };
    const double g_list = graph_time(best_list), g_var = graph_time(best_var);
    std::printf("[knobs] %-28s %5d %8.2f %-40s %8.2f %-40s %8.2f %-40s %8.2f %8.2f\n", c.name.c_str(),
                op.tactic_count(), us(heuristic), name(heuristic).c_str(), us(best_list), name(best_list).c_str(),
                us(best_var), name(best_var).c_str(), g_list, g_var);
    std::set<int64_t> engines;
    for (int i = 0; i < op.tactic_count(); ++i) {
      const auto tag = parse_engine_tag(op.tactic_name(i));
      if (tag && engines.insert(tag->engine).second)
        std::printf("[knobs]   eng%lld: %s\n", static_cast<long long>(tag->engine), op.engine_knobs(i).c_str());
    }
    std::fflush(stdout);
  }
  cudaStreamDestroy(s);
}


// A wide sweep of the knob variants on three r18vd convs (every kernel
// config, split-K on powers of two): which values win, to choose what
// conv_knobs samples. Timings printed (fastest 24), never asserted.
//   kiln_gpu_tests --gtest_filter='CudaConvPerf.KnobSweep'
TEST(CudaConvPerf, KnobSweep) {
  KILN_REQUIRE_GPU();
  using A = Activation;
  const Case shapes[] = {
      {"stage3 20 c512 +res", make(1, 512, 20, 20, 512, 3, 1, 1, 1, true, true, A::Relu)},
      {"repvgg 40 c128 silu", make(1, 128, 40, 40, 128, 3, 1, 1, 1, true, false, A::Silu)},
      {"stem.2 320 c32 k64", make(1, 32, 320, 320, 64, 3, 1, 1, 1, true, false, A::Relu)},
  };
  constexpr size_t kWsCap = size_t(256) << 20;
  DevBuf ws(kWsCap);
  cudaStream_t s;
  KILN_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  std::mt19937 rng(10);
  for (const Case& c : shapes) {
    ConvDesc d = c.d;
    d.dtype = DType::F16;
    d.knob_variants = 400, d.knob_samples = 64;
    const ConvIo io(d, rng);
    void* r = io.res();
    const auto t0 = std::chrono::steady_clock::now();
    ConvOp op(handle(), d);
    const int heuristic = op.selected();
    op.autotune(handle(), io.x.ptr(), io.w.ptr(), io.b.ptr(), r, io.y.ptr(), ws.ptr(), kWsCap, s, 1 << 20);
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::vector<std::pair<float, int>> timed;
    for (int i = 0; i < op.tactic_count(); ++i)
      if (op.tuned_time_us(i) >= 0) timed.emplace_back(op.tuned_time_us(i), i);
    std::sort(timed.begin(), timed.end());
    std::printf("[sweep] %s: %d tactics, %zu timed, %.1f s; heuristic %s %.2f us\n", c.name.c_str(), op.tactic_count(),
                timed.size(), secs, op.tactic_name(heuristic).c_str(), op.tuned_time_us(heuristic));
    for (size_t k = 0; k < std::min<size_t>(timed.size(), 24); ++k)
      std::printf("[sweep]   %8.2f %s%s\n", timed[k].first, op.tactic_name(timed[k].second).c_str(),
                  op.tactic_is_variant(timed[k].second) ? "" : " (heuristics list)");
    std::fflush(stdout);
  }
  cudaStreamDestroy(s);
}

}  // namespace kiln::cuda
