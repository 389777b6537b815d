// 8-bit engines on the CPU (issue 13): the quantized layer's arithmetic on
// hand-computed values (ties to even, saturation, -0, NaN; int8 rounding and
// clamping), one hand-computed quantized linear through the reference and the
// CPU backend, the quantize pass's structure, and `kiln build --quantize`
// on the seeded fixtures against their fp32 engines (top-1 agreement and
// logits cosine over the fixture images), the scales file round trip and the
// refusals.
#include <gtest/gtest.h>

#include "backends/backend.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "backends/cpu/ref/ref.hpp"
#include "bundle/builder.hpp"
#include "bundle/bundle.hpp"
#include "graph_test_util.hpp"
#include "ir/quant_form.hpp"
#include "ir/serialize.hpp"
#include "kiln/kiln.hpp"
#include "quant/calib_images.hpp"
#include "quant/layer.hpp"
#include "temp_dir.hpp"

namespace kiln {
namespace {

namespace fs = std::filesystem;

quant::LayerEpilogue unit_epilogue(DType out, Activation act = Activation::None) {
  quant::LayerEpilogue e;
  e.out = out;
  e.act = act;
  e.alpha = {1.f};
  e.bias = {0.f};
  return e;
}

TEST(QuantLayer, E4m3OutputRoundsTiesToEvenAndSaturates) {
  const quant::LayerEpilogue e = unit_epilogue(DType::F8E4M3);
  EXPECT_EQ(e.apply(0, 17.0, nullptr), 16.f);  // between 16 (mantissa 000) and 18 (001): the even one
  EXPECT_EQ(e.apply(0, 19.0, nullptr), 20.f);  // between 18 (001) and 20 (010)
  EXPECT_EQ(e.apply(0, 17.0001, nullptr), 18.f);
  EXPECT_EQ(e.apply(0, 0.6875, nullptr), 0.6875f);  // exact: 1.011 x 2^-1
  EXPECT_EQ(e.apply(0, 440.0, nullptr), 448.f);     // between 416 and 448: nearer 448
  EXPECT_EQ(e.apply(0, 500.0, nullptr), 448.f);     // saturates, no NaN
  EXPECT_EQ(e.apply(0, -1e30, nullptr), -448.f);
  EXPECT_EQ(e.apply(0, std::ldexp(1.0, -10), nullptr), 0.f);  // half the smallest subnormal: tie to 0
  EXPECT_EQ(e.apply(0, 3 * std::ldexp(1.0, -11), nullptr), std::ldexp(1.f, -9));
  quant::LayerEpilogue neg = e;
  neg.bias = {-0.f};
  const float z = neg.apply(0, -0.0, nullptr);  // fma(-0, 1, -0) = -0: code 0x80
  EXPECT_EQ(z, 0.f);
  EXPECT_TRUE(std::signbit(z));
  EXPECT_TRUE(std::isnan(e.apply(0, NAN, nullptr)));  // NaN stays NaN (code 0x7f)
  EXPECT_EQ(unit_epilogue(DType::F8E4M3, Activation::Relu).apply(0, -3.0, nullptr), 0.f);
}

TEST(QuantLayer, Int8OutputRoundsHalfEvenAndClampsFullRange) {
  const quant::LayerEpilogue e = unit_epilogue(DType::I8);
  EXPECT_EQ(e.apply(0, 2.5, nullptr), 2.f);
  EXPECT_EQ(e.apply(0, 3.5, nullptr), 4.f);
  EXPECT_EQ(e.apply(0, -2.5, nullptr), -2.f);
  EXPECT_EQ(e.apply(0, 200.0, nullptr), 127.f);
  EXPECT_EQ(e.apply(0, -200.0, nullptr), -128.f);  // activations use [-128, 127]
  EXPECT_EQ(e.apply(0, NAN, nullptr), 0.f);         // cvt.rni.sat.s8.f32 gives 0
}

// linear: x codes [1.5, -2] at s_x 0.5, w codes [[3, 0.25]] at s_w 2, bias 1:
// acc = 4.5 - 0.5 = 4, alpha = 1, y = 4 + 1 = 5 (wide). With an e4m3 output
// at s_y = 3 (folded): fma(4, 1/3, 1/3) = 1.6666666 -> 1.625 (of 1.625, 1.75).
// An e4m3 graph input with one scale, and an e4m3 weight whose codes are
// `codes` (exact e4m3 values) with one scale per output channel of `scale`.
int e4m3_input(Graph& g, const std::string& name, const Shape& shape, float scale) {
  const int x = g.add_input(name, DType::F8E4M3, shape);
  g.values[x].quant = QuantParams{{scale}, -1, DType::F8E4M3};
  return x;
}
int e4m3_weight(Graph& g, const Shape& shape, const std::vector<float>& codes, float scale) {
  const HostTensor wf = HostTensor::from_f32(shape, codes);
  const int w = g.add_constant("w", quant::quantize_tensor(wf, QuantParams{{1.f}, 0, DType::F8E4M3}, quant::Int8Range::Narrow));
  g.values[w].quant = QuantParams{{scale}, 0, DType::F8E4M3};
  return w;
}

Graph hand_linear(DType out) {
  Graph g;
  const int x = e4m3_input(g, "x", {1, 2}, 0.5f);
  const int w = e4m3_weight(g, {1, 2}, {3.f, 0.25f}, 2.f);
  const int b = g.add_constant("b", HostTensor::from_f32({1}, {1.f}));
  const int y = g.add_node(Op::Linear, "fc", {x, w, b}, {{"out_dtype", std::string(dtype_name(out))}});
  if (is_8bit(out)) g.values[y].quant = QuantParams{{3.f}, -1, out};
  g.mark_output(y);
  return g;
}

TEST(QuantLayer, HandComputedLinearOnReferenceAndCpuBackend) {
  for (DType out : {DType::F32, DType::F8E4M3}) {
    const Graph g = hand_linear(out);
    const float want = out == DType::F32 ? 5.f : 1.625f;  // the 8-bit output in code units
    const auto r = ref::run_reference_graph(g, {{1.5f, -2.f}});
    const auto c = testing::run_cpu(g, {{1.5f, -2.f}});
    EXPECT_EQ(r[0][0], want) << dtype_name(out);
    EXPECT_EQ(c[0][0], want) << dtype_name(out);
  }
}

// A 1x1 conv with an 8-bit residual: x code 1.5 at s_x 0.5, w code 2 at s_w
// 1, bias 1, residual code 3 at s_r 0.25: acc = 3, alpha = 0.5, y = 1.5 + 1 +
// 3 * 0.25 = 3.25 (wide); with an e4m3 output at s_y 0.5 (folded): 6.5 -> 6.5.
// A residual of another code type, or one without scales, is refused by name.
Graph hand_conv_residual8(DType out) {
  Graph g;
  const int x = e4m3_input(g, "x", {1, 1, 1, 1}, 0.5f);
  const int w = e4m3_weight(g, {1, 1, 1, 1}, {2.f}, 1.f);
  const int b = g.add_constant("b", HostTensor::from_f32({1}, {1.f}));
  const int r = e4m3_input(g, "skip", {1, 1, 1, 1}, 0.25f);
  const int y = g.add_node(Op::Conv2d, "conv3", {x, w, b, r}, {{"out_dtype", std::string(dtype_name(out))}});
  if (is_8bit(out)) g.values[y].quant = QuantParams{{0.5f}, -1, out};
  g.mark_output(y);
  return g;
}

TEST(QuantLayer, EightBitResidualAddsCodeTimesScale) {
  for (DType out : {DType::F32, DType::F8E4M3}) {
    const Graph g = hand_conv_residual8(out);
    const float want = out == DType::F32 ? 3.25f : 6.5f;  // the 8-bit output in code units
    const auto r = ref::run_reference_graph(g, {{1.5f}, {3.f}});
    const auto c = testing::run_cpu(g, {{1.5f}, {3.f}});
    EXPECT_EQ(r[0][0], want) << dtype_name(out);
    EXPECT_EQ(c[0][0], want) << dtype_name(out);
  }
  Graph g = hand_conv_residual8(DType::F32);
  g.values[g.nodes[0].inputs[3]].quant.reset();
  EXPECT_NE(quant_node_problem(g, g.nodes[0]).find("conv3: 8-bit value 'skip' (f8e4m3) has no quantization scales"),
            std::string::npos) << quant_node_problem(g, g.nodes[0]);
  Graph h = hand_conv_residual8(DType::F32);
  h.values[h.nodes[0].inputs[3]].dtype = DType::I8;
  h.values[h.nodes[0].inputs[3]].quant = QuantParams{{0.25f}, -1, DType::I8};
  EXPECT_NE(quant_node_problem(h, h.nodes[0]).find("conv3: residual 'skip' is i8 but the layer reads f8e4m3 codes"),
            std::string::npos) << quant_node_problem(h, h.nodes[0]);
}

TEST(QuantForm, RulesAndVerifierNameTheProblem) {
  Graph g = hand_linear(DType::F8E4M3);
  g.values[g.outputs[0]].quant.reset();
  EXPECT_NE(quant_node_problem(g, g.nodes[0]).find("fc: 8-bit value 'fc' (f8e4m3) has no quantization scales"), std::string::npos)
      << quant_node_problem(g, g.nodes[0]);
  Graph h = hand_linear(DType::F32);
  h.nodes[0].attrs.erase("out_dtype");
  EXPECT_NE(testing::error_of([&] { h.infer_shapes(); }).find("fc: quantized layer without attribute out_dtype"), std::string::npos);
  Graph k = hand_linear(DType::F32);
  k.nodes[0].attrs["out_dtype"] = std::string("i8");
  EXPECT_NE(testing::error_of([&] { k.infer_shapes(); }).find("out_dtype 'i8' must be f32, f16, bf16 or f8e4m3"), std::string::npos);
}

// ---------------------------------------------------------------- kiln build

const fs::path kFixtures = fs::path(KILN_SOURCE_DIR) / "tests" / "fixtures";

// The fixture images (jpg and png of six photos, plus two small pngs) copied into one folder.
fs::path calib_dir(const testing::TempDir& t) {
  const fs::path d = t.path() / "calib";
  fs::create_directories(d);
  for (const auto& e : fs::directory_iterator(kFixtures / "images" / "images")) {
    const auto ext = e.path().extension();
    if (ext == ".jpg" || ext == ".png") fs::copy_file(e.path(), d / e.path().filename());
  }
  return d;
}

BuildOptions options(const std::string& model) {
  BuildOptions o;
  o.model = (kFixtures / model).string();
  o.verify = true;
  return o;
}

struct Agreement {
  double top1 = 0, min_cosine = 1;
  int images = 0;
};

Agreement compare(const fs::path& wide, const fs::path& q8, const fs::path& images) {
  Classifier a(Engine::load(wide.string())), b(Engine::load(q8.string()));
  Agreement r;
  int same = 0;
  for (const auto& f : quant::calibration_images(images, 0)) {
    const auto x = a.classify_file(f.string(), 1), y = b.classify_file(f.string(), 1);
    double dot = 0, na = 0, nb = 0;
    for (size_t i = 0; i < x.logits.size(); ++i) dot += double(x.logits[i]) * y.logits[i], na += double(x.logits[i]) * x.logits[i], nb += double(y.logits[i]) * y.logits[i];
    r.min_cosine = std::min(r.min_cosine, dot / std::sqrt(na * nb));
    same += x.top_k[0].class_id == y.top_k[0].class_id;
    ++r.images;
  }
  r.top1 = double(same) / r.images;
  return r;
}

struct FixtureCase {
  const char* model;
  const char* quantize;
  double min_top1, min_cosine;
};

// The floors sit below what the run gives (printed, and in docs/quantization.md).
TEST(QuantBuild, FixturesAgreeWithTheirFp32Engines) {
  const FixtureCase cases[] = {
      // Measured (8-bit residuals, the recipe default): 0.929/0.99260, 1.0/0.99946, 0.786/0.99800,
      // 0.929/0.99877, 1.0/0.99971, 1.0/0.99998. res2net fp8's top-1 went 1.0 -> 0.786 with the
      // 8-bit skips at the same cosine: three photos whose fp32 top two classes lie within a few
      // hundredths (scores ~0.24 of 10 near-flat classes) flip; the cosine floor is the real bound.
      {"resnet/bottleneck", "fp8", 0.85, 0.99},      {"resnet/bottleneck", "int8", 0.85, 0.995},
      {"res2net/s4_26w", "fp8", 0.75, 0.995},        {"res2net/s4_26w", "int8", 0.85, 0.995},
      {"efficientnet/b0_narrow", "fp8", 0.85, 0.999}, {"efficientnet/b0_narrow", "int8", 0.85, 0.999},
  };
  testing::TempDir t;
  const fs::path images = calib_dir(t);
  for (const FixtureCase& c : cases) {
    const std::string tag = std::string(c.model).replace(std::string(c.model).find('/'), 1, "_");
    const fs::path wide = t.path() / (tag + ".bundle"), q8 = t.path() / (tag + "_" + c.quantize + ".bundle");
    if (!fs::exists(wide)) build_bundle(options(c.model), wide);
    BuildOptions o = options(c.model);
    o.quantize = c.quantize;
    o.calib = images.string();
    build_bundle(o, q8);
    const Bundle b = Bundle::open(q8);
    const Graph g = deserialize_graph(b.section_text("graph.json"), b.section("weights.bin"), q8.string());
    EXPECT_GT(std::count_if(g.nodes.begin(), g.nodes.end(), [&](const Node& n) { return is_quantized_layer(g, n); }), 0)
        << c.model;
    const Agreement a = compare(wide, q8, images);
    std::printf("[quant] %s %s: top-1 agreement %.3f over %d images, min logits cosine %.5f\n", c.model, c.quantize, a.top1,
                a.images, a.min_cosine);
    EXPECT_GE(a.top1, c.min_top1) << c.model << " " << c.quantize;
    EXPECT_GE(a.min_cosine, c.min_cosine) << c.model << " " << c.quantize;
  }
}

std::string section(const fs::path& bundle, const std::string& name) {
  return Bundle::open(bundle).section_text(name);
}

TEST(QuantBuild, GraphFormScalesRoundTripAndProvenance) {
  testing::TempDir t;
  const fs::path images = calib_dir(t);
  BuildOptions o = options("resnet/bottleneck");
  o.quantize = "fp8";
  o.calib = images.string();
  o.calib_method = "percentile";
  o.percentile = 99.9;
  o.calib_images = 4;
  o.write_scales = (t.path() / "scales.json").string();
  build_bundle(o, t.path() / "a.bundle");
  // The same scales from the file give the same engine, byte for byte in graph and weights.
  BuildOptions again = options("resnet/bottleneck");
  again.quantize = "fp8";
  again.scales = o.write_scales;
  build_bundle(again, t.path() / "b.bundle");
  EXPECT_EQ(section(t.path() / "a.bundle", "graph.json"), section(t.path() / "b.bundle", "graph.json"));
  EXPECT_EQ(section(t.path() / "a.bundle", "weights.bin"), section(t.path() / "b.bundle", "weights.bin"));

  const auto prov = nlohmann::json::parse(section(t.path() / "a.bundle", "provenance.json"))["quantization"];
  EXPECT_EQ(prov["precision"], "fp8");
  EXPECT_EQ(prov["recipe"]["calibration"]["method"], "percentile");
  EXPECT_EQ(prov["activation_scales"]["batches"], 4);
  // Default exclusions on this fixture: the stem, the classifier and every layer of <= 16 channels.
  EXPECT_TRUE(prov["excluded"].contains("conv1"));
  EXPECT_TRUE(prov["excluded"].contains("fc"));
  const auto all = nlohmann::json::parse(section(t.path() / "a.bundle", "quant_scales.json"));
  EXPECT_EQ(all["activations"], prov["activation_scales"]);
  EXPECT_FALSE(all.contains("weights")) << "weight scales are kept once, in graph.json";

  const Bundle bundle = Bundle::open(t.path() / "a.bundle");
  const Graph g = deserialize_graph(bundle.section_text("graph.json"), bundle.section("weights.bin"), "a.bundle");
  int quantized = 0, eight_bit_out = 0;
  for (const Node& n : g.nodes) {
    if (!is_quantized_layer(g, n)) continue;
    ++quantized;
    const Value& w = g.values[n.inputs[1]];
    EXPECT_EQ(w.dtype, DType::F8E4M3) << n.name;
    ASSERT_TRUE(w.quant) << n.name;
    EXPECT_EQ(w.quant->axis, 0) << n.name;
    EXPECT_EQ(w.quant->scales.size(), static_cast<size_t>(w.shape[0])) << n.name;
    eight_bit_out += is_8bit(g.values[n.outputs[0]].dtype);
  }
  EXPECT_EQ(quantized, static_cast<int>(prov["quantized"].size()));
  // layer3.0.conv1 -> conv2 -> conv3 stay 8-bit between them: the output quantize is folded.
  const Node* c1 = g.find_node("layer3.0.conv1");
  ASSERT_NE(c1, nullptr);
  EXPECT_EQ(g.values[c1->outputs[0]].dtype, DType::F8E4M3);
  EXPECT_GE(eight_bit_out, 2);
}

// The recipe's "residuals": "8bit" (the default) lets layer4.0's downsample
// write codes that layer4.0.conv3's epilogue adds as its residual (no quantize
// node for it); "wide" keeps that residual wide. Both agree with the fp32
// engine within the floors of FixturesAgreeWithTheirFp32Engines.
TEST(QuantBuild, EightBitResidualsAndTheWideRecipe) {
  testing::TempDir t;
  const fs::path images = calib_dir(t);
  std::ofstream(t.path() / "wide.json") << R"({"format": 1, "precision": "fp8", "residuals": "wide"})";
  const auto build = [&](const std::string& name, const std::string& recipe) {
    BuildOptions o = options("resnet/bottleneck");
    o.quantize = recipe == "fp32" ? "" : "fp8";
    if (!o.quantize.empty()) o.calib = images.string(), o.recipe = recipe;
    return build_bundle(o, t.path() / name);
  };
  const BuildSummary eight = build("a.bundle", ""), wide = build("w.bundle", (t.path() / "wide.json").string());
  build("f.bundle", "fp32");
  const auto graph_of = [&](const std::string& name) {
    const Bundle b = Bundle::open(t.path() / name);
    return deserialize_graph(b.section_text("graph.json"), b.section("weights.bin"), name);
  };
  const Graph a = graph_of("a.bundle"), w = graph_of("w.bundle");
  const auto residual_of = [](const Graph& g) -> const Value& {
    const Node* n = g.find_node("layer4.0.conv3");
    if (!n || n->inputs.size() < 4) fail_runtime("layer4.0.conv3 has no residual input");
    return g.values[n->inputs[3]];
  };
  const Value& r8 = residual_of(a);
  EXPECT_EQ(r8.dtype, DType::F8E4M3);
  ASSERT_TRUE(r8.quant);
  EXPECT_EQ(r8.quant->scales.size(), 1u);
  ASSERT_GE(r8.producer, 0);
  EXPECT_EQ(a.nodes[r8.producer].name.rfind("layer4.0.downsample", 0), 0u) << a.nodes[r8.producer].name;
  EXPECT_EQ(a.nodes[r8.producer].attr_str("out_dtype"), "f8e4m3");
  EXPECT_EQ(residual_of(w).dtype, DType::F32);
  // The residual-only reader adds no quantize node either way (a residual alone
  // is never quantized by a node), so the saving is layers writing codes (both downsamples here).
  const auto quantize_nodes = [](const BuildSummary& s) { return s.op_counts.count("quantize") ? s.op_counts.at("quantize") : 0; };
  EXPECT_EQ(quantize_nodes(eight), quantize_nodes(wide));
  const auto code_writers = [](const Graph& g) {
    int k = 0;
    for (const Node& n : g.nodes) k += n.has_attr("out_dtype") && n.attr_str("out_dtype") == "f8e4m3";
    return k;
  };
  EXPECT_GT(code_writers(a), code_writers(w));
  const auto prov = nlohmann::json::parse(Bundle::open(t.path() / "w.bundle").section_text("provenance.json"))["quantization"];
  EXPECT_EQ(prov["recipe"]["residuals"], "wide");
  for (const char* q : {"a.bundle", "w.bundle"}) {
    const Agreement g = compare(t.path() / "f.bundle", t.path() / q, images);
    std::printf("[quant] resnet/bottleneck fp8 %s: top-1 agreement %.3f, min logits cosine %.5f\n", q, g.top1, g.min_cosine);
    EXPECT_GE(g.top1, 0.85) << q;
    EXPECT_GE(g.min_cosine, 0.99) << q;
  }
}

TEST(QuantBuild, RecipePartsSelectTheExpectedLayers) {
  testing::TempDir t;
  const fs::path images = calib_dir(t);
  std::ofstream(t.path() / "r.json") << R"({"format": 1, "precision": "int8", "parts": ["all", "no-layer4"], "include": ["layer4.0.conv3"]})";
  BuildOptions o = options("resnet/bottleneck");
  o.quantize = "int8";
  o.calib = images.string();
  o.calib_images = 2;
  o.recipe = (t.path() / "r.json").string();
  build_bundle(o, t.path() / "r.bundle");
  const auto prov = nlohmann::json::parse(Bundle::open(t.path() / "r.bundle").section_text("provenance.json"))["quantization"];
  // layer1/2's block convs are <= 16 channels wide (default exclusion), their
  // downsamples (64->32, 32->64) are not; layer4 is removed but for its conv3.
  const std::vector<std::string> want = {"layer1.0.downsample.0", "layer2.0.downsample.0", "layer3.0.downsample.0", "layer3.0.conv1", "layer3.0.conv2", "layer3.0.conv3",
                                         "layer4.0.conv3"};
  std::vector<std::string> got = prov["quantized"].get<std::vector<std::string>>();
  std::sort(got.begin(), got.end());
  std::vector<std::string> sorted = want;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(got, sorted);
  EXPECT_EQ(prov["excluded"]["layer4.0.conv1"], "removed by part 'no-layer4'");
}

TEST(QuantBuild, RefusesClearly) {
  testing::TempDir t;
  const fs::path images = calib_dir(t);
  auto refusal = [&](const std::function<void(BuildOptions&)>& edit, const std::string& model = "resnet/bottleneck") {
    BuildOptions o = options(model);
    o.quantize = "fp8";
    o.calib = images.string();
    edit(o);
    const fs::path out = t.path() / "refused.bundle";
    const std::string why = testing::error_of([&] { build_bundle(o, out); });
    EXPECT_FALSE(fs::exists(out)) << why;
    return why;
  };
  auto has = [](const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; };
  // A precision other than fp8 / int8, and a backend with no 8-bit kernels, are refused by name.
  EXPECT_TRUE(has(refusal([](BuildOptions& o) { o.quantize = "int4"; }), "int4"));
  const std::string tpu = refusal([](BuildOptions& o) { o.backend = "tpu"; });
  EXPECT_TRUE(has(tpu, "tpu")) << tpu;
  EXPECT_TRUE(has(refusal([](BuildOptions& o) { o.calib.clear(); }), "exactly one of --calib DIR and --scales FILE"));
  EXPECT_TRUE(has(refusal([&](BuildOptions& o) { o.calib = (t.path() / "nope").string(); }), "nope: not a folder"));
  auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream(t.path() / name) << text;
    return (t.path() / name).string();
  };
  const std::string none = write("none.json", R"({"format": 1, "precision": "fp8", "parts": ["all"], "exclude": ["conv2d"]})");
  EXPECT_TRUE(has(refusal([&](BuildOptions& o) { o.recipe = none; }), "the recipe quantizes no layer"));
  const std::string typo = write("typo.json", R"({"format": 1, "precision": "fp8", "parts": ["layer9"]})");
  EXPECT_TRUE(has(refusal([&](BuildOptions& o) { o.recipe = typo; }), "recipe part 'layer9' names no conv or linear layer"));
  const std::string int8 = write("int8.json", R"({"format": 1, "precision": "int8"})");
  EXPECT_TRUE(has(refusal([&](BuildOptions& o) { o.recipe = int8; }), "recipe " + int8 + " says precision 'int8'"));
  // A scales file made for another model: its first unknown value is named.
  BuildOptions other = options("efficientnet/b0_narrow");
  other.quantize = "fp8";
  other.calib = images.string();
  other.calib_images = 2;
  other.write_scales = (t.path() / "effnet_scales.json").string();
  build_bundle(other, t.path() / "effnet.bundle");
  const std::string why = refusal([&](BuildOptions& o) {
    o.calib.clear();
    o.scales = other.write_scales;
  });
  EXPECT_TRUE(has(why, "is not in this model's graph (a scales file for another model?)")) << why;
}

}  // namespace
}  // namespace kiln
