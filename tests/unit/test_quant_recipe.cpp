// Quantization recipes (src/quant/recipe): the strict file reader (errors
// name file and key, garbage and random bytes rejected cleanly), and which
// layers of the timm fixtures a recipe quantizes, with the reason for every
// layer it leaves alone.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "family_test_util.hpp"
#include "quant/recipe.hpp"

namespace kiln {
namespace {

namespace fs = std::filesystem;
using quant::Recipe;
using testing::error_of;

const fs::path kFixtures = KILN_FIXTURES_DIR;

const char* kFullRecipe = R"({
  "format": 1,
  "precision": "int8",
  "weights": "per_channel_amax",
  "activations": "static_per_tensor",
  "calibration": {"method": "percentile", "percentile": 99.9},
  "parts": ["all", "no-stem", "no-layer1"],
  "include": ["layer1.0.conv2"],
  "exclude": ["*.downsample.*"],
  "residuals": "wide",
  "defaults": {"stem": false, "classifier": true, "depthwise": false, "max_small_channels": 8, "pooled": false}
})";

TEST(QuantRecipe, ReadsEveryKeyAndRoundTrips) {
  const Recipe r = quant::parse_recipe(kFullRecipe, "full.json");
  EXPECT_EQ(r.precision, DType::I8);
  EXPECT_EQ(r.calibration.method, quant::CalibMethod::Percentile);
  EXPECT_EQ(r.calibration.percentile, 99.9);
  EXPECT_EQ(r.parts, (std::vector<std::string>{"all", "no-stem", "no-layer1"}));
  EXPECT_EQ(r.include, (std::vector<std::string>{"layer1.0.conv2"}));
  EXPECT_EQ(r.exclude, (std::vector<std::string>{"*.downsample.*"}));
  EXPECT_FALSE(r.defaults.stem);
  EXPECT_TRUE(r.defaults.classifier);
  EXPECT_FALSE(r.defaults.depthwise);
  EXPECT_EQ(r.defaults.max_small_channels, 8);
  EXPECT_FALSE(r.defaults.pooled);
  EXPECT_FALSE(r.residuals_8bit);
  EXPECT_EQ(quant::parse_recipe(quant::recipe_to_json(r), "again.json"), r);
}

TEST(QuantRecipe, OptionalKeysTakeTheDocumentedDefaults) {
  const Recipe r = quant::parse_recipe(R"({"format": 1, "precision": "fp8"})", "min.json");
  EXPECT_EQ(r, Recipe{});
  EXPECT_EQ(r.precision, DType::F8E4M3);
  EXPECT_EQ(r.parts, std::vector<std::string>{"all"});
  EXPECT_EQ(r.calibration.method, quant::CalibMethod::Max);
  EXPECT_TRUE(r.defaults.stem && r.defaults.classifier && r.defaults.depthwise && r.defaults.pooled);
  EXPECT_EQ(r.defaults.max_small_channels, 16);
  EXPECT_TRUE(r.residuals_8bit);
  EXPECT_EQ(quant::parse_recipe(quant::recipe_to_json(Recipe{}), "d.json"), Recipe{});
}

