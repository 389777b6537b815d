// `kiln build --reference GLOB`: layers that match run the plain reference
// (src/backends/cpu/ref/) on the CPU backend instead of the optimized kernels,
// to find where numbers go wrong. Numbers must agree with the optimized
// engine and with PyTorch, on a fixture with channel views and fused adds
// (Res2Net), which the reference path turns off.
#include <gtest/gtest.h>

#include "backends/backend.hpp"

#include <filesystem>

#include "bundle/builder.hpp"
#include "core/npy.hpp"
#include "graph_test_util.hpp"
#include "kiln/kiln.hpp"
#include "runtime/engine_impl.hpp"

namespace kiln {
namespace {

namespace fs = std::filesystem;
const fs::path kFixture = fs::path(KILN_FIXTURES_DIR) / "res2net" / "s4_26w";

std::vector<float> build_and_run(DType dt, const std::vector<std::string>& reference, const fs::path& out) {
  BuildOptions o;
  o.model = kFixture.string();
  o.precision = dt;
  o.reference = reference;
  build_bundle(o, out);
  const HostTensor x = read_npy(kFixture / "input.npy");
  return Engine::load(out.string())->create_context()->run({{"pixel_values", x.shape, x.to_f32()}}).at(0).data;
}

TEST(ReferencePath, AgreesWithTheOptimizedEngineAndPyTorch) {
  const fs::path dir = fs::temp_directory_path() / ("kiln_refpath_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const auto want = read_npy(kFixture / "logits.npy").to_f32();
  const float scale = testing::max_abs(want);
  const auto fast = build_and_run(DType::F32, {}, dir / "fast.bundle");
  const auto all = build_and_run(DType::F32, {"*"}, dir / "all.bundle");
  const auto convs = build_and_run(DType::F32, {"conv2d", "layer1.*"}, dir / "convs.bundle");
  EXPECT_LE(testing::max_abs_diff(all, fast), 1e-5f * scale);
  EXPECT_LE(testing::max_abs_diff(convs, fast), 1e-5f * scale);
  EXPECT_LE(testing::max_abs_diff(all, want), 1e-4f * scale);  // the fixture's fp32 bar
  EXPECT_NE(all, fast) << "the reference path ran the optimized kernels (bit-equal results)";
  const auto all16 = build_and_run(DType::F16, {"*"}, dir / "all16.bundle");
  EXPECT_GE(testing::cosine(all16, want), 0.999);
  // The reference path is recorded in the bundle and turns views off.
  auto e = Engine::load((dir / "all.bundle").string());
  EXPECT_EQ(e->impl().reference, std::vector<std::string>{"*"});
  EXPECT_EQ(e->create_context()->memory().views, 0);
  fs::remove_all(dir);
}

TEST(ReferencePath, BadPatternsAndBackendsAreUsageErrors) {
  BuildOptions o;
  o.model = kFixture.string();
  o.reference = {"layer9.*"};
  const fs::path out = fs::temp_directory_path() / ("kiln_refpath_bad_" + std::to_string(::getpid()) + ".bundle");
  try {
    build_bundle(o, out);
    FAIL() << "a pattern that matches nothing was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Usage);
    EXPECT_NE(std::string(e.what()).find("'layer9.*' matches no layer"), std::string::npos) << e.what();
  }
  // The CUDA backend takes --reference too (tests/gpu: ReferenceOn*); its patterns are
  // checked before anything needs a GPU.
  o.backend = "cuda";
  try {
    build_bundle(o, out);
    FAIL() << "a pattern that matches nothing was accepted by the CUDA backend";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Usage) << e.what();
    // A CPU-only build (no CUDA backend compiled in) refuses the backend itself.
    const char* says = backend_registry().find("cuda") ? "'layer9.*' matches no layer" : "backend 'cuda' is not built into this kiln";
    EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(out));
}

}  // namespace
}  // namespace kiln
