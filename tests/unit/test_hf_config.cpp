// Tests for timm's config.json reader and Hugging Face cache resolution.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cctype>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>

#include "checkpoint/hf_cache.hpp"
#include "checkpoint/hf_config.hpp"
#include "checkpoint/safetensors.hpp"
#include "core/error.hpp"
#include "core/file.hpp"
#include "core/half.hpp"
#include "temp_dir.hpp"

namespace kiln {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using namespace std::string_literals;
using testing::EnvGuard;
using testing::TempDir;
using testing::write_file;
using testing::throws_input;

json timm_json() {
  return json::parse(R"({"architecture": "resnet50", "num_classes": 3, "num_features": 2048,
    "label_names": ["cat", "dog", "eel"],
    "pretrained_cfg": {"tag": "a1_in1k", "custom_load": false, "input_size": [3, 160, 192],
      "fixed_input_size": false, "interpolation": "bilinear", "crop_pct": 0.95, "crop_mode": "squash",
      "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225], "num_classes": 3,
      "pool_size": [7, 7], "first_conv": "conv1", "classifier": "fc"}})");
}

TEST(TimmConfig, ReadsAllFields) {
  TempDir dir;
  write_file(dir / "config.json", timm_json().dump());
  TimmConfig c = read_timm_config(dir / "config.json");
  EXPECT_EQ(c.architecture, "resnet50");
  EXPECT_EQ(c.num_classes, 3);
  EXPECT_EQ(c.num_features, 2048);
  EXPECT_EQ(c.in_chans, 3);
  EXPECT_EQ(c.input_h, 160);
  EXPECT_EQ(c.input_w, 192);
  EXPECT_EQ(c.mean, (std::array<float, 3>{0.485f, 0.456f, 0.406f}));
  EXPECT_EQ(c.std, (std::array<float, 3>{0.229f, 0.224f, 0.225f}));
  EXPECT_FLOAT_EQ(c.crop_pct, 0.95f);
  EXPECT_EQ(c.interpolation, Interpolation::Bilinear);
  EXPECT_EQ(c.crop_mode, "squash");
  EXPECT_EQ(c.label_names, (std::vector<std::string>{"cat", "dog", "eel"}));
  EXPECT_EQ(c.raw["pretrained_cfg"]["tag"], "a1_in1k");

  json j = timm_json();  // optional keys absent -> defaults
  j.erase("num_features");
  j.erase("label_names");
  j["pretrained_cfg"].erase("crop_mode");
  j["pretrained_cfg"]["interpolation"] = "bicubic";
  TimmConfig d = parse_timm_config(j, "config.json");
  EXPECT_EQ(d.num_features, 0);
  EXPECT_TRUE(d.label_names.empty());
  EXPECT_EQ(d.crop_mode, "center");
  EXPECT_EQ(d.interpolation, Interpolation::Bicubic);
}

TEST(TimmConfig, MissingRequiredKeysAreNamed) {
  TempDir dir;
  for (const std::string key : {"architecture", "num_classes", "pretrained_cfg", "pretrained_cfg.input_size",
                                "pretrained_cfg.mean", "pretrained_cfg.std", "pretrained_cfg.crop_pct",
                                "pretrained_cfg.interpolation"}) {
    json j = timm_json();
    if (key.rfind("pretrained_cfg.", 0) == 0) j["pretrained_cfg"].erase(key.substr(15));
    else j.erase(key);
    write_file(dir / "config.json", j.dump());
    EXPECT_TRUE(throws_input([&] { read_timm_config(dir / "config.json"); }, {"config.json", "missing key '" + key + "'"}));
  }
}

