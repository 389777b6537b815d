// kiln's GEMM conv (gemm_conv.hpp: im2col + a cuBLASLt GEMM with bias, ReLU
// and the residual in its epilogue) against the CPU reference conv, with
// every algorithm cuBLASLt's heuristic offers: RT-DETR v2 r18vd's conv kinds
// at small sizes (basic blocks with residual + ReLU, stride-2 3x3s, the
// encoder's 1x1 and 3x3 with SiLU), 1x1 convs read in place and 1x1 convs
// that need an im2col (stride, padding), batches, odd sizes, dilation, and
// channel counts that take every copy width of the im2col (16, 8, 4 bytes and
// single 16-bit elements), in f32, f16 and bf16. Without a GPU: the tactic
// names round trip and the eligibility rule. End to end: a tactic cache
// naming a gemm_conv algorithm for every conv makes a build take them, the
// bundle replays them, and a record naming an algorithm cuBLASLt does not
// offer fails the load naming the conv.
//   kiln_gpu_tests --gtest_filter='GemmConvRules.*:CudaGemmConv.*'
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "../unit/graph_test_util.hpp"
#include "backends/cuda/device_buffer.hpp"
#include "backends/cuda/gemm_conv.hpp"
#include "backends/cuda/tactics.hpp"
#include "bundle/builder.hpp"
#include "bundle/bundle.hpp"
#include "conv_reference.hpp"
#include "core/error.hpp"
#include "core/npy.hpp"
#include "cuda_test_util.hpp"
#include "tactic_cache_build.hpp"
#include "kiln/kiln.hpp"

