// The fusion passes (fuse_conv_input_add, fuse_squeeze_excitation,
// fuse_split_runs, fuse_channel_views): before/after on small graphs built in
// code and on the family fixtures, what each refuses to mark, that marks
// change no number, that the verifier (so graph.json loading) refuses marks
// that do not describe the graph, and that bundles from before marks get them
// at load. Channel views are checked against a copy of the planner that made
// them before they were marks.
#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <random>
#include <set>

#include "bundle/builder.hpp"
#include "bundle/bundle.hpp"
#include "core/error.hpp"
#include "family_test_util.hpp"
#include "graph_test_util.hpp"
#include "ir/fusion_marks.hpp"
#include "ir/serialize.hpp"
#include "ir/verifier.hpp"
#include "kiln/kiln.hpp"
#include "ir/quant_form.hpp"
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

// plan_channel_views as it was before channel views were marks (commit
// a50ff97), kept to check that fuse_channel_views marks exactly the views it
// made: it reads no marks.
ChannelViews views_before_marks(const Graph& g) {
  ChannelViews cv;
  cv.parent.assign(g.values.size(), -1);
  cv.channel_offset.assign(g.values.size(), 0);
  std::vector<char> fixed(g.values.size(), 0);
  for (int v : g.inputs) fixed[v] = 1;
  for (int v : g.outputs) fixed[v] = 1;
  for (size_t v = 0; v < g.values.size(); ++v)
    if (g.values[v].constant) fixed[v] = 1;
  auto channel_axis = [&](const Node& n) { return n.attr_int("axis") == 1 && g.values[n.outputs[0]].shape.size() == 4; };
  for (const Node& n : g.nodes)
    if (n.op == Op::Slice && channel_axis(n) && !fixed[n.outputs[0]]) {
      cv.parent[n.outputs[0]] = n.inputs[0];
      cv.channel_offset[n.outputs[0]] = n.attr_int("start");
      ++cv.slices_as_views;
    }
  std::vector<char> has_windows(g.values.size(), 0);
  for (size_t v = 0; v < g.values.size(); ++v)
    if (cv.parent[v] >= 0) has_windows[cv.parent[v]] = 1;
  for (const Node& n : g.nodes) {
    if (n.op != Op::Concat || !channel_axis(n)) continue;
    int64_t off = 0;
    for (int in : n.inputs) {
      if (!fixed[in] && !has_windows[in] && cv.parent[in] < 0 && g.values[in].producer >= 0 && cv.root(n.outputs[0]) != in) {
        cv.parent[in] = n.outputs[0];
        cv.channel_offset[in] = off;
        ++cv.concat_inputs_in_place;
      } else {
        ++cv.concat_inputs_copied;
      }
      off += g.values[in].shape[1];
    }
  }
  return cv;
}

void expect_same_views(const ChannelViews& got, const ChannelViews& want, const std::string& what) {
  EXPECT_EQ(got.parent, want.parent) << what;
  EXPECT_EQ(got.channel_offset, want.channel_offset) << what;
  EXPECT_EQ(got.slices_as_views, want.slices_as_views) << what;
  EXPECT_EQ(got.concat_inputs_in_place, want.concat_inputs_in_place) << what;
  EXPECT_EQ(got.concat_inputs_copied, want.concat_inputs_copied) << what;
}

// Small graphs for the channel views, built in code: [batch, 12, 5, 5] input x.
struct ViewGraph {
  explicit ViewGraph(int64_t batch = 2) : x(g.add_input("x", DType::F32, {batch, 12, 5, 5})) {}
  Graph g;
  std::mt19937 rng{7};
  int x;
  int conv(const std::string& name, int in, int64_t c) { return kiln::conv(g, name, in, c, rng); }
  int slice(const std::string& name, int in, int64_t start, int64_t end, int64_t axis = 1) {
    return g.add_node(Op::Slice, name, {in}, {{"axis", axis}, {"start", start}, {"end", end}});
  }
  int concat(const std::string& name, const std::vector<int>& ins, int64_t axis = 1) {
    return g.add_node(Op::Concat, name, ins, {{"axis", axis}});
  }
};

// The cases the old planner decided, each with the marks it must get:
// channel_view slices by name, in_place lists by concat name.
struct ViewCase {
  std::string name;
  Graph g;
  std::set<std::string> views;
  std::map<std::string, std::vector<int64_t>> in_place;
  bool runs_on_cpu = true;  // the CPU backend slices and concatenates along channels only
  // The old planner put one in place that the backends then failed to copy
  // (a value read twice by a concat): the marks do better, on purpose.
  bool old_planner_wrong = false;
  // A rule the old planner did not have (a slice of a constant is no view): its views are not compared.
  bool rule_after_old_planner = false;
};

