// timm_efficientnet against PyTorch: seeded fixtures from
// tools/reference/make_fixtures_efficientnet.py (every parameter and BatchNorm
// statistic randomized; B0, tf_ B0 at an odd size, Lite, tf_ Lite, V2 rw_s,
// tf_ V2-S), built into bundles and run on the CPU backend.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "../../../tests/unit/graph_test_util.hpp"
#include "../../../tests/unit/family_test_util.hpp"
#include "bundle/builder.hpp"
#include "core/error.hpp"
#include "core/file.hpp"
#include "core/npy.hpp"
#include "families/family.hpp"
#include "kiln/kiln.hpp"
#include "passes/pass.hpp"

namespace kiln {
namespace {

namespace fs = std::filesystem;
const fs::path kFixtures = fs::path(KILN_FIXTURES_DIR) / "efficientnet";
using testing::fixture_cases;

KILN_FAMILY_FIXTURE_TESTS(EfficientnetFixture, kFixtures);

// A fixture's config and checkpoint, as `kiln build` sees them.
struct Loaded {
  ModelSource source;
  Checkpoint checkpoint;
};

std::unique_ptr<Loaded> load(const fs::path& dir) {
  auto l = std::unique_ptr<Loaded>(new Loaded{{}, Checkpoint::open(dir / "model.safetensors")});
  l->source.dir = dir;
  l->source.config_path = dir / "config.json";
  l->source.config = nlohmann::json::parse(std::ifstream(dir / "config.json"));
  l->source.checkpoint = &l->checkpoint;
  return l;
}

const Family& efficientnet_family() {
  for (const auto& f : family_registry().all())
    if (f->name() == "timm_efficientnet") return *f;
  throw std::runtime_error("timm_efficientnet not registered");
}

TEST(TimmEfficientnetDescribe, ClaimsEveryFixtureAndNothingElse) {
  for (const auto& name : fixture_cases(kFixtures)) {
    auto l = load(kFixtures / name);
    EXPECT_EQ(family_registry().select(l->source).name(), "timm_efficientnet") << name;
  }
  // Same tensors, but a MobileNetV3 / MnasNet architecture: activation and strides differ, not ours.
  auto l = load(kFixtures / "lite0_narrow");
  for (const char* arch : {"mobilenetv3_large_100", "mnasnet_100", "efficientnet_es", "efficientnet_b0_gn"}) {
    l->source.config["architecture"] = arch;
    EXPECT_FALSE(efficientnet_family().describe(l->source)) << arch;
  }
  // A ResNet checkpoint is not claimed.
  auto r = load(fs::path(KILN_FIXTURES_DIR) / "resnet" / "basic");
  EXPECT_FALSE(efficientnet_family().describe(r->source));
}

// Op counts after the pass pipeline, for the B0 fixture: 1 DS + 9 IR blocks, all with SE.
TEST(TimmEfficientnetPasses, EverythingFusesIntoConvs) {
  auto l = load(kFixtures / "b0_narrow");
  BuildRequest req{&l->source, 1};
  FamilyBuild fb = efficientnet_family().build(req);
  Graph g = std::move(fb.graph);
  PipelineOptions opts;
  opts.verify = true;
  run_pipeline(g, opts);
  std::map<Op, int> ops;
  int silu = 0, sigmoid = 0, residual = 0;
  for (const auto& n : g.nodes) {
    ++ops[n.op];
    if (n.op != Op::Conv2d) continue;
    if (n.activation() == Activation::Silu) ++silu;
    if (n.activation() == Activation::Sigmoid) ++sigmoid;
    if (n.inputs.size() == 4) ++residual;
  }
  EXPECT_EQ(ops[Op::BatchNorm], 0);
  EXPECT_EQ(ops[Op::Activation], 0);  // SiLU and the SE gate ride on convs
  EXPECT_EQ(ops[Op::Add], 0);         // skips became conv residual inputs
  EXPECT_EQ(ops[Op::Conv2d], 1 + 4 + 9 * 5 + 1);  // stem, DS (dw, se x2, pw), IR (pw, dw, se x2, pwl), head
  EXPECT_EQ(ops[Op::Mul], 10);
  EXPECT_EQ(ops[Op::GlobalAvgPool], 11);  // one per SE + the head
  EXPECT_EQ(ops[Op::Linear], 1);
  EXPECT_EQ(silu, 1 + 1 + 9 * 2 + 10 + 1);  // stem, dw of DS, pw+dw of IR, SE reduce, head
  EXPECT_EQ(sigmoid, 10);
  EXPECT_EQ(residual, 4);  // DS (8 -> 8) and the second block of stages 3, 4, 5
}

// tf_ padding of the stride-2 stem at 65x62: H (odd) 1 top, 1 bottom; W (even) 0 left, 1 right.
TEST(TimmEfficientnetPasses, TfSamePaddingIsAsymmetric) {
  auto l = load(kFixtures / "tf_b0_65x62");
  FamilyBuild fb = efficientnet_family().build(BuildRequest{&l->source, 1});
  for (const auto& n : fb.graph.nodes)
    if (n.name == "conv_stem") EXPECT_EQ(n.attr_ints("pads"), (std::vector<int64_t>{1, 0, 1, 1}));
  for (const auto& n : fb.graph.nodes)
    if (n.name == "bn1") EXPECT_DOUBLE_EQ(n.attr_float("eps", 0), 1e-3);
}

TEST(TimmEfficientnetErrors, UnexpectedBlockTensorIsNamed) {
  // A MixNet-style split depthwise conv: a name the parser does not know inside blocks.S.B.
  std::string msg = testing::build_error_after_rename(kFixtures, "b0_narrow", "blocks.3.1.conv_dw.weight", "blocks.3.1.conv_dw.0.weight");
  EXPECT_NE(msg.find("blocks.3.1.conv_dw.0.weight"), std::string::npos) << msg;
}

TEST(TimmEfficientnetErrors, UnknownBlockKindIsNamed) {
  std::string msg = testing::build_error_after_rename(kFixtures, "tf_v2_s_odd", "blocks.0.0.conv.weight", "blocks.0.0.conv_mix.weight");
  EXPECT_NE(msg.find("blocks.0.0"), std::string::npos) << msg;
}

TEST(TimmEfficientnetErrors, StrayBlockIsNamed) {
  // blocks.6.0 renamed to blocks.6.3: outside the block numbering, so never consumed.
  std::string msg = testing::build_error_after_rename(kFixtures, "lite0_narrow", "blocks.6.0.bn3.bias", "blocks.6.3.bn3.bias");
  EXPECT_TRUE(msg.find("blocks.6.0.bn3.bias") != std::string::npos || msg.find("blocks.6.3.bn3.bias") != std::string::npos)
      << msg;
}

TEST(TimmEfficientnetBuild, BundlesAreReproducible) {
  testing::expect_reproducible(kFixtures / "tf_v2_s_odd");
}

}  // namespace
}  // namespace kiln