namespace kiln::cuda::test {
namespace {

struct Case {
  int n, h, w, c, k, r, stride, pad, dil;
  bool residual;
  Activation act;
};

ConvDesc desc_of(const Case& k, DType dt) {
  ConvDesc d;
  d.dtype = dt, d.n = k.n, d.c = k.c, d.h = k.h, d.w = k.w, d.k = k.k, d.r = d.s = k.r;
  d.stride_h = d.stride_w = k.stride, d.pad_t = d.pad_l = d.pad_b = d.pad_r = k.pad, d.dil_h = d.dil_w = k.dil;
  d.has_bias = true, d.has_residual = k.residual, d.act = k.act;
  return d;
}

std::string describe(const Case& k, DType dt) {
  return cat(dtype_name(dt), " n", k.n, " ", k.h, "x", k.w, " c", k.c, " -> k", k.k, " ", k.r, "x", k.r, " s", k.stride,
             " p", k.pad, " d", k.dil, k.residual ? " +res" : "", " ", activation_name(k.act));
}

const Case kCases[] = {
    // r18vd's basic blocks (residual + ReLU), the stem's stride-2 conv, a stage's stride-2 entry.
    {1, 20, 20, 64, 64, 3, 1, 1, 1, true, Activation::Relu},
    {1, 5, 5, 512, 512, 3, 1, 1, 1, true, Activation::Relu},
    {1, 34, 34, 8, 32, 3, 2, 1, 1, false, Activation::Relu},
    {1, 9, 9, 256, 512, 3, 2, 1, 1, false, Activation::Relu},
    // The encoder: 1x1 (x read in place) and 3x3 with SiLU, a 1x1 projection without activation.
    {1, 10, 10, 256, 128, 1, 1, 0, 1, false, Activation::Silu},
    {1, 10, 10, 128, 128, 3, 1, 1, 1, false, Activation::Silu},
    {1, 6, 6, 256, 256, 1, 1, 0, 1, true, Activation::None},
    // 1x1 convs that need an im2col: stride 2; padding.
    {2, 9, 7, 32, 16, 1, 2, 0, 1, true, Activation::Relu},
    {1, 5, 6, 16, 24, 1, 1, 1, 1, false, Activation::None},
    // Batches, odd sizes, dilation, 5x5, GELU / sigmoid / ReLU6 after the GEMM.
    {2, 7, 9, 24, 40, 3, 1, 1, 1, true, Activation::Gelu},
    {3, 5, 11, 8, 24, 1, 1, 0, 1, false, Activation::Relu6},
    {2, 9, 7, 16, 8, 5, 1, 2, 1, false, Activation::Sigmoid},
    {1, 13, 10, 48, 136, 3, 2, 2, 2, true, Activation::Relu},
    // Channel counts off 8: the im2col copies 4 bytes, 2 bytes, 8 bytes at a time (f16), odd k.
    {1, 16, 15, 3, 12, 7, 2, 3, 1, false, Activation::Relu},
    {2, 8, 9, 13, 13, 3, 1, 1, 1, true, Activation::Relu},
    {1, 7, 7, 6, 10, 3, 1, 1, 1, false, Activation::Silu},
    {1, 7, 7, 12, 16, 3, 1, 0, 1, true, Activation::None},
};

TEST(GemmConvRules, TacticNamesRoundTrip) {
  const std::string algo = "cublasLt algo 21 tile 7 stages 13 splitk 4 red 1 swizzle 0 custom 0 cluster 0";
  const std::string name = gemm_conv_tactic_name(algo);
  EXPECT_EQ(name, "kiln gemm_conv " + algo);
  EXPECT_EQ(parse_gemm_conv_tactic(name), algo);
  // The selector's record strips fusion notes (" x", " +") from a recorded name: this one has none.
  EXPECT_EQ(recorded_tactic_name(name), name);
  for (const char* other : {"", "kiln gemm_conv ", "kiln gemm_conv", "kiln igemm 64x64 s2", "eng12_k2=3", "kiln depthwise",
                            "cublasLt algo 21 tile 7", " kiln gemm_conv cublasLt algo 1"})
    EXPECT_EQ(parse_gemm_conv_tactic(other), std::nullopt) << "'" << other << "'";
}

TEST(GemmConvRules, TakesDenseGroupsOneFloatConvs) {
  for (DType dt : kFloatTypes) EXPECT_EQ(gemm_conv_unsupported(desc_of(kCases[0], dt)), "") << dtype_name(dt);
  ConvDesc d = desc_of(kCases[0], DType::F16);
  EXPECT_FALSE(gemm_conv_in_place(d));
  EXPECT_EQ(gemm_conv_cols_bytes(d), size_t(20 * 20) * 9 * 64 * 2);
  const ConvDesc one = desc_of(kCases[4], DType::F16);
  EXPECT_TRUE(gemm_conv_in_place(one));
  EXPECT_EQ(gemm_conv_cols_bytes(one), 0u);
  EXPECT_FALSE(gemm_conv_in_place(desc_of(kCases[7], DType::F16)));  // 1x1 stride 2
  EXPECT_FALSE(gemm_conv_in_place(desc_of(kCases[8], DType::F16)));  // 1x1 padded
  d.x_stride = d.c, d.y_stride = d.k;  // strides equal to the channels: dense
  EXPECT_EQ(gemm_conv_unsupported(d), "");
  auto refused = [](ConvDesc e, const char* why) {
    EXPECT_NE(gemm_conv_unsupported(e).find(why), std::string::npos) << gemm_conv_unsupported(e) << " | want " << why;
  };
  ConvDesc e = desc_of(kCases[0], DType::F16);
  refused((e.groups = 2, e), "groups 2");
  e = desc_of(kCases[0], DType::F16), e.x_stride = 96;
  refused(e, "pixel strides x 96");
  e = desc_of(kCases[0], DType::F16), e.y_stride = 128;
  refused(e, "pixel strides x 0 y 128");
  refused(desc_of(kCases[0], DType::F8E4M3), "dtype f8e4m3");
  e = desc_of(kCases[0], DType::F32), e.fp8 = true;
  refused(e, "8-bit");
  e = desc_of(kCases[0], DType::F16), e.h = e.w = 1, e.pad_t = e.pad_l = e.pad_b = e.pad_r = 0;
  refused(e, "empty");
  // r18vd's stem at 640x640, batch 8: a 472 MB im2col matrix; batch 1 (59 MB) is taken.
  e = desc_of({8, 320, 320, 32, 32, 3, 1, 1, 1, false, Activation::Relu}, DType::F16);
  refused(e, "im2col matrix of 471859200 bytes");
  e.n = 1;
  EXPECT_EQ(gemm_conv_unsupported(e), "");
}

TEST(CudaGemmConv, OpRefusesWhatTheRuleRefuses) {
  KILN_REQUIRE_GPU();
  CublasLtHandle lt;
  ConvDesc d = desc_of(kCases[0], DType::F16);
  d.groups = 2;
  try {
    GemmConvOp op(lt.h, d);
    ADD_FAILURE() << "a grouped conv was taken";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("groups 2"), std::string::npos) << e.what();
  }
}

// Every algorithm of one case and type against the CPU reference conv.
void check_case(cublasLtHandle_t lt, const Case& k, DType dt) {
  const std::string what = describe(k, dt);
  const ConvDesc d = desc_of(k, dt);
  ASSERT_EQ(gemm_conv_unsupported(d), "") << what;
  GemmConvOp op(lt, d);
  ASSERT_GE(op.tactic_count(), 1) << what;
  const int64_t in_px = int64_t(k.n) * k.h * k.w, out_px = int64_t(k.n) * d.out_h() * d.out_w();
  const auto x = round_all(random_values(size_t(in_px) * k.c, 41), dt);
  const float wscale = 1.f / std::sqrt(float(k.c * k.r * k.r));
  const auto wk = round_all(random_values(size_t(k.k) * k.c * k.r * k.r, 42, -wscale, wscale), dt);  // KRSC
  const auto bias = round_all(random_values(size_t(k.k), 43, -0.5f, 0.5f), dt);
  const auto resid = round_all(random_values(size_t(out_px) * k.k, 44, -1.f, 1.f), dt);
  const std::vector<float> ref = reference_conv_nhwc({k.n, k.h, k.w, k.c, k.k, k.r, k.stride, k.pad, k.dil, k.act}, dt, x,
                                                     {}, wk, bias, k.residual ? resid : std::vector<float>{});
  float ref_max = 0.f;
  for (float v : ref) ref_max = std::max(ref_max, std::fabs(v));
  // f32 (fp32 compute, no TF32): op order only; f16: max|d| <= 5e-3 * max|ref| (f32 accumulation,
  // one rounding of the output, two with an activation after the GEMM); bf16: 3e-2.
  const double tol = (dt == DType::F32 ? 1e-4 : dt == DType::F16 ? 5e-3 : 3e-2) * std::max(1.f, ref_max);
  const auto dx = upload(x, dt), dw = upload(wk, dt), db = upload(bias, dt), dr = upload(resid, dt);
  for (int t = 0; t < op.tactic_count(); ++t) {
    op.select(t);
    const DevBuf ws(op.workspace_bytes());
    const auto dy = alloc(size_t(out_px) * k.k, dt);  // NaN poison
    op.run(dx->ptr(), dw->ptr(), db->ptr(), k.residual ? dr->ptr() : nullptr, dy->ptr(), ws.ptr(), op.workspace_bytes(),
           nullptr);
    const auto got = download(dy->ptr(), ref.size(), dt);
    double worst = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      const double e = std::fabs(double(got[i]) - ref[i]);
      worst = std::isnan(e) ? INFINITY : std::max(worst, e);
    }
    EXPECT_LE(worst, tol) << what << " | " << op.step_name();
  }
  // The residual is C, not D: it is read, never written.
  EXPECT_EQ(download(dr->ptr(), resid.size(), dt), resid) << what;
}