TEST(QuantRecipe, ErrorsNameTheFileAndTheKey) {
  struct Case {
    const char* text;
    const char* want;
  };
  const Case cases[] = {
      {"", "r.json: not valid JSON"},
      {"{\"format\": 1, \"precision\": \"fp8\"", "r.json: not valid JSON"},
      {"[1, 2]", "r.json: the file must be a JSON object"},
      {R"({"precision": "fp8"})", "r.json: missing key 'format'"},
      {R"({"format": 1})", "r.json: missing key 'precision'"},
      {R"({"format": 2, "precision": "fp8"})", "r.json: key 'format' must be 1"},
      {R"({"format": 1.5, "precision": "fp8"})", "r.json: key 'format' must be an integer"},
      {R"({"format": 1, "precision": "fp16"})", "r.json: key 'precision' must be \"fp8\" or \"int8\", not \"fp16\""},
      {R"({"format": 1, "precision": 8})", "r.json: key 'precision' must be a string"},
      {R"({"format": 1, "precision": "fp8", "prts": []})", "r.json: unknown key 'prts' (known:"},
      {R"({"format": 1, "precision": "fp8", "weights": "per_tensor"})", "r.json: key 'weights' must be \"per_channel_amax\""},
      {R"({"format": 1, "precision": "fp8", "activations": "dynamic"})", "r.json: key 'activations' must be \"static_per_tensor\""},
      {R"({"format": 1, "precision": "fp8", "calibration": {"method": "kl"}})",
       "r.json: key 'calibration.method' must be max, percentile, entropy or mse, not \"kl\""},
      {R"({"format": 1, "precision": "fp8", "calibration": {}})", "r.json: missing key 'calibration.method'"},
      {R"({"format": 1, "precision": "fp8", "calibration": {"method": "max", "percentile": 99}})",
       "r.json: key 'calibration.percentile' is only read with method percentile"},
      {R"({"format": 1, "precision": "fp8", "calibration": {"method": "percentile", "percentile": 0}})",
       "r.json: key 'calibration.percentile' must lie in (0, 100]"},
      {R"({"format": 1, "precision": "fp8", "calibration": {"method": "percentile", "percentile": 100.5}})",
       "r.json: key 'calibration.percentile' must lie in (0, 100]"},
      {R"({"format": 1, "precision": "fp8", "calibration": {"method": "percentile", "percentile": "99"}})",
       "r.json: key 'calibration.percentile' must be a number"},
      {R"({"format": 1, "precision": "fp8", "calibration": "max"})", "r.json: key 'calibration' must be a JSON object"},
      {R"({"format": 1, "precision": "fp8", "residuals": "int8"})", "r.json: key 'residuals' must be \"8bit\" or \"wide\", not \"int8\""},
      {R"({"format": 1, "precision": "fp8", "residuals": true})", "r.json: key 'residuals' must be a string"},
      {R"({"format": 1, "precision": "fp8", "parts": "all"})", "r.json: key 'parts' must be a list of strings"},
      {R"({"format": 1, "precision": "fp8", "parts": ["all", 3]})", "r.json: key 'parts' must be a list of strings"},
      {R"({"format": 1, "precision": "fp8", "parts": ["layer*"]})", "r.json: key 'parts' holds 'layer*', not a part name"},
      {R"({"format": 1, "precision": "fp8", "parts": ["no-"]})", "r.json: key 'parts' holds 'no-', not a part name"},
      {R"({"format": 1, "precision": "fp8", "parts": [""]})", "r.json: key 'parts' holds '', not a part name"},
      {R"({"format": 1, "precision": "fp8", "include": [""]})", "r.json: key 'include' holds an empty pattern"},
      {R"({"format": 1, "precision": "fp8", "exclude": [null]})", "r.json: key 'exclude' must be a list of strings"},
      {R"({"format": 1, "precision": "fp8", "defaults": {"stemm": true}})", "r.json: unknown key 'defaults.stemm'"},
      {R"({"format": 1, "precision": "fp8", "defaults": {"stem": 1}})", "r.json: key 'defaults.stem' must be true or false"},
      {R"({"format": 1, "precision": "fp8", "defaults": {"max_small_channels": -1}})",
       "r.json: key 'defaults.max_small_channels' must lie in [0, 1048576]"},
      {R"({"format": 1, "precision": "fp8", "defaults": {"max_small_channels": 18446744073709551615}})",
       "r.json: key 'defaults.max_small_channels' is out of range"},
      {R"({"format": 1, "precision": "fp8", "defaults": []})", "r.json: key 'defaults' must be a JSON object"},
  };
  for (const Case& c : cases) {
    try {
      quant::parse_recipe(c.text, "r.json");
      ADD_FAILURE() << "accepted: " << c.text;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::Input) << c.text;
      EXPECT_NE(std::string(e.what()).find(c.want), std::string::npos) << c.text << "\n  got: " << e.what();
    }
  }
}