std::vector<ViewCase> view_cases() {
  std::vector<ViewCase> cases;
  {  // Res2Net-like: chunks of a conv output, three convolved, all concatenated.
    ViewGraph b;
    const int y = b.conv("conv1", b.x, 12);
    std::vector<int> parts;
    for (int64_t k = 0; k < 4; ++k) parts.push_back(b.slice("s" + std::to_string(k), y, 3 * k, 3 * k + 3));
    const int last = parts[3];
    for (int k = 0; k < 3; ++k) parts[k] = b.conv("c" + std::to_string(k), parts[k], 3);
    parts[3] = last;  // a view: copied
    b.g.mark_output(b.conv("conv3", b.concat("cat", parts), 4));
    cases.push_back({"chunks", std::move(b.g), {"s0", "s1", "s2", "s3"}, {{"cat", {0, 1, 2}}}});
  }
  {  // Slices of a graph input are windows; a concat that is a graph output takes its inputs in place.
    ViewGraph b;
    const int a = b.conv("a", b.slice("xs0", b.x, 0, 6), 4), c = b.conv("c", b.slice("xs1", b.x, 6, 12), 4);
    b.g.mark_output(b.concat("cat", {a, c}));
    cases.push_back({"graph_input", std::move(b.g), {"xs0", "xs1"}, {{"cat", {0, 1}}}});
  }
  {  // A concat input that is a graph output, one that is a constant, one that is the graph input.
    ViewGraph b(1);  // batch 1: the constant has the batch size baked in
    const int a = b.conv("a", b.x, 4), c = b.conv("c", b.x, 4);
    const int k = b.g.add_constant("k", random_tensor({1, 3, 5, 5}, b.rng));
    b.g.mark_output(a);
    b.g.mark_output(b.conv("out", b.concat("cat", {a, c, k, b.x}), 4));
    cases.push_back({"pinned_inputs", std::move(b.g), {}, {{"cat", {1}}}});
  }
  {  // A slice of a constant is no view: constants live outside the activation arena.
    ViewGraph b(1);
    const int k = b.g.add_constant("k", random_tensor({1, 8, 5, 5}, b.rng));
    const int s = b.slice("kwin", k, 2, 6);
    b.g.mark_output(b.conv("out", b.concat("cat", {b.conv("a", b.x, 4), s}), 4));
    // Its output is written in place into the concat instead (the slice copies into that window).
    cases.push_back({"constant_slice", std::move(b.g), {}, {{"cat", {0, 1}}}, true, false, true});
  }
  {  // A slice that is a graph output is no view; slices and concats along other axes are not either.
    ViewGraph b;
    const int y = b.conv("y", b.x, 12);
    b.g.mark_output(b.slice("out_slice", y, 0, 4));
    const int h = b.slice("rows", y, 0, 2, 2);
    b.g.mark_output(b.concat("rows_cat", {b.conv("r0", h, 4), b.conv("r1", h, 4)}, 2));
    cases.push_back({"other_axes", std::move(b.g), {}, {}, false});
  }
  {  // Values already views: in place in one concat, read again by a second; concats in place in a third.
    ViewGraph b;
    const int a = b.conv("a", b.x, 4), c = b.conv("c", b.x, 4);
    const int first = b.concat("first", {a, c});
    const int second = b.concat("second", {a, b.conv("d", b.x, 4)});
    b.g.mark_output(b.conv("out", b.concat("outer", {first, second}), 4));
    cases.push_back({"repeats", std::move(b.g), {}, {{"first", {0, 1}}, {"second", {1}}, {"outer", {0, 1}}}});
  }
  {  // A value one concat reads twice is copied to both places (the old planner put it in place at the first).
    ViewGraph b;
    const int a = b.conv("a", b.x, 4), c = b.conv("c", b.x, 4);
    b.g.mark_output(b.conv("out", b.concat("twice", {a, c, c}), 4));
    cases.push_back({"read_twice", std::move(b.g), {}, {{"twice", {0}}}, true, true});
  }
  {  // A value both sliced and concatenated keeps its own buffer; its window is copied.
    ViewGraph b;
    const int y = b.conv("y", b.x, 8);
    const int s = b.slice("win", y, 2, 6);
    b.g.mark_output(b.conv("out", b.concat("cat", {y, b.conv("z", s, 4), s}), 4));
    cases.push_back({"sliced_and_concatenated", std::move(b.g), {"win"}, {{"cat", {1}}}});
  }
  for (ViewCase& c : cases) c.g.canonicalize();
  return cases;
}