TEST(TimmConfig, WrongTypesAndValuesAreNamed) {
  struct Case { std::string ptr; json value; std::string key; };
  const std::vector<Case> cases = {
      {"/architecture", 5, "'architecture'"},
      {"/architecture", "", "'architecture'"},
      {"/num_classes", "1000", "'num_classes'"},
      {"/num_classes", 3.5, "'num_classes'"},
      {"/num_classes", -1, "'num_classes'"},
      {"/num_classes", 1ull << 40, "'num_classes'"},
      {"/num_features", json::array(), "'num_features'"},
      {"/pretrained_cfg", "x", "'pretrained_cfg'"},
      {"/pretrained_cfg/input_size", {3, 224}, "'pretrained_cfg.input_size'"},
      {"/pretrained_cfg/input_size", {3, 0, 224}, "'pretrained_cfg.input_size[1]'"},
      {"/pretrained_cfg/input_size", {3, "224", 224}, "'pretrained_cfg.input_size[1]'"},
      {"/pretrained_cfg/mean", {0.5, 0.5}, "'pretrained_cfg.mean'"},
      {"/pretrained_cfg/mean", {0.5, "0.5", 0.5}, "'pretrained_cfg.mean[1]'"},
      {"/pretrained_cfg/std", {0.5, 0.0, 0.5}, "'pretrained_cfg.std'"},
      {"/pretrained_cfg/std", {0.5, 0.5, 1e300}, "'pretrained_cfg.std[2]'"},
      {"/pretrained_cfg/crop_pct", "0.9", "'pretrained_cfg.crop_pct'"},
      {"/pretrained_cfg/crop_pct", 0, "'pretrained_cfg.crop_pct'"},
      {"/pretrained_cfg/interpolation", 2, "'pretrained_cfg.interpolation'"},
      {"/pretrained_cfg/interpolation", "lanczos", "'pretrained_cfg.interpolation'"},
      {"/pretrained_cfg/crop_mode", 1, "'pretrained_cfg.crop_mode'"},
      {"/pretrained_cfg/crop_mode", "zoom", "'pretrained_cfg.crop_mode'"},
      {"/label_names", "cat", "'label_names'"},
      {"/label_names", {"cat", 2, "eel"}, "'label_names[1]'"},
      {"/label_names", {"cat", "dog"}, "'label_names'"},
  };
  for (const auto& c : cases) {
    json j = timm_json();
    j[json::json_pointer(c.ptr)] = c.value;
    EXPECT_TRUE(throws_input([&] { parse_timm_config(j, "/m/config.json"); }, {"/m/config.json", c.key}))
        << c.ptr << " = " << c.value.dump();
  }
}

TEST(TimmConfig, UnreadableFiles) {
  TempDir dir;
  write_file(dir / "config.json", "{\"architecture\": ");
  EXPECT_TRUE(throws_input([&] { read_timm_config(dir / "config.json"); }, {"config.json", "not valid JSON"}));
  write_file(dir / "config.json", "[]");
  EXPECT_TRUE(throws_input([&] { read_timm_config(dir / "config.json"); }, {"config.json", "object"}));
  EXPECT_TRUE(throws_input([&] { read_timm_config(dir / "missing.json"); }, {"missing.json"}));
}

TEST(TimmConfig, InterpolationNames) {
  for (auto i : {Interpolation::Nearest, Interpolation::Bilinear, Interpolation::Bicubic})
    EXPECT_EQ(interpolation_from_name(interpolation_name(i), "x"), i);
  EXPECT_STREQ(interpolation_name(Interpolation::Bicubic), "bicubic");
  EXPECT_TRUE(throws_input([] { interpolation_from_name("area", "cfg"); }, {"cfg", "'area'"}));
}

// --- HF cache ---------------------------------------------------------------

const std::string kSha1 = "0123456789abcdef0123456789abcdef01234567";
const std::string kSha2 = "89abcdef0123456789abcdef0123456789abcdef";

// hub/models--org--name with refs main -> sha1 and v2 -> sha2.
void make_cache(const fs::path& hub) {
  const fs::path repo = hub / "models--org--name";
  write_file(repo / "refs" / "main", kSha1 + "\n");
  write_file(repo / "refs" / "v2", kSha2);
  write_file(repo / "refs" / "junk", "not a sha");
  write_file(repo / "refs" / "refs" / "pr" / "1", kSha2);
  write_file(repo / "snapshots" / kSha1 / "config.json", "{}");
  write_file(repo / "snapshots" / kSha2 / "config.json", "{}");
}

