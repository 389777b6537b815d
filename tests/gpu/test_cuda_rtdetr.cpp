// RT-DETR v2 on the CUDA backend: each seeded fixture of
// tests/fixtures/rt_detr_v2 (tools/reference/make_fixtures_rtdetr.py) built
// with --backend cuda and compared with the fixture's PyTorch fp32 outputs:
// fp32 logits and boxes within 1e-3 * max|ref| (TRTMC's rule), fp16 by the
// issue's detection rule (families/rt_detr_v2/tests/rtdetr_test_util.hpp).
// Skips without a GPU.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

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

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaRtDetr, ::testing::ValuesIn(testing::fixture_cases(rt::kFixtures)),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace kiln