TEST(FusionPasses, ChannelViewsMarkWhatThePlannerMadeViews) {
  for (ViewCase& c : view_cases()) {
    Graph& g = c.g;
    const ChannelViews old = views_before_marks(g);
    std::mt19937 rng(8);
    const std::vector<std::vector<float>> in = {random_tensor(g.values[g.inputs[0]].shape, rng).to_f32()};
    const auto before = c.runs_on_cpu ? testing::run_cpu(g, in) : std::vector<std::vector<float>>{};
    EXPECT_EQ(plan_channel_views(g).slices_as_views + plan_channel_views(g).concat_inputs_in_place, 0)
        << c.name << ": an unmarked graph has no views";
    const int expected = static_cast<int>(c.views.size() + c.in_place.size());
    EXPECT_EQ(fuse_channel_views(g), expected) << c.name;
    verify_graph(g, c.name);
    for (const Node& n : g.nodes) {
      EXPECT_EQ(n.has_attr(kMarkChannelView), c.views.count(n.name) == 1) << c.name << ": " << n.name;
      const auto it = c.in_place.find(n.name);
      EXPECT_EQ(in_place_inputs(n), it == c.in_place.end() ? std::vector<int64_t>{} : it->second) << c.name << ": " << n.name;
    }
    const ChannelViews views = plan_channel_views(g);
    if (c.old_planner_wrong) EXPECT_EQ(views.concat_inputs_in_place + 1, old.concat_inputs_in_place) << c.name;
    else if (!c.rule_after_old_planner) expect_same_views(views, old, c.name);
    EXPECT_EQ(fuse_channel_views(g), 0) << c.name << ": idempotent";
    if (!c.runs_on_cpu) continue;
    ShapedPlan plan;
    EXPECT_EQ(testing::run_cpu_planned(g, in, &plan), before) << c.name;
    EXPECT_EQ(plan.views.slices_as_views + plan.views.concat_inputs_in_place, views.slices_as_views + views.concat_inputs_in_place);
    const ChannelViews dense = plan_for_batch(g, g.values[g.inputs[0]].shape[0], true).views;
    EXPECT_EQ(dense.slices_as_views + dense.concat_inputs_in_place, 0) << c.name << ": dense mode takes no views";
  }
}