TEST(CudaGemmConv, EveryAlgorithmMatchesCpuReference) {
  KILN_REQUIRE_GPU();
  CublasLtHandle lt;
  for (DType dt : kFloatTypes)
    for (const Case& k : kCases) check_case(lt.h, k, dt);
}

TEST(CudaGemmConv, Im2colIsTheTapMajorPatchMatrix) {
  KILN_REQUIRE_GPU();
  // Small integers survive every type exactly: the copy is compared bit for bit.
  for (DType dt : kFloatTypes)
    for (int c : {1, 2, 3, 4, 6, 8, 12, 16, 24}) {
      const Im2colShape s{2, 5, 4, c, 3, 2, 3, 3, 2, 1, 1, 0, 1, 2};  // 3x2 taps, stride 2x1, pads 1/0, dilation 1x2
      std::vector<float> x(size_t(s.n) * s.h * s.w * c);
      for (size_t i = 0; i < x.size(); ++i) x[i] = float(i % 200) + 1.f;
      const auto dx = upload(x, dt);
      const size_t rows = size_t(s.n) * s.out_h * s.out_w, cols = size_t(s.r) * s.s * c;
      const auto dc = alloc(rows * cols, dt);
      im2col_nhwc(dx->ptr(), dc->ptr(), dt, s, nullptr);
      const auto got = download(dc->ptr(), rows * cols, dt);
      std::vector<float> want(rows * cols, 0.f);
      for (size_t m = 0; m < rows; ++m)
        for (int i = 0; i < s.r; ++i)
          for (int j = 0; j < s.s; ++j) {
            const int b = int(m) / (s.out_h * s.out_w), oy = int(m) / s.out_w % s.out_h, ox = int(m) % s.out_w;
            const int iy = oy * s.stride_h - s.pad_t + i * s.dil_h, ix = ox * s.stride_w - s.pad_l + j * s.dil_w;
            if (iy < 0 || iy >= s.h || ix < 0 || ix >= s.w) continue;
            for (int ch = 0; ch < c; ++ch)
              want[m * cols + size_t(i * s.s + j) * c + ch] = x[((size_t(b) * s.h + iy) * s.w + ix) * c + ch];
          }
      EXPECT_EQ(got, want) << dtype_name(dt) << " c" << c;
    }
}

}  // namespace
}  // namespace kiln::cuda::test