TEST(QuantRecipe, ReadsFilesAndNamesTheirPath) {
  const fs::path dir = testing::temp_dir("quant_recipe");
  std::ofstream(dir / "ok.json") << kFullRecipe;
  EXPECT_EQ(quant::read_recipe((dir / "ok.json").string()).precision, DType::I8);
  std::ofstream(dir / "bad.json") << R"({"format": 1, "precision": "fp8", "defaults": {"stem": "no"}})";
  EXPECT_NE(error_of([&] { quant::read_recipe((dir / "bad.json").string()); })
                .find((dir / "bad.json").string() + ": key 'defaults.stem' must be true or false"),
            std::string::npos);
  EXPECT_NE(error_of([&] { quant::read_recipe((dir / "missing.json").string()); }).find("missing.json"), std::string::npos);
  fs::remove_all(dir);
}

// Garbage in: every outcome is a recipe or a kiln::Error, never a crash or a
// foreign exception; whatever is accepted writes back to an equal recipe.
TEST(QuantRecipe, RandomBytesAndMutationsAreRejectedCleanly) {
  std::mt19937 rng(1313);
  auto outcome = [](const std::string& text) {
    try {
      const Recipe r = quant::parse_recipe(text, "fuzz.json");
      EXPECT_EQ(quant::parse_recipe(quant::recipe_to_json(r), "again.json"), r) << text;
      return 1;
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()).rfind("fuzz.json: ", 0), 0u) << e.what();
      return 0;
    } catch (const std::exception& e) {
      ADD_FAILURE() << "foreign exception " << e.what() << " for: " << text;
      return -1;
    }
  };
  std::uniform_int_distribution<int> byte(0, 255), len(0, 300);
  for (int i = 0; i < 2000; ++i) {
    std::string s(static_cast<size_t>(len(rng)), '\0');
    for (auto& c : s) c = static_cast<char>(byte(rng));
    outcome(s);
  }
  // Mutations of a valid recipe reach the key and value checks behind the parser.
  const std::string seed = kFullRecipe;
  const std::string alphabet = "{}[]\",:0123456789.-+eE truefalsnul\\/";
  int accepted = 0;
  for (int i = 0; i < 4000; ++i) {
    std::string s = seed;
    const int edits = 1 + i % 3;
    for (int e = 0; e < edits && !s.empty(); ++e) {
      const size_t at = static_cast<size_t>(rng() % s.size());
      const char c = i % 2 ? alphabet[rng() % alphabet.size()] : static_cast<char>(byte(rng));
      switch (rng() % 3) {
        case 0: s[at] = c; break;
        case 1: s.insert(at, 1, c); break;
        default: s.erase(at, 1);
      }
    }
    accepted += outcome(s) == 1;
  }
  EXPECT_GT(accepted, 0);  // some edits (inside strings) stay valid: the mutations reached the checks
}

// ---- selection ----

Graph fixture(const std::string& family_dir, const std::string& name, const std::string& family) {
  return testing::fixture_graph(kFixtures / family_dir / name, DType::F32, 1, family);
}

std::vector<std::string> names(const Graph& g, const std::vector<int>& nodes) {
  std::vector<std::string> out;
  for (int i : nodes) out.push_back(g.nodes[i].name);
  return out;
}

std::string reason_of(const Graph& g, const quant::Selection& s, const std::string& node) {
  for (const auto& e : s.excluded)
    if (g.nodes[e.node].name == node) return e.reason;
  return "(quantized or not a candidate)";
}

// Every conv and linear is in exactly one list; nothing else is in either.
void expect_partition(const Graph& g, const quant::Selection& s) {
  std::vector<int> all = s.quantized;
  for (const auto& e : s.excluded) {
    all.push_back(e.node);
    EXPECT_FALSE(e.reason.empty()) << g.nodes[e.node].name;
  }
  std::sort(all.begin(), all.end());
  std::vector<int> want;
  for (size_t i = 0; i < g.nodes.size(); ++i)
    if (g.nodes[i].op == Op::Conv2d || g.nodes[i].op == Op::Linear) want.push_back(static_cast<int>(i));
  EXPECT_EQ(all, want);
}

// select_quantized with the partition checked; `any_width` turns the small-channel rule off.
quant::Selection select(const Graph& g, Recipe r, bool any_width = false) {
  if (any_width) r.defaults.max_small_channels = 0;
  quant::Selection s = quant::select_quantized(g, r);
  expect_partition(g, s);
  return s;
}