TEST(FusionPasses, VerifierRefusesChannelViewMarksThatDoNotHold) {
  auto refused = [](Graph g, const std::string& node, const char* key, AttrValue v, const std::string& says) {
    g.nodes[g.find_node(node) - g.nodes.data()].attrs[key] = std::move(v);
    const std::string e = testing::error_of([&] { verify_graph(g, "test"); });
    EXPECT_NE(e.find(says), std::string::npos) << node << " " << key << ": " << e;
  };
  std::map<std::string, Graph> g;
  for (ViewCase& c : view_cases()) g[c.name] = std::move(c.g);
  const std::vector<int64_t> none;
  refused(g["chunks"], "cat", kMarkChannelView, int64_t{1}, "cat: channel_view on a concat (only slice)");
  refused(g["chunks"], "s0", kMarkChannelView, int64_t{2}, "s0: mark channel_view must be the integer 1");
  refused(g["other_axes"], "rows", kMarkChannelView, int64_t{1}, "rows: channel_view on a slice that is not along axis 1");
  refused(g["other_axes"], "out_slice", kMarkChannelView, int64_t{1}, "out_slice: channel_view on a slice whose output is a graph output");
  refused(g["other_axes"], "rows_cat", kMarkInPlace, std::vector<int64_t>{0}, "rows_cat: in_place on a concat that is not along axis 1");
  refused(g["chunks"], "conv3", kMarkInPlace, std::vector<int64_t>{0}, "conv3: in_place on a conv2d (only concat)");
  refused(g["chunks"], "cat", kMarkInPlace, int64_t{1}, "cat: mark in_place must be a non-empty list");
  refused(g["chunks"], "cat", kMarkInPlace, none, "cat: mark in_place must be a non-empty list");
  refused(g["chunks"], "cat", kMarkInPlace, std::vector<int64_t>{4}, "cat: in_place input 4 is out of range (4 inputs)");
  refused(g["chunks"], "cat", kMarkInPlace, std::vector<int64_t>{1, 0}, "cat: in_place must list input indices in ascending order");
  refused(g["chunks"], "cat", kMarkInPlace, std::vector<int64_t>{1, 1}, "ascending order, once each");
  refused(g["pinned_inputs"], "cat", kMarkInPlace, std::vector<int64_t>{0}, "cat: in_place input 0 ('a') is a graph output");
  refused(g["pinned_inputs"], "cat", kMarkInPlace, std::vector<int64_t>{2}, "cat: in_place input 2 ('k') is a constant");
  refused(g["pinned_inputs"], "cat", kMarkInPlace, std::vector<int64_t>{3}, "cat: in_place input 3 ('x') is a graph input");
  refused(g["constant_slice"], "kwin", kMarkChannelView, int64_t{1}, "kwin: channel_view on a slice of a constant");
  // A mark that breaks another node's rule: the verifier names the first of
  // the two in node order; the other's rule says the same from its side.
  auto index = [](const Graph& g, const char* name) { return static_cast<size_t>(g.find_node(name) - g.nodes.data()); };
  fuse_channel_views(g["chunks"]);
  refused(g["chunks"], "cat", kMarkInPlace, std::vector<int64_t>{0, 1, 2, 3},
          "s3: channel_view on a slice whose output 's3' cat writes in place (in_place)");
  EXPECT_EQ(in_place_input_problem(g["chunks"], index(g["chunks"], "cat"), 3), "cat: in_place input 3 ('s3') is a view (s3 is a channel_view)");
  fuse_channel_views(g["repeats"]);
  refused(g["read_twice"], "twice", kMarkInPlace, std::vector<int64_t>{0, 1},
          "twice: in_place input 1 ('c') is also input 2 of twice (a value read twice is copied)");
  refused(g["repeats"], "second", kMarkInPlace, std::vector<int64_t>{0, 1}, "in_place input 0 ('a') is also written in place into");
  Graph& sc = g["sliced_and_concatenated"];
  fuse_channel_views(sc);
  refused(sc, "cat", kMarkInPlace, std::vector<int64_t>{0, 1}, "win: channel_view on a slice whose input 'y' cat writes in place");
  EXPECT_EQ(in_place_input_problem(sc, index(sc, "cat"), 0), "cat: in_place input 0 ('y') has a window: win is a channel_view of it");
}

TEST(FusionPasses, ChannelViewMarksTravelInGraphJson) {
  Graph g = std::move(view_cases()[0].g);
  fuse_channel_views(g);
  const SerializedGraph sg = serialize_graph(g);
  const Blob weights = Blob::copy_of(sg.weights.data(), sg.weights.size());
  const Graph back = deserialize_graph(sg.graph_json, weights, "test graph.json");
  EXPECT_EQ(node(back, "s3").attr_int(kMarkChannelView), 1);
  EXPECT_EQ(node(back, "cat").attr_ints(kMarkInPlace), (std::vector<int64_t>{0, 1, 2}));
  expect_same_views(plan_channel_views(back), plan_channel_views(g), "after graph.json");
}

// Every Res2Net fixture, shaped as CPU f32 and as CUDA f16 builds shape it
// (chunks padded to 8 channels), gets the views the old planner made; the
// other families too (none, or whatever they have).
TEST(FusionPasses, FixturesGetTheViewsThePlannerMade) {
  const fs::path fixtures(KILN_FIXTURES_DIR);
  for (const std::string& name : testing::fixture_cases(fixtures / "res2net"))
    for (const auto& [dt, align] : {std::pair{DType::F32, 0}, std::pair{DType::F16, 8}}) {
      const Graph g = testing::fixture_graph(fixtures / "res2net" / name, dt, align, "timm_res2net");
      const ChannelViews cv = plan_channel_views(g);
      expect_same_views(cv, views_before_marks(g), name + " " + dtype_name(dt));
      EXPECT_GT(cv.slices_as_views, 0) << name;
      EXPECT_GT(cv.concat_inputs_in_place, 0) << name;
    }
  for (const auto& [family, dir] : {std::pair{"timm_efficientnet", "efficientnet"}, std::pair{"timm_resnet", "resnet"}})
    for (const std::string& name : testing::fixture_cases(fixtures / dir)) {
      const Graph g = testing::fixture_graph(fixtures / dir / name, DType::F32, 0, family);
      expect_same_views(plan_channel_views(g), views_before_marks(g), name);
    }
}

