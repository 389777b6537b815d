// Every checkpoint fixture is claimed by exactly one family. Families are
// added by different people at different times, and describe() functions are
// written against their own fixtures only; this test feeds every family's
// fixtures (every tests/fixtures/<set>/<case>/ with a config.json) to every
// registered family, so an over-eager describe() shows up at once.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "checkpoint/safetensors.hpp"
#include "families/family.hpp"
#include "../../../tests/unit/family_test_util.hpp"

namespace kiln {
namespace {

namespace fs = std::filesystem;

// Fixture sets whose owner is known; other sets only need exactly one claimant.
const std::map<std::string, std::string> kOwner = {{"resnet", "timm_resnet"}, {"res2net", "timm_res2net"}};

std::vector<fs::path> checkpoint_fixtures() {
  std::vector<fs::path> dirs;
  const fs::path root(KILN_FIXTURES_DIR);
  for (const auto& set : fs::directory_iterator(root)) {
    if (!set.is_directory()) continue;
    for (const auto& c : fs::directory_iterator(set.path()))
      if (c.is_directory() && fs::exists(c.path() / "config.json")) dirs.push_back(c.path());
  }
  std::sort(dirs.begin(), dirs.end());  // directory order is unspecified; keep messages stable
  return dirs;
}

TEST(FamilyClaims, EveryFixtureHasExactlyOneOwner) {
  const auto dirs = checkpoint_fixtures();
  ASSERT_FALSE(dirs.empty()) << "no checkpoint fixtures under " << KILN_FIXTURES_DIR;
  std::map<std::string, int> seen_sets;
  for (const fs::path& dir : dirs) {
    Checkpoint ckpt = Checkpoint::open(dir);
    const ModelSource src = testing::model_source(dir, ckpt);
    std::vector<std::string> claims;
    for (const auto& f : family_registry().all())
      if (f->describe(src)) claims.push_back(f->name());
    std::string names;
    for (const auto& n : claims) names += " " + n;
    ASSERT_EQ(claims.size(), 1u) << dir << " claimed by:" << (names.empty() ? " (none)" : names);
    const std::string set = dir.parent_path().filename().string();
    ++seen_sets[set];
    auto owner = kOwner.find(set);
    if (owner != kOwner.end()) EXPECT_EQ(claims[0], owner->second) << dir;
    // select() is what kiln build uses; it must agree with the loop above.
    EXPECT_EQ(family_registry().select(src).name(), claims[0]) << dir;
  }
  // Both sets this family's claim logic is defined against must actually have been checked.
  EXPECT_GT(seen_sets["resnet"], 0);
  EXPECT_GT(seen_sets["res2net"], 0);
}

}  // namespace
}  // namespace kiln