TEST(QuantSelect, ResNetDefaultsKeepStemClassifierAndSmallLayers) {
  const Graph g = fixture("resnet", "basic", "timm_resnet");
  const auto s = select(g, Recipe{});
  // basic: layer1 has 8 channels, layer2 16, layer3 24, layer4 32; conv1 is 3 -> 64.
  EXPECT_EQ(names(g, s.quantized),
            (std::vector<std::string>{"layer3.0.conv2", "layer4.0.downsample.0", "layer4.0.conv1", "layer4.0.conv2"}));
  const std::string stem = reason_of(g, s, "conv1");
  EXPECT_NE(stem.find("default exclusion: stem (defaults.stem)"), std::string::npos) << stem;
  EXPECT_NE(stem.find("3 input channels <= 16"), std::string::npos) << stem;
  EXPECT_NE(reason_of(g, s, "fc").find("default exclusion: classifier (defaults.classifier)"), std::string::npos);
  EXPECT_NE(reason_of(g, s, "fc").find("10 output channels <= 16"), std::string::npos);
  EXPECT_EQ(reason_of(g, s, "layer3.0.conv1"), "default exclusion: 16 input channels <= 16 (defaults.max_small_channels)");
  EXPECT_EQ(reason_of(g, s, "layer1.0.conv1"), "default exclusion: 8 output channels <= 16 (defaults.max_small_channels)");
}

TEST(QuantSelect, PartsApplyInOrderThenIncludeThenExclude) {
  const Graph g = fixture("resnet", "basic", "timm_resnet");
  Recipe r;
  r.defaults.max_small_channels = 0;
  r.parts = {"all", "no-layer1"};
  auto s = select(g, r);
  for (int i : s.quantized) EXPECT_EQ(g.nodes[i].name.rfind("layer1.", 0), std::string::npos) << g.nodes[i].name;
  EXPECT_EQ(s.quantized.size(), 9u);  // 13 convs + fc, less stem, classifier, layer1's three
  EXPECT_EQ(reason_of(g, s, "layer1.0.conv2"), "removed by part 'no-layer1'");

  // Stage parts name prefixes; include adds after the parts, exclude removes last.
  r.parts = {"layer2", "layer4"};
  r.include = {"layer1.0.conv2"};
  r.exclude = {"*.downsample.*"};
  s = select(g, r);
  EXPECT_EQ(names(g, s.quantized), (std::vector<std::string>{"layer1.0.conv2", "layer2.0.conv1", "layer2.0.conv2",
                                                             "layer4.0.conv1", "layer4.0.conv2"}));
  EXPECT_EQ(reason_of(g, s, "layer2.0.downsample.0"), "removed by exclude pattern '*.downsample.*'");
  EXPECT_EQ(reason_of(g, s, "layer3.0.conv1"), "not selected: no part or include pattern of the recipe names it");

  // A later part overrides an earlier one.
  r.parts = {"no-layer2", "layer2"};
  r.include.clear();
  r.exclude.clear();
  EXPECT_EQ(quant::select_quantized(g, r).quantized.size(), 3u);

  // The default exclusions give way only when the recipe switches them off.
  r = Recipe{};
  r.parts = {"stem", "classifier"};
  EXPECT_TRUE(quant::select_quantized(g, r).quantized.empty());
  r.defaults = {false, false, true, 0};
  EXPECT_EQ(names(g, quant::select_quantized(g, r).quantized), (std::vector<std::string>{"conv1", "fc"}));
}