// Every EfficientNet fixture with its 1x1 convs 8-bit (the SE convs kept wide,
// as the recipe's "pooled" default): the pipeline with pad_channels at CUDA's
// alignment for 1-byte codes (16) widens the stage values 8-bit layers chain
// through residuals, and the CPU gives the same bits as without padding.
TEST(FusionPasses, EfficientNetEightBitChainsPadExactly) {
  const fs::path fixtures(KILN_FIXTURES_DIR);
  int padded_models = 0;
  for (const std::string& name : testing::fixture_cases(fixtures / "efficientnet"))
    for (DType code : {DType::F8E4M3, DType::I8}) {
      SCOPED_TRACE(name + " " + dtype_name(code));
      Checkpoint ckpt = Checkpoint::open(fixtures / "efficientnet" / name);
      const ModelSource src = testing::model_source(fixtures / "efficientnet" / name, ckpt);
      BuildRequest req;
      req.source = &src;
      const Graph built = family_registry().select(src).build(req).graph;
      std::mt19937 rng(7);
      const std::vector<float> in = testing::random_tensor(built.values[built.inputs[0]].shape, rng).to_f32();
      const auto run = [&](int64_t align_8bit) {
        Graph g = built;
        PipelineOptions po;
        po.verify = true;
        po.channel_align = align_8bit ? 4 : 0;  // f32: 16 bytes
        po.channel_align_8bit = align_8bit;
        po.quantize = [&](Graph& q) {
          std::vector<int> convs;
          for (size_t i = 0; i < q.nodes.size(); ++i) {
            const Node& n = q.nodes[i];
            const Shape& ws = n.op == Op::Conv2d ? q.values[n.inputs[1]].shape : Shape{};
            if (n.op == Op::Conv2d && ws[2] == 1 && ws[3] == 1 && n.name.find(".se.") == std::string::npos)
              convs.push_back(static_cast<int>(i));
          }
          return testing::quantize_calibrated_on(q, convs, code, in);
        };
        run_pipeline(g, po);
        return g;
      };
      const Graph plain = run(0), padded = run(16);
      const auto unaligned = [](const Graph& g) {
        int k = 0;
        for (const Value& v : g.values) k += v.shape.size() == 4 && is_8bit(v.dtype) && !v.constant && v.shape[1] % 16 != 0;
        return k;
      };
      const int before = unaligned(plain), after = unaligned(padded);
      EXPECT_LT(after, std::max(before, 1)) << "nothing was widened";
      padded_models += before > after;
      const auto a = testing::run_cpu(plain, {in})[0], b = testing::run_cpu(padded, {in})[0];
      ASSERT_EQ(a.size(), b.size());
      EXPECT_EQ(testing::max_abs_diff(a, b), 0.f) << "padding changed the model's output";
      std::printf("[pad] %s %s: 8-bit 4-D values whose channels are not a multiple of 16: %d, %d after padding\n",
                  name.c_str(), dtype_name(code), before, after);
    }
  EXPECT_GT(padded_models, 0) << "no fixture has an 8-bit value to pad: the test proves nothing";
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

// A copy of bundle `from` at `to` with its graph.json and provenance.json
// edited; returns how many marks `strip` took out of graph.json.
int rewrite_bundle(const fs::path& from, const fs::path& to, const std::vector<const char*>& strip,
                   const std::function<void(nlohmann::json& build)>& edit_build) {
  const Bundle b = Bundle::open(from);
  nlohmann::json graph = nlohmann::json::parse(b.section_text("graph.json"));
  int stripped = 0;
  for (auto& n : graph["nodes"])
    for (const char* k : strip) stripped += static_cast<int>(n["attrs"].erase(k));
  nlohmann::json prov = nlohmann::json::parse(b.section_text("provenance.json"));
  edit_build(prov["build"]);
  BundleWriter w(b.info());
  for (const auto& s : b.section_names()) {
    Blob blob = b.section(s);
    if (s == "graph.json") w.add_section(s, graph.dump());
    else if (s == "provenance.json") w.add_section(s, prov.dump());
    else w.add_section(s, std::vector<uint8_t>(blob.data, blob.data + blob.size));
  }
  w.write(to);
  return stripped;
}

std::vector<float> run_once(const Engine& e) {
  std::mt19937 rng(6);
  const auto info = e.inputs().at(0);
  return e.create_context()->run({{info.name, info.shape, random_tensor(info.shape, rng).to_f32()}}).at(0).data;
}

// A bundle from before fusion marks (no build.fusion_marks in its provenance,
// no marks in graph.json) gets the marks its switches allow when it loads, so
// it runs fused as it did, channel views included; with fuse_add off it gets
// no input_add marks.
TEST(FusionPasses, BundlesFromBeforeMarksAreMarkedAtLoad) {
  const fs::path dir = testing::temp_dir("premarks");
  for (const bool add_off : {false, true}) {
    BuildOptions o;
    o.model = (fs::path(KILN_FIXTURES_DIR) / "res2net" / "s4_26w").string();
    if (add_off) o.switches.set_list("fuse_add", false);
    const fs::path built = dir / (add_off ? "off.bundle" : "on.bundle");
    build_bundle(o, built);
    const fs::path old = dir / (add_off ? "old_off.bundle" : "old_on.bundle");
    const int stripped =
        rewrite_bundle(built, old, {kMarkInputAdd, kMarkSqueezeExcitation, kMarkSplitRun, kMarkChannelView, kMarkInPlace},
                       [](nlohmann::json& build) { ASSERT_EQ(build.erase("fusion_marks"), 1u); });
    EXPECT_GT(stripped, 0);
    const auto fresh = Engine::load(built.string()), loaded = Engine::load(old.string());
    int marks_fresh = 0, marks_loaded = 0;
    for (size_t i = 0; i < fresh->impl().graph.nodes.size(); ++i) marks_fresh += input_add_of(fresh->impl().graph, i) >= 0;
    for (size_t i = 0; i < loaded->impl().graph.nodes.size(); ++i) marks_loaded += input_add_of(loaded->impl().graph, i) >= 0;
    EXPECT_EQ(marks_loaded, marks_fresh) << (add_off ? "fuse_add off" : "fuse_add auto");
    EXPECT_EQ(marks_fresh == 0, add_off);
    const ChannelViews views = plan_channel_views(fresh->impl().graph);
    EXPECT_GT(views.slices_as_views + views.concat_inputs_in_place, 0);
    expect_same_views(plan_channel_views(loaded->impl().graph), views, "marked at load");
    EXPECT_EQ(loaded->create_context()->memory().views, fresh->create_context()->memory().views);
    EXPECT_EQ(run_once(*fresh), run_once(*loaded));
  }
}

// build.fusion_marks says which marks graph.json holds: true (or 1) every
// mark but the channel views, which loading adds; kFusionMarksVersion all of
// them, so a graph without view marks is run without views (what is in the
// bundle is what runs); anything else is refused naming the key.
TEST(FusionPasses, FusionMarksVersionDecidesWhatLoadingMarks) {
  const fs::path dir = testing::temp_dir("marks_version");
  BuildOptions o;
  o.model = (fs::path(KILN_FIXTURES_DIR) / "res2net" / "s4_26w").string();
  const fs::path built = dir / "built.bundle";
  build_bundle(o, built);
  const auto fresh = Engine::load(built.string());
  const ChannelViews views = plan_channel_views(fresh->impl().graph);
  auto load_stripped = [&](const std::string& tag, nlohmann::json marks) {
    const fs::path p = dir / (tag + ".bundle");
    EXPECT_GT(rewrite_bundle(built, p, {kMarkChannelView, kMarkInPlace}, [&](nlohmann::json& b) { b["fusion_marks"] = marks; }), 0);
    return Engine::load(p.string());
  };
  for (const nlohmann::json& v1 : {nlohmann::json(true), nlohmann::json(1)}) {
    const auto e = load_stripped("v1", v1);
    expect_same_views(plan_channel_views(e->impl().graph), views, "fusion_marks " + v1.dump());
    EXPECT_EQ(run_once(*e), run_once(*fresh));
  }
  const auto v2 = load_stripped("v2", kFusionMarksVersion);
  const ChannelViews none = plan_channel_views(v2->impl().graph);
  EXPECT_EQ(none.slices_as_views + none.concat_inputs_in_place, 0);
  EXPECT_EQ(v2->create_context()->memory().views, 0);
  EXPECT_EQ(run_once(*v2), run_once(*fresh)) << "views change no number";
  for (const nlohmann::json& bad : {nlohmann::json(false), nlohmann::json(0), nlohmann::json("yes")}) {
    const std::string e = testing::error_of([&] { load_stripped("bad", bad); });
    EXPECT_NE(e.find("build.fusion_marks must be true or a positive integer, got " + bad.dump()), std::string::npos) << e;
  }
}

}  // namespace
}  // namespace kiln
