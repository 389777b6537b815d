// RT-DETR v2 on the CUDA backend: each seeded fixture of
// tests/fixtures/rt_detr_v2 (tools/reference/make_fixtures_rtdetr.py) built
// with --backend cuda and compared with the fixture's PyTorch fp32 outputs:
// fp32 logits and boxes within 1e-3 * max|ref| (TRTMC's rule), fp16 by the
// issue's detection rule (families/rt_detr_v2/tests/rtdetr_test_util.hpp);
// the FP8 build lowers and runs. Skips without a GPU.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "../../families/rt_detr_v2/tests/rtdetr_test_util.hpp"
#include "core/npy.hpp"
#include "kiln/kiln.hpp"

namespace kiln {
namespace {

namespace fs = std::filesystem;
namespace rt = testing::rtdetr;

bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

class CudaRtDetr : public ::testing::TestWithParam<std::string> {};

// Opt level 3 (timed tactics, the default) and 1 (heuristic tactics).
TEST_P(CudaRtDetr, Fp32MatchesPyTorch) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  for (int level : {3, 1}) {
    const auto out = rt::run_fixture(GetParam(), "cuda", DType::F32, level);
    ASSERT_EQ(out.size(), 2u);
    rt::expect_matches(cat("cuda fp32 o", level), out[0].data, out[1].data, rt::kFixtures / GetParam());
  }
}

TEST_P(CudaRtDetr, Fp16DetectionsMatchPyTorch) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const fs::path dir = rt::kFixtures / GetParam();
  const auto out = rt::run_fixture(GetParam(), "cuda", DType::F16);
  ASSERT_EQ(out.size(), 2u);
  rt::expect_fp16_rule("cuda fp16", out[0].data, out[1].data, read_npy(dir / "input.npy").shape, dir, rt::kSeededFp16UnmatchedCuda);
}

// The FP8 build (issue 13 §6 for RT-DETR: every conv and linear but the
// default exclusions, scales calibrated on the sample photos) lowers on CUDA
// — the memory concat writes the codes its 8-bit readers take, as a row-major
// concat (before session 21 the build failed there) — and runs to finite
// outputs of the fixture's shapes. Its quality is the study's to measure
// (`kiln study quant`, families/rt_detr_v2/README.md): on these seeded
// fixtures the 8400-way top-k of near-flat scores picks other queries for
// any small difference, so CUDA's FP8 outputs against the CPU's FP8 engine
// gave logits cosines of only 0.95-0.97 and boxes 0.78-0.95 (H100, session 21).
TEST_P(CudaRtDetr, Fp8BuildLowersAndRunsFinite) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const fs::path dir = rt::kFixtures / GetParam();
  const HostTensor x = read_npy(dir / "input.npy");
  const fs::path tmp = testing::temp_dir(cat("rtdetr_fp8_", GetParam()));
  BuildOptions o;
  o.model = dir.string();
  o.backend = "cuda";
  o.precision = DType::F16;
  o.batch = static_cast<int>(x.shape.at(0));
  o.quantize = "fp8";
  o.calib = (fs::path(KILN_FIXTURES_DIR) / "images" / "images").string();
  o.calib_images = 4;
  build_bundle(o, tmp / "m.bundle");
  const std::vector<Tensor> out =
      Engine::load((tmp / "m.bundle").string())->create_context()->run({{"pixel_values", x.shape, x.to_f32()}});
  fs::remove_all(tmp);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].shape, read_npy(dir / "logits.npy").shape);
  EXPECT_EQ(out[1].shape, read_npy(dir / "pred_boxes.npy").shape);
  for (const Tensor& t : out)
    for (float v : t.data) ASSERT_TRUE(std::isfinite(v)) << GetParam() << " " << t.name;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaRtDetr, ::testing::ValuesIn(testing::fixture_cases(rt::kFixtures)),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace kiln