namespace kiln {
namespace {

namespace fs = std::filesystem;

// The ConvDesc a conv's tactic-cache signature (conv.cpp's conv_signature) describes.
cuda::ConvDesc desc_of_signature(const std::string& sig) {
  cuda::ConvDesc d;
  d.dtype = DType::F16;
  int kc = 0;
  EXPECT_EQ(std::sscanf(sig.c_str(), "conv f16 [%d,%d,%d,%d] [%d,%d,%d,%d]", &d.n, &d.c, &d.h, &d.w, &d.k, &kc, &d.r, &d.s), 8)
      << sig;
  auto attr = [&](const std::string& key) {
    const size_t at = sig.find(" " + key + "=");
    EXPECT_NE(at, std::string::npos) << key << " in " << sig;
    return at == std::string::npos ? 0 : std::stoi(sig.substr(at + key.size() + 2));
  };
  d.stride_h = attr("stride_h"), d.stride_w = attr("stride_w"), d.dil_h = attr("dil_h"), d.dil_w = attr("dil_w");
  d.pad_t = attr("pad_t"), d.pad_l = attr("pad_l"), d.pad_b = attr("pad_b"), d.pad_r = attr("pad_r");
  d.groups = attr("groups"), d.has_bias = attr("bias"), d.has_residual = attr("residual");
  d.act = static_cast<Activation>(attr("act")), d.allow_tf32 = attr("tf32");
  d.x_stride = attr("x_stride"), d.y_stride = attr("y_stride");
  return d;
}

std::pair<std::string, nlohmann::json> tactics_section(const Bundle& bundle) {
  for (const auto& s : bundle.section_names())
    if (s.rfind("tactics.", 0) == 0) return {s, nlohmann::json::parse(bundle.section_text(s))};
  return {"", nlohmann::json()};
}

// The GEMM conv end to end (switch gemm_conv on): a tactic cache naming the
// first heuristic algorithm for every conv signature the GEMM conv takes makes
// the build take it (the cache is the build's second source after the bundle),
// the bundle records it, a load replays it (lower_recorded_gemm_conv, no
// timing), two calls give the same bits and the logits stay within the fp16
// criterion of PyTorch fp32. A record naming an algorithm cuBLASLt does not
// offer fails the load, naming the conv.
TEST(CudaGemmConv, AlgorithmsNamedByTheCacheRunAndReplay) {
  KILN_REQUIRE_GPU();
  const std::string f = "resnet/basic";
  const fs::path fixtures(KILN_FIXTURES_DIR);
  const fs::path dir = fs::temp_directory_path() / ("kiln_gpu_gemm_conv_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const fs::path cache = dir / "tactics.json";
  auto build_with_cache = [&](const fs::path& out) {
    testing::build_f16_with_tactic_cache(fixtures / f, cache, Switch::GemmConv, out);
  };
  build_with_cache(dir / "timed.bundle");
  std::ifstream in(cache);
  ASSERT_TRUE(in) << cache;
  nlohmann::json j = nlohmann::json::parse(in);
  in.close();
  cuda::CublasLtHandle lt;
  int named = 0;
  for (auto& [key, sigs] : j.items())
    for (auto& [sig, v] : sigs.items())
      if (sig.rfind("conv f16 ", 0) == 0 && sig.find(" gemm_conv=1") != std::string::npos)
        v = nlohmann::json::array({cuda::GemmConvOp(lt.h, desc_of_signature(sig)).tactic_name(0), 1.0}), ++named;
  ASSERT_GT(named, 0);
  std::ofstream(cache) << j.dump(1);
  const fs::path b = dir / "named.bundle";
  build_with_cache(b);
  const nlohmann::json recorded = tactics_section(Bundle::open(b)).second;
  int convs = 0, gemm = 0;
  std::string gemm_node;
  for (const auto& step : recorded["batches"]["2"]["plan"]["steps"]) {
    const std::string kernel = step[1].get<std::string>();
    convs += kernel.rfind("cudnn ", 0) == 0 || kernel.rfind("kiln gemm_conv ", 0) == 0;
    if (kernel.rfind("kiln gemm_conv ", 0) == 0) ++gemm, gemm_node = step[0].get<std::string>();
  }
  EXPECT_EQ(gemm, convs) << "every conv of the fixture is dense with groups 1";
  ASSERT_GT(gemm, 0);
  HostTensor x = read_npy(fixtures / f / "input.npy");
  const auto want = read_npy(fixtures / f / "logits.npy").to_f32();
  auto ctx = Engine::load(b.string())->create_context();
  const auto first = ctx->run({{"pixel_values", x.shape, x.to_f32()}}).at(0).data;
  const auto again = ctx->run({{"pixel_values", x.shape, x.to_f32()}}).at(0).data;
  EXPECT_EQ(first, again);
  EXPECT_GE(testing::cosine(first, want), 0.999);

  // A record naming an algorithm this cuBLASLt does not offer: the load fails naming the conv.
  nlohmann::json bad = recorded;
  auto& rec = bad["batches"]["2"]["layers"][gemm_node];
  ASSERT_TRUE(rec.is_object()) << gemm_node;
  rec["tactic"] = "kiln gemm_conv cublasLt algo 99999 tile 0 stages 0 splitk 1 red 0 swizzle 0 custom 0 cluster 0";
  const Bundle built = Bundle::open(b);
  BundleWriter w(built.info());
  for (const auto& s : built.section_names()) {
    const Blob blob = built.section(s);
    if (s == tactics_section(built).first) w.add_section(s, bad.dump());
    else w.add_section(s, std::vector<uint8_t>(blob.data, blob.data + blob.size));
  }
  const fs::path tampered = dir / "tampered.bundle";
  w.write(tampered);
  try {
    Engine::load(tampered.string())->create_context()->run({{"pixel_values", x.shape, x.to_f32()}});
    ADD_FAILURE() << "a bundle recording an algorithm cuBLASLt does not offer loaded and ran";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(gemm_node), std::string::npos) << msg;
    EXPECT_NE(msg.find("rebuild the bundle"), std::string::npos) << msg;
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace kiln
