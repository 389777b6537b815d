// The fusion passes (fuse_conv_input_add, fuse_squeeze_excitation,
// fuse_split_runs): before/after on small graphs built in code and on the
// family fixtures, what each refuses to mark, that marks change no number,
// that the verifier (so graph.json loading) refuses marks that do not
// describe the graph, and that bundles from before marks get them at load.
#include <gtest/gtest.h>

#include <random>

#include "bundle/builder.hpp"
#include "bundle/bundle.hpp"
#include "core/error.hpp"
#include "family_test_util.hpp"
#include "graph_test_util.hpp"
#include "ir/fusion_marks.hpp"
#include "ir/serialize.hpp"
#include "ir/verifier.hpp"
#include "kiln/kiln.hpp"
#include "passes/pass.hpp"
#include "runtime/engine_impl.hpp"

namespace kiln {
namespace {

namespace fs = std::filesystem;
using testing::random_tensor;

Attrs conv3x3() {
  return {{"strides", std::vector<int64_t>{1, 1}}, {"pads", std::vector<int64_t>{1, 1, 1, 1}}, {"groups", int64_t{1}}};
}

int conv(Graph& g, const std::string& name, int x, int64_t c, std::mt19937& rng, Attrs a = conv3x3()) {
  const int w = g.add_constant(name + ".weight", random_tensor({c, g.values[x].shape[1], 3, 3}, rng, -0.3f, 0.3f));
  const int b = g.add_constant(name + ".bias", random_tensor({c}, rng));
  return g.add_node(Op::Conv2d, name, {x, w, b}, std::move(a));
}

// a, b -> add -> conv (the Res2Net chain); `edit` spoils it in one way.
enum class Spoil { None, Activation, TwoReaders, GraphOutput, ConstantOperand, AlsoResidual };
Graph chain(Spoil spoil, std::mt19937& rng) {
  Graph g;
  const int a = g.add_input("a", DType::F32, {2, 8, 5, 5});
  const int b = spoil == Spoil::ConstantOperand ? g.add_constant("b", random_tensor({2, 8, 5, 5}, rng))
                                                : g.add_input("b", DType::F32, {2, 8, 5, 5});
  Attrs add_attrs;
  if (spoil == Spoil::Activation) add_attrs["activation"] = std::string("relu");
  const int sum = g.add_node(Op::Add, "chain", {a, b}, add_attrs);
  int y = conv(g, "conv", sum, 8, rng);
  if (spoil == Spoil::AlsoResidual) {
    g.nodes.back().inputs.push_back(sum);
    g.invalidate_uses();
  }
  g.mark_output(y);
  if (spoil == Spoil::TwoReaders) g.mark_output(conv(g, "other", sum, 8, rng));
  if (spoil == Spoil::GraphOutput) g.mark_output(sum);
  g.canonicalize();
  return g;
}

const Node& node(const Graph& g, const std::string& name) {
  const Node* n = g.find_node(name);
  if (!n) throw std::runtime_error("no node " + name);
  return *n;
}

TEST(FusionPasses, ConvInputAddMarksTheChainAndChangesNoNumber) {
  std::mt19937 rng(1);
  Graph g = chain(Spoil::None, rng);
  std::vector<std::vector<float>> in = {random_tensor({2, 8, 5, 5}, rng).to_f32(), random_tensor({2, 8, 5, 5}, rng).to_f32()};
  const auto before = testing::run_cpu(g, in);
  EXPECT_EQ(fuse_conv_input_add(g), 1);
  EXPECT_EQ(node(g, "conv").attr_int(kMarkInputAdd), 1);
  EXPECT_EQ(g.nodes.size(), 2u) << "a mark, not a rewrite";
  verify_graph(g, "test");
  EXPECT_EQ(fuse_conv_input_add(g), 0) << "idempotent";
  // The CPU backend reads the mark: the add runs inside the conv.
  const cpu::PrologueAdds adds = cpu::plan_prologue_adds(g);
  EXPECT_EQ(adds.count, 1);
  EXPECT_EQ(testing::run_cpu(g, in), before);
}

TEST(FusionPasses, ConvInputAddRefusesWhatItCannotFuse) {
  std::mt19937 rng(2);
  for (Spoil s : {Spoil::Activation, Spoil::TwoReaders, Spoil::GraphOutput, Spoil::ConstantOperand, Spoil::AlsoResidual}) {
    Graph g = chain(s, rng);
    EXPECT_EQ(fuse_conv_input_add(g), 0) << static_cast<int>(s);
    EXPECT_EQ(cpu::plan_prologue_adds(g).count, 0) << static_cast<int>(s);
  }
}

// x -> global pool -> 1x1 conv + relu -> 1x1 conv + sigmoid -> mul(x, gate).
Graph squeeze_excitation(std::mt19937& rng, bool gate_read_twice) {
  Graph g;
  const int x = g.add_input("x", DType::F32, {2, 12, 4, 4});
  const int pooled = g.add_node(Op::GlobalAvgPool, "pool", {x});
  auto pointwise = [&](const std::string& name, int in, int64_t c, const char* act) {
    const int w = g.add_constant(name + ".weight", random_tensor({c, g.values[in].shape[1], 1, 1}, rng));
    const int b = g.add_constant(name + ".bias", random_tensor({c}, rng));
    return g.add_node(Op::Conv2d, name, {in, w, b}, {{"activation", std::string(act)}});
  };
  const int gate = pointwise("expand", pointwise("reduce", pooled, 3, "relu"), 12, "sigmoid");
  g.mark_output(g.add_node(Op::Mul, "gate", {x, gate}));
  if (gate_read_twice) g.mark_output(gate);
  return g;
}

TEST(FusionPasses, SqueezeExcitationMarksTheGate) {
  std::mt19937 rng(3);
  Graph g = squeeze_excitation(rng, false);
  const std::vector<std::vector<float>> in = {random_tensor({2, 12, 4, 4}, rng).to_f32()};
  const auto before = testing::run_cpu(g, in);
  EXPECT_EQ(fuse_squeeze_excitation(g), 1);
  EXPECT_EQ(node(g, "gate").attr_int(kMarkSqueezeExcitation), 1);
  verify_graph(g, "test");
  const auto se = squeeze_excitation_at(g, static_cast<size_t>(g.find_node("gate") - g.nodes.data()));
  ASSERT_TRUE(se.has_value());
  EXPECT_EQ(g.nodes[se->pool].name, "pool");
  EXPECT_EQ(g.nodes[se->reduce].name, "reduce");
  EXPECT_EQ(g.nodes[se->expand].name, "expand");
  EXPECT_EQ(testing::run_cpu(g, in), before);
  Graph shared = squeeze_excitation(rng, true);
  EXPECT_EQ(fuse_squeeze_excitation(shared), 0) << "the gate is also a graph output";
}

// x -> slice [0,4) [4,8) [8,12), then something else reading x, then one more slice.
Graph slices() {
  Graph g;
  const int x = g.add_input("x", DType::F32, {1, 12, 3, 3});
  std::vector<int> parts;
  for (int64_t k = 0; k < 3; ++k)
    parts.push_back(g.add_node(Op::Slice, "s" + std::to_string(k), {x},
                               {{"axis", int64_t{1}}, {"start", 4 * k}, {"end", 4 * k + 4}}));
  parts.push_back(g.add_node(Op::Activation, "act", {x}, {{"activation", std::string("relu")}}));
  parts.push_back(g.add_node(Op::Slice, "lone", {x}, {{"axis", int64_t{1}}, {"start", int64_t{2}}, {"end", int64_t{6}}}));
  g.mark_output(g.add_node(Op::Concat, "cat", parts, {{"axis", int64_t{1}}}));
  return g;
}

TEST(FusionPasses, SplitRunsMarkConsecutiveChannelSlices) {
  Graph g = slices();
  EXPECT_EQ(fuse_split_runs(g), 1);
  EXPECT_EQ(node(g, "s0").attr_int(kMarkSplitRun), 3);
  EXPECT_FALSE(node(g, "s1").has_attr(kMarkSplitRun));
  EXPECT_FALSE(node(g, "lone").has_attr(kMarkSplitRun)) << "a run of one is no run";
  EXPECT_EQ(split_run_at(g, 0).size(), 3u);
  verify_graph(g, "test");
}

// Marks that do not describe the graph are refused by the verifier, so by
// graph.json loading: a hand-edited bundle cannot make a backend fuse.
TEST(FusionPasses, VerifierRefusesMarksThatDoNotHold) {
  std::mt19937 rng(4);
  auto refused = [](Graph g, const std::string& says) {
    g.invalidate_uses();
    try {
      verify_graph(g, "test");
      ADD_FAILURE() << "accepted; expected: " << says;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
    }
  };
  {
    Graph g = chain(Spoil::TwoReaders, rng);
    g.nodes[g.find_node("conv") - g.nodes.data()].attrs[kMarkInputAdd] = int64_t{1};
    refused(g, "other readers");
  }
  {
    Graph g = chain(Spoil::Activation, rng);
    g.nodes[g.find_node("conv") - g.nodes.data()].attrs[kMarkInputAdd] = int64_t{1};
    refused(g, "has an activation");
  }
  {
    Graph g = chain(Spoil::None, rng);
    g.nodes[g.find_node("conv") - g.nodes.data()].attrs[kMarkInputAdd] = int64_t{2};
    refused(g, "must be the integer 1");
    g.nodes[g.find_node("conv") - g.nodes.data()].attrs[kMarkInputAdd] = std::string("yes");
    refused(g, "must be the integer 1");
    g.nodes[g.find_node("conv") - g.nodes.data()].attrs.erase(kMarkInputAdd);
    g.nodes[g.find_node("chain") - g.nodes.data()].attrs[kMarkInputAdd] = int64_t{1};
    refused(g, "only conv2d");
  }
  {
    Graph g = squeeze_excitation(rng, true);
    g.nodes[g.find_node("gate") - g.nodes.data()].attrs[kMarkSqueezeExcitation] = int64_t{1};
    refused(g, "other readers");
  }
  {
    Graph g = slices();
    g.nodes[g.find_node("s1") - g.nodes.data()].attrs[kMarkSplitRun] = int64_t{3};  // s1, s2, act
    refused(g, "not a channel slice of the same input");
    g.nodes[g.find_node("s1") - g.nodes.data()].attrs[kMarkSplitRun] = int64_t{1};
    refused(g, "at least 2");
    g.nodes[g.find_node("s1") - g.nodes.data()].attrs[kMarkSplitRun] = int64_t{99};
    refused(g, "runs past the last node");
  }
}

TEST(FusionPasses, MarksTravelInGraphJson) {
  std::mt19937 rng(5);
  Graph g = chain(Spoil::None, rng);
  fuse_conv_input_add(g);
  const SerializedGraph sg = serialize_graph(g);
  const Blob weights = Blob::copy_of(sg.weights.data(), sg.weights.size());
  const Graph back = deserialize_graph(sg.graph_json, weights, "test graph.json");
  EXPECT_EQ(node(back, "conv").attr_int(kMarkInputAdd), 1);
}

// The pipeline marks what the families build: every Res2Net chain conv, every
// EfficientNet SE gate, every block's chunk slices; nothing in a ResNet; and
// nothing when the switches turn the passes off.
TEST(FusionPasses, FamilyFixturesGetTheirMarks) {
  const fs::path fixtures(KILN_FIXTURES_DIR);
  for (const std::string& name : testing::fixture_cases(fixtures / "res2net")) {
    Graph g = testing::fixture_graph(fixtures / "res2net" / name, DType::F32, 0, "timm_res2net");
    int adds = 0, marked = 0, runs = 0;
    for (size_t i = 0; i < g.nodes.size(); ++i) {
      adds += g.nodes[i].op == Op::Add && g.nodes[i].name.find("chain") != std::string::npos;
      marked += input_add_of(g, i) >= 0;
      runs += g.nodes[i].has_attr(kMarkSplitRun);
    }
    if (name != "s2_48w") EXPECT_GT(adds, 0) << name;  // scale 2: one chunk conv, no chain
    EXPECT_EQ(marked, adds) << name << ": every chain add feeds a marked conv";
    EXPECT_GT(runs, 0) << name;
  }
  for (const std::string& name : testing::fixture_cases(fixtures / "efficientnet")) {
    Graph g = testing::fixture_graph(fixtures / "efficientnet" / name, DType::F16, 8, "timm_efficientnet");
    int pools = 0, gates = 0;
    for (const Node& n : g.nodes) {
      gates += n.has_attr(kMarkSqueezeExcitation);
      if (n.op == Op::GlobalAvgPool)
        for (int r : g.consumers(n.outputs[0])) pools += g.nodes[r].op == Op::Conv2d;
    }
    EXPECT_EQ(gates, pools) << name;
  }
  Graph r = testing::fixture_graph(fixtures / "resnet" / "bottleneck", DType::F32, 0, "timm_resnet");
  for (const Node& n : r.nodes) EXPECT_TRUE(n.attrs.count(kMarkInputAdd) + n.attrs.count(kMarkSplitRun) == 0) << n.name;
  // Switches off: the pipeline marks nothing.
  Checkpoint ckpt = Checkpoint::open(fixtures / "res2net" / "s4_26w");
  const ModelSource src = testing::model_source(fixtures / "res2net" / "s4_26w", ckpt);
  BuildRequest req;
  req.source = &src;
  Graph g = family_registry().select(src).build(req).graph;
  PipelineOptions po;
  po.fusions = FusionOptions{false, false, false};
  run_pipeline(g, po);
  for (const Node& n : g.nodes) EXPECT_TRUE(n.attrs.count(kMarkInputAdd) + n.attrs.count(kMarkSplitRun) == 0) << n.name;
}

// A bundle from before fusion marks (no build.fusion_marks in its provenance,
// no marks in graph.json) gets the marks its switches allow when it loads, so
// it runs fused as it did; with fuse_add off it gets no input_add marks.
TEST(FusionPasses, BundlesFromBeforeMarksAreMarkedAtLoad) {
  const fs::path dir = testing::temp_dir("premarks");
  for (const bool add_off : {false, true}) {
    BuildOptions o;
    o.model = (fs::path(KILN_FIXTURES_DIR) / "res2net" / "s4_26w").string();
    if (add_off) o.switches.set_list("fuse_add", false);
    const fs::path built = dir / (add_off ? "off.bundle" : "on.bundle");
    build_bundle(o, built);
    const Bundle b = Bundle::open(built);
    nlohmann::json graph = nlohmann::json::parse(b.section_text("graph.json"));
    int stripped = 0;
    for (auto& n : graph["nodes"])
      for (const char* k : {kMarkInputAdd, kMarkSqueezeExcitation, kMarkSplitRun}) stripped += n["attrs"].erase(k);
    EXPECT_GT(stripped, 0);
    nlohmann::json prov = nlohmann::json::parse(b.section_text("provenance.json"));
    ASSERT_EQ(prov["build"].erase("fusion_marks"), 1u);
    BundleWriter w(b.info());
    for (const auto& s : b.section_names()) {
      Blob blob = b.section(s);
      if (s == "graph.json") w.add_section(s, graph.dump());
      else if (s == "provenance.json") w.add_section(s, prov.dump());
      else w.add_section(s, std::vector<uint8_t>(blob.data, blob.data + blob.size));
    }
    const fs::path old = dir / (add_off ? "old_off.bundle" : "old_on.bundle");
    w.write(old);
    const auto fresh = Engine::load(built.string()), loaded = Engine::load(old.string());
    int marks_fresh = 0, marks_loaded = 0;
    for (size_t i = 0; i < fresh->impl().graph.nodes.size(); ++i) marks_fresh += input_add_of(fresh->impl().graph, i) >= 0;
    for (size_t i = 0; i < loaded->impl().graph.nodes.size(); ++i) marks_loaded += input_add_of(loaded->impl().graph, i) >= 0;
    EXPECT_EQ(marks_loaded, marks_fresh) << (add_off ? "fuse_add off" : "fuse_add auto");
    EXPECT_EQ(marks_fresh == 0, add_off);
    std::mt19937 rng(6);
    const auto info = fresh->inputs().at(0);
    Shape s = info.shape;
    const auto x = random_tensor(s, rng).to_f32();
    EXPECT_EQ(fresh->create_context()->run({{info.name, s, x}}).at(0).data,
              loaded->create_context()->run({{info.name, s, x}}).at(0).data);
  }
}

}  // namespace
}  // namespace kiln