TEST(HfCache, ResolvesRefsAndRevisions) {
  TempDir dir;
  EnvGuard env;
  env.set("HF_HOME", (dir / "hf").string());
  make_cache(dir / "hf" / "hub");
  const fs::path repo = dir / "hf" / "hub" / "models--org--name";

  ResolvedModel m = resolve_model("org/name", "");
  EXPECT_EQ(m.dir, repo / "snapshots" / kSha1);
  EXPECT_EQ(m.hf_id, "org/name");
  EXPECT_EQ(m.revision, kSha1);
  EXPECT_EQ(resolve_model("org/name", "v2").revision, kSha2);
  EXPECT_EQ(resolve_model("org/name", "refs/pr/1").revision, kSha2);
  EXPECT_EQ(resolve_model("org/name", kSha2).dir, repo / "snapshots" / kSha2);
  std::string upper = kSha2;
  for (char& c : upper) c = static_cast<char>(std::toupper(c));
  EXPECT_EQ(resolve_model("org/name", upper).revision, kSha2);

  EXPECT_TRUE(throws_input([] { resolve_model("org/name", "v3"); }, {"org/name", "'v3'", "refs"}));
  EXPECT_TRUE(throws_input([] { resolve_model("org/name", "junk"); }, {"org/name", "junk", "40-hex"}));
  EXPECT_TRUE(throws_input([] { resolve_model("org/name", "../../../etc/passwd"); }, {"invalid revision"}));
  EXPECT_TRUE(throws_input([] { resolve_model("org/name", std::string(40, 'f')); }, {"org/name", std::string(40, 'f')}));
  fs::remove(repo / "snapshots" / kSha2 / "config.json");
  EXPECT_TRUE(throws_input([] { resolve_model("org/name", "v2"); }, {"org/name", "config.json"}));
}

TEST(HfCache, MissingModelNamesIdAndDirectory) {
  TempDir dir;
  EnvGuard env;
  env.set("HF_HOME", (dir / "hf").string());
  make_cache(dir / "hf" / "hub");
  const std::string searched = (dir / "hf" / "hub" / "models--org--other").string();
  EXPECT_TRUE(throws_input([] { resolve_model("org/other", ""); }, {"'org/other'", searched}));
  for (const char* bad : {"a/b/c", "org/na--me", "org/.hidden", "/no/such/dir", "../x"})
    EXPECT_TRUE(throws_input([&] { resolve_model(bad, ""); }, {bad})) << bad;
}

TEST(HfCache, EnvironmentPrecedence) {
  TempDir dir;
  EnvGuard env;
  env.set("HOME", (dir / "home").string());
  EXPECT_EQ(hf_hub_cache_dir(), dir / "home" / ".cache" / "huggingface" / "hub");
  env.set("XDG_CACHE_HOME", (dir / "xdg").string());
  EXPECT_EQ(hf_hub_cache_dir(), dir / "xdg" / "huggingface" / "hub");
  env.set("HF_HOME", "~/hfh");
  EXPECT_EQ(hf_hub_cache_dir(), dir / "home" / "hfh" / "hub");
  env.set("HF_HUB_CACHE", (dir / "hubcache").string());
  EXPECT_EQ(hf_hub_cache_dir(), dir / "hubcache");
  make_cache(dir / "hubcache");
  EXPECT_EQ(resolve_model("org/name", "").dir, dir / "hubcache" / "models--org--name" / "snapshots" / kSha1);
}

TEST(HfCache, LocalDirectory) {
  TempDir dir;
  write_file(dir / "m" / "config.json", "{}");
  ResolvedModel m = resolve_model((dir / "m").string(), "");
  EXPECT_EQ(m.dir, fs::absolute(dir / "m"));
  EXPECT_TRUE(m.hf_id.empty());
  EXPECT_TRUE(m.revision.empty());
  EXPECT_TRUE(throws_input([&] { resolve_model((dir / "m").string(), "main"); }, {"revision"}, ErrorKind::Usage));
  fs::create_directories(dir / "noconf");
  EXPECT_TRUE(throws_input([&] { resolve_model((dir / "noconf").string(), ""); }, {"noconf", "config.json"}));
}

}  // namespace
}  // namespace kiln