TEST(QuantSelect, TyposAndGlobsSelectingNothingAreErrors) {
  const Graph g = fixture("resnet", "basic", "timm_resnet");
  Recipe r;
  r.parts = {"all", "no-layer5"};
  const std::string e = error_of([&] { quant::select_quantized(g, r); });
  EXPECT_NE(e.find("recipe part 'layer5' names no conv or linear layer of this graph"), std::string::npos) << e;
  EXPECT_NE(e.find("layer1, layer2, layer3, layer4"), std::string::npos) << e;
  r.parts = {"all"};
  r.include = {"layer9.*"};
  EXPECT_NE(error_of([&] { quant::select_quantized(g, r); }).find("recipe include pattern 'layer9.*' matches no layer"),
            std::string::npos);
  r.include = {"layer1.0.conv1", "maxpool"};
  EXPECT_NE(error_of([&] { quant::select_quantized(g, r); }).find("recipe include pattern 'maxpool' matches only layers that are never quantized"),
            std::string::npos);
  r.include = {"linear"};  // an op name selects every node of that op
  r.defaults.classifier = false;
  r.defaults.max_small_channels = 0;
  r.parts.clear();
  EXPECT_EQ(names(g, quant::select_quantized(g, r).quantized), std::vector<std::string>{"fc"});
  r = Recipe{};
  r.exclude = {"*.conv9"};
  EXPECT_NE(error_of([&] { quant::select_quantized(g, r); }).find("recipe exclude pattern '*.conv9'"), std::string::npos);
  r.exclude.clear();
  r.parts = {"layer*"};
  EXPECT_NE(error_of([&] { quant::select_quantized(g, r); }).find("not a part name"), std::string::npos);
  r.parts = {"all"};
  r.precision = DType::F16;
  EXPECT_NE(error_of([&] { quant::select_quantized(g, r); }).find("recipes quantize to fp8 e4m3 or int8"), std::string::npos);
}

TEST(QuantSelect, ResNetDeepStemAndRes2NetChunks) {
  const Graph d = fixture("res2net", "res2net_d", "timm_res2net");
  auto s = select(d, Recipe{}, true);
  for (const char* stem : {"conv1.0", "conv1.3", "conv1.6"})
    EXPECT_EQ(reason_of(d, s, stem), "default exclusion: stem (defaults.stem)") << stem;
  EXPECT_EQ(reason_of(d, s, "layer1.0.conv1"), "(quantized or not a candidate)");

  // Res2Net's 3x3 chunk convs are narrow (6 or 9 channels in s4_26w): the default keeps them 16-bit.
  const Graph g = fixture("res2net", "s4_26w", "timm_res2net");
  s = select(g, Recipe{});
  EXPECT_NE(reason_of(g, s, "layer2.1.convs.1").find("6 input channels <= 16"), std::string::npos);
  const auto q = names(g, s.quantized);
  EXPECT_NE(std::find(q.begin(), q.end(), "layer1.0.conv1"), q.end());
  EXPECT_NE(std::find(q.begin(), q.end(), "layer4.0.conv3"), q.end());
  Recipe r;
  r.parts = {"layer3.0"};  // a block is a prefix too
  EXPECT_EQ(select(g, r, true).quantized.size(), 6u);  // downsample, conv1, convs.0-2, conv3
}

TEST(QuantSelect, EfficientNetStemHeadDepthwiseAndStages) {
  const Graph g = fixture("efficientnet", "b0_narrow", "timm_efficientnet");
  Recipe r;
  r.defaults.max_small_channels = 0;
  auto s = select(g, r);
  EXPECT_EQ(reason_of(g, s, "conv_stem"), "default exclusion: stem (defaults.stem)");
  EXPECT_EQ(reason_of(g, s, "classifier"), "default exclusion: classifier (defaults.classifier)");
  int depthwise = 0;
  for (const auto& e : s.excluded)
    if (e.reason == "default exclusion: depthwise conv (defaults.depthwise)") {
      ++depthwise;
      EXPECT_NE(g.nodes[e.node].name.find("conv_dw"), std::string::npos) << g.nodes[e.node].name;
    }
  int conv_dw = 0;
  for (const Node& n : g.nodes) conv_dw += n.name.find(".conv_dw") != std::string::npos;
  EXPECT_EQ(depthwise, conv_dw);
  EXPECT_GT(depthwise, 0);
  // Squeeze-excitation's convs read a 1x1 map: excluded by defaults.pooled, selected without it.
  int se = 0;
  for (const Node& n : g.nodes)
    if (n.name.find(".se.conv_") != std::string::npos) {
      ++se;
      EXPECT_EQ(reason_of(g, s, n.name), "default exclusion: squeeze-excitation conv after a global pool (defaults.pooled)");
    }
  EXPECT_GT(se, 0);
  r.defaults.pooled = false;
  const auto with_se = quant::select_quantized(g, r);
  EXPECT_EQ(with_se.quantized.size(), s.quantized.size() + size_t(se));
  r.defaults.pooled = true;

  r.parts = {"head"};
  EXPECT_EQ(names(g, quant::select_quantized(g, r).quantized), std::vector<std::string>{"conv_head"});
  r.parts = {"blocks.3"};
  r.defaults.depthwise = false;
  s = quant::select_quantized(g, r);
  ASSERT_FALSE(s.quantized.empty());
  for (int i : s.quantized) EXPECT_EQ(g.nodes[i].name.rfind("blocks.3.", 0), 0u) << g.nodes[i].name;
  r.parts = {"blocks.9"};
  const std::string e = error_of([&] { quant::select_quantized(g, r); });
  EXPECT_NE(e.find("blocks.0, blocks.1"), std::string::npos) << e;
  // The stock small-channel rule: this narrow fixture's SE convs (2-4 channels) stay 16-bit.
  s = quant::select_quantized(g, Recipe{});
  EXPECT_NE(reason_of(g, s, "blocks.1.0.se.conv_reduce").find("output channels <= 16"), std::string::npos);
}

