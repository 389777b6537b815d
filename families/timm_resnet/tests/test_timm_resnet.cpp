// timm_resnet against PyTorch: seeded fixtures from tools/reference/make_fixtures.py
// (every parameter and BatchNorm statistic randomized), built into bundles
// and run on the CPU backend.
#include <gtest/gtest.h>

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
#include "kiln/kiln.hpp"

namespace kiln {
namespace {

namespace fs = std::filesystem;
const fs::path kFixtures = fs::path(KILN_FIXTURES_DIR) / "resnet";
using testing::build_error;
using testing::copy_fixture;
using testing::edit_header;
using testing::temp_dir;

KILN_FAMILY_FIXTURE_TESTS(ResnetFixture, kFixtures);

TEST(TimmResnetErrors, UnexpectedTensorIsNamed) {
  // bn2.bias is now missing; the builder reports the first problem it meets.
  std::string msg = testing::build_error_after_rename(kFixtures, "bottleneck", "layer2.1.bn2.bias", "layer2.1.se.fc1.bias");
  EXPECT_TRUE(msg.find("layer2.1.bn2.bias") != std::string::npos || msg.find("layer2.1.se.fc1.bias") != std::string::npos)
      << msg;
}

TEST(TimmResnetErrors, ExtraTensorIsNamed) {
  fs::path d = copy_fixture(kFixtures, "basic", "extra");
  // Duplicate an entry under a new name: everything else builds, the stray tensor is rejected.
  edit_header(d, [](nlohmann::json& header) { header["layer3.0.attn.scale"] = header["fc.bias"]; });
  std::string msg = build_error(d);
  // The safetensors reader rejects overlapping tensors before the family sees them.
  EXPECT_TRUE(msg.find("layer3.0.attn.scale") != std::string::npos) << msg;
  fs::remove_all(d);
}

TEST(TimmResnetErrors, MissingTensorIsNamed) {
  std::string msg = testing::build_error_after_rename(kFixtures, "resnet_d", "layer3.0.downsample.1.weight", "");
  EXPECT_NE(msg.find("layer3.0.downsample"), std::string::npos) << msg;
}

TEST(TimmResnetErrors, ConfigMissingKeyIsNamed) {
  fs::path d = copy_fixture(kFixtures, "basic", "config");
  auto cfg = nlohmann::json::parse(std::ifstream(d / "config.json"));
  cfg["pretrained_cfg"].erase("mean");
  std::ofstream(d / "config.json") << cfg.dump();
  std::string msg = build_error(d);
  EXPECT_NE(msg.find("mean"), std::string::npos) << msg;
  fs::remove_all(d);
}

TEST(TimmResnetErrors, UnusableDtypeIsNamed) {
  fs::path d = copy_fixture(kFixtures, "basic", "dtype");
  // fc.bias (10 floats = 40 bytes) reinterpreted as 5 int64: valid file, wrong dtype for a family.
  edit_header(d, [](nlohmann::json& header) {
    header["fc.bias"]["dtype"] = "I64";
    header["fc.bias"]["shape"] = {5};
  });
  std::string msg = build_error(d);
  EXPECT_NE(msg.find("fc.bias"), std::string::npos) << msg;
  fs::remove_all(d);
}

TEST(TimmResnetApi, WrongInputShapeIsAnInputError) {
  fs::path dir = temp_dir("shape");
  BuildOptions o;
  o.model = (kFixtures / "basic").string();
  build_bundle(o, dir / "m.bundle");
  auto ctx = Engine::load((dir / "m.bundle").string())->create_context();
  try {
    ctx->run({{"pixel_values", {1, 3, 32, 64}, std::vector<float>(3 * 32 * 64)}});
    FAIL() << "accepted a wrong shape";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Input);
    EXPECT_NE(std::string(e.what()).find("pixel_values"), std::string::npos) << e.what();
  }
  EXPECT_THROW(ctx->run({{"pixel_values", {1, 3, 64, 64}, std::vector<float>(5)}}), Error);
  EXPECT_THROW(ctx->run({{"image", {1, 3, 64, 64}, std::vector<float>(3 * 64 * 64)}}), Error);
  EXPECT_THROW(ctx->run({}), Error);
  fs::remove_all(dir);
}

TEST(TimmResnetBuild, BundlesAreReproducible) {
  testing::expect_reproducible(kFixtures / "resnext");
}

}  // namespace
}  // namespace kiln
