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
#include "../unit/family_test_util.hpp"
#include "bundle/builder.hpp"
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

struct Outputs {
  std::vector<float> logits, boxes;
};

// Builds fixture `name` for CUDA at `precision` (batch = the input's) and runs its input.
Outputs run_cuda(const std::string& name, DType precision, int opt_level) {
  const fs::path dir = rt::kFixtures / name;
  const HostTensor x = read_npy(dir / "input.npy");
  const fs::path tmp = testing::temp_dir(cat("cuda_rtdetr_", name, "_", dtype_name(precision), "_o", opt_level));
  BuildOptions o;
  o.model = dir.string();
  o.backend = "cuda";
  o.precision = precision;
  o.opt_level = opt_level;
  o.batch = static_cast<int>(x.shape.at(0));
  o.verify = true;
  build_bundle(o, tmp / "m.bundle");
  auto engine = Engine::load((tmp / "m.bundle").string());
  auto out = engine->create_context()->run({{"pixel_values", x.shape, x.to_f32()}});
  fs::remove_all(tmp);
  EXPECT_EQ(out.size(), 2u) << name;
  if (out.size() != 2) return {};
  EXPECT_EQ(out[0].name, "logits");
  EXPECT_EQ(out[1].name, "pred_boxes");
  return {out[0].data, out[1].data};
}

class CudaRtDetr : public ::testing::TestWithParam<std::string> {};

// Opt level 3 (timed tactics, the default) and 1 (heuristic tactics).
TEST_P(CudaRtDetr, Fp32MatchesPyTorch) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  for (int level : {3, 1}) {
    const Outputs o = run_cuda(GetParam(), DType::F32, level);
    rt::expect_matches(cat("cuda fp32 o", level), o.logits, o.boxes, rt::kFixtures / GetParam());
  }
}

TEST_P(CudaRtDetr, Fp16DetectionsMatchPyTorch) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const fs::path dir = rt::kFixtures / GetParam();
  const Outputs o = run_cuda(GetParam(), DType::F16, 3);
  rt::expect_fp16_rule("cuda fp16", o.logits, o.boxes, read_npy(dir / "input.npy").shape, dir);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaRtDetr, ::testing::ValuesIn(testing::fixture_cases(rt::kFixtures)),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace kiln