TEST(QuantSelect, FamilyPartTablesAndStructuralStemAndClassifier) {
  // A graph whose names no table knows: the conv reading the input is the
  // stem, the linear producing the output is the classifier.
  Graph g;
  std::mt19937 rng(7);
  const int x = g.add_input("x", DType::F32, {1, 32, 4, 4});
  auto conv = [&](const std::string& name, int in, int64_t c_in, int64_t c_out, int64_t groups) {
    const int w = g.add_constant(name + ".weight", testing::random_tensor({c_out, c_in / groups, 3, 3}, rng));
    return g.add_node(Op::Conv2d, name, {in, w},
                      {{"strides", std::vector<int64_t>{1, 1}}, {"pads", std::vector<int64_t>{1, 1, 1, 1}}, {"groups", groups}});
  };
  int y = conv("first", x, 32, 32, 1);
  y = conv("enc.dw", y, 32, 32, 32);
  y = conv("enc.pw", y, 32, 32, 1);
  y = g.add_node(Op::GlobalAvgPool, "pool", {y});
  y = g.add_node(Op::Flatten, "flat", {y});
  const int w = g.add_constant("out.weight", testing::random_tensor({32, 32}, rng));
  g.mark_output(g.add_node(Op::Linear, "out", {y, w}));
  const auto s = select(g, Recipe{});
  EXPECT_EQ(names(g, s.quantized), std::vector<std::string>{"enc.pw"});
  EXPECT_EQ(reason_of(g, s, "first"), "default exclusion: stem (defaults.stem)");
  EXPECT_EQ(reason_of(g, s, "enc.dw"), "default exclusion: depthwise conv (defaults.depthwise)");
  EXPECT_EQ(reason_of(g, s, "out"), "default exclusion: classifier (defaults.classifier)");

  // A family's table names its own parts (RT-DETR's linear groups, say).
  Recipe r;
  r.parts = {"encoder"};
  r.defaults.depthwise = false;
  const quant::PartTable table = {{"encoder", {"enc.*"}}};
  EXPECT_EQ(names(g, quant::select_quantized(g, r, table).quantized), (std::vector<std::string>{"enc.dw", "enc.pw"}));
  const std::string e = error_of([&] { quant::select_quantized(g, Recipe{.parts = {"decoder"}}, table); });
  EXPECT_NE(e.find("parts: all, stem, classifier, head, encoder"), std::string::npos) << e;
}

// The recipe files the families ship (families/<family>/recipes/*.json, used
// by tools/gpu/study.sh's recipe variants) read under the strict reader and
// round-trip.
TEST(QuantRecipe, FamilyRecipeFilesRead) {
  namespace fs = std::filesystem;
  int files = 0;
  for (const auto& fam : fs::directory_iterator(fs::path(KILN_SOURCE_DIR) / "families")) {
    const fs::path dir = fam.path() / "recipes";
    if (!fs::is_directory(dir)) continue;
    for (const auto& f : fs::directory_iterator(dir)) {
      if (f.path().extension() != ".json") continue;
      const Recipe r = quant::read_recipe(f.path().string());
      EXPECT_EQ(quant::parse_recipe(quant::recipe_to_json(r), "again.json"), r) << f.path();
      ++files;
    }
  }
  EXPECT_GE(files, 2);
}

}  // namespace
}  // namespace kiln
