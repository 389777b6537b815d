// Multi-output nodes through every layer, with top_k (values, indices) as
// the op that has them: shape rules, add_node_multi, the printer, graph.json
// both ways (and garbage output lists), the verifier, the passes (dead-node
// elimination, fusions, set_precision), the memory planner's per-output
// lifetimes, and a CPU engine loaded from a bundle against the plain reference.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include <nlohmann/json.hpp>

#include "backends/cpu/ref/ref.hpp"
#include "bundle/bundle.hpp"
#include "core/error.hpp"
#include "cpu_bundle_util.hpp"
#include "graph_test_util.hpp"
#include "ir/printer.hpp"
#include "ir/serialize.hpp"
#include "ir/verifier.hpp"
#include "kiln/kiln.hpp"
#include "passes/pass.hpp"
#include "runtime/memory_planner.hpp"
#include "tasks/runtime_config.hpp"

namespace kiln {
namespace {

using nlohmann::json;
using testing::error_of;

Attrs top_k_attrs(int64_t k, int64_t axis = -1, int64_t largest = 1) {
  return {{"k", k}, {"axis", axis}, {"largest", largest}};
}

// x [N, 24] -> relu "pre" -> top_k "topk" (k 5) -> values read by relu "act"
// and by add "sum" (values + act): two readers of output 0; indices are a
// graph output. Graph outputs: "scores" (sum), "indices".
struct TopKNet {
  Graph g;
  int x = -1, values = -1, indices = -1, scores = -1;
};

TopKNet top_k_net(int64_t batch = 3) {
  TopKNet t;
  Graph& g = t.g;
  t.x = g.add_input("x", DType::F32, {batch, 24});
  const int pre = g.add_node(Op::Activation, "pre", {t.x}, {{"activation", std::string("relu")}});
  const std::vector<int> vi = g.add_node_multi(Op::TopK, "topk", {pre}, top_k_attrs(5));
  t.values = vi.at(0), t.indices = vi.at(1);
  const int act = g.add_node(Op::Activation, "act", {t.values}, {{"activation", std::string("relu")}});
  t.scores = g.add_node(Op::Add, "sum", {t.values, act});
  g.values[t.scores].name = "scores";
  g.values[t.indices].name = "indices";
  g.mark_output(t.scores);
  g.mark_output(t.indices);
  return t;
}

// Distinct values, exact in f16 (multiples of 1/16 below 2^11/16), in a shuffled order.
std::vector<float> distinct_inputs(size_t count, uint32_t seed) {
  std::vector<float> v(count);
  for (size_t i = 0; i < count; ++i) v[i] = static_cast<float>(i) / 16.f - 3.f;
  std::shuffle(v.begin(), v.end(), std::mt19937(seed));
  return v;
}

// ------------------------------------------------------------ shape rules

TEST(MultiOutput, AddNodeMultiGivesEveryOutputTyped) {
  TopKNet t = top_k_net();
  const Graph& g = t.g;
  const Node& n = *g.find_node("topk");
  ASSERT_EQ(n.outputs, (std::vector<int>{t.values, t.indices}));
  EXPECT_EQ(g.values[t.values].dtype, DType::F32);
  EXPECT_EQ(g.values[t.indices].dtype, DType::I64);
  EXPECT_EQ(g.values[t.values].shape, (Shape{3, 5}));
  EXPECT_EQ(g.values[t.indices].shape, (Shape{3, 5}));
  for (int o : n.outputs) EXPECT_EQ(g.values[o].producer, 1);
  EXPECT_EQ(g.consumers(t.values), (std::vector<int>{2, 3}));
  EXPECT_TRUE(g.consumers(t.indices).empty());
  verify_graph(g, "built");

  // add_node returns the first output; output k > 0 is named "<node>:k".
  Graph h;
  const int x = h.add_input("x", DType::BF16, {2, 3, 13, 4});
  const int first = h.add_node(Op::TopK, "sel", {x}, top_k_attrs(13, 2, 0));
  const Node& sel = h.nodes.back();
  ASSERT_EQ(sel.outputs.size(), 2u);
  EXPECT_EQ(first, sel.outputs[0]);
  EXPECT_EQ(h.values[sel.outputs[0]].name, "sel");
  EXPECT_EQ(h.values[sel.outputs[1]].name, "sel:1");
  EXPECT_EQ(h.values[sel.outputs[0]].dtype, DType::BF16);
  EXPECT_EQ(h.values[sel.outputs[1]].shape, (Shape{2, 3, 13, 4}));

  // infer_shapes sets every output (here after a batch change).
  h.values[x].shape[0] = 5;
  h.infer_shapes();
  EXPECT_EQ(h.values[sel.outputs[1]].shape, (Shape{5, 3, 13, 4}));
  EXPECT_EQ(h.values[sel.outputs[1]].dtype, DType::I64);
}

TEST(MultiOutput, TopKShapeErrorsNameTheNode) {
  Graph g;
  const int x = g.add_input("x", DType::F32, {3, 24});
  auto error = [&](Attrs a) { return error_of([&] { g.add_node_multi(Op::TopK, "layer7.topk", {x}, std::move(a)); }); };
  struct Bad {
    Attrs attrs;
    const char* says;
  };
  const Bad bad[] = {
      {top_k_attrs(0), "k >= 1, got k = 0"},
      {top_k_attrs(-2), "k >= 1"},
      {top_k_attrs(25), "k = 25 is larger than the extent 24 of axis 1"},
      {top_k_attrs(4, 0), "k = 4 is larger than the extent 3 of axis 0"},
      {top_k_attrs(1, 2), "axis 2 out of range for rank 2"},
      {top_k_attrs(1, -3), "axis -3 out of range for rank 2"},
      {{{"k", int64_t{2}}, {"sorted", int64_t{0}}}, "sorted=0 is not supported"},
      {{{"k", int64_t{2}}, {"largest", int64_t{2}}}, "'largest' must be 0 or 1"},
      {{{"axis", int64_t{1}}}, "missing attribute 'k'"},
  };
  for (const Bad& b : bad) {
    const std::string e = error(b.attrs);
    EXPECT_NE(e.find("layer7.topk"), std::string::npos) << b.says << ": " << e;
    EXPECT_NE(e.find(b.says), std::string::npos) << e;
  }
  EXPECT_EQ(g.nodes.size(), 0u) << "a refused node must not be added";
  const int scalar = g.add_input("s", DType::F32, {});
  EXPECT_NE(error_of([&] { g.add_node_multi(Op::TopK, "t0", {scalar}, top_k_attrs(1)); }).find("t0: top_k of rank-0"),
            std::string::npos);
  EXPECT_NE(error_of([&] { g.add_node_multi(Op::TopK, "t2", {x, x}, top_k_attrs(1)); }).find("t2: top_k takes 1 input, got 2"),
            std::string::npos);
}

// ------------------------------------------------------------ printer, graph.json

TEST(MultiOutput, PrinterShowsEveryOutput) {
  TopKNet t = top_k_net();
  const std::string text = print_graph(t.g);
  const std::string want = "%" + std::to_string(t.values) + ", %" + std::to_string(t.indices) +
                           " = top_k \"topk\"(%" + std::to_string(t.g.nodes[0].outputs[0]) +
                           ") {axis=-1, k=5, largest=1} : f32[3,5], i64[3,5]\n";
  EXPECT_NE(text.find(want), std::string::npos) << text;
  EXPECT_NE(text.find("output %" + std::to_string(t.indices) + " \"indices\""), std::string::npos) << text;
}

TEST(MultiOutput, GraphJsonRoundTrips) {
  TopKNet t = top_k_net();
  const SerializedGraph s = serialize_graph(t.g);
  const json j = json::parse(s.graph_json);
  EXPECT_EQ(j["nodes"][1]["outputs"], json({t.values, t.indices}));
  const Graph back = deserialize_graph(s.graph_json, Blob::from_vector(s.weights), "t.bundle: graph.json");
  EXPECT_EQ(print_graph(back), print_graph(t.g));
  EXPECT_EQ(back.nodes[1].outputs, t.g.nodes[1].outputs);
  EXPECT_EQ(back.values[t.indices].producer, 1);
  EXPECT_EQ(back.values[t.indices].dtype, DType::I64);
  const auto x = distinct_inputs(72, 1);
  EXPECT_EQ(testing::run_cpu(back, {x}), testing::run_cpu(t.g, {x}));
}

// Rejected as an input error whose message names `node`.
void expect_rejected(const json& j, const Blob& w, const std::string& node, const std::string& says = "") {
  try {
    deserialize_graph(j.dump(), w, "m.bundle: graph.json");
    ADD_FAILURE() << "accepted: " << j["nodes"].dump();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Input) << e.what();
    EXPECT_NE(std::string(e.what()).find(node), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
  }
}

TEST(MultiOutput, GraphJsonRejectsWrongOutputLists) {
  TopKNet t = top_k_net();
  const SerializedGraph s = serialize_graph(t.g);
  const Blob w = Blob::from_vector(s.weights);
  const json j = json::parse(s.graph_json);
  auto with_outputs = [&](size_t node, json outs) {
    json m = j;
    m["nodes"][node]["outputs"] = std::move(outs);
    return m;
  };
  const int v = t.values, i = t.indices, pre = t.g.nodes[0].outputs[0];
  expect_rejected(with_outputs(1, json::array()), w, "node 'topk'", "top_k has 2 outputs, got 0");
  expect_rejected(with_outputs(1, {v}), w, "node 'topk'", "top_k has 2 outputs, got 1");
  expect_rejected(with_outputs(1, {v, i, t.scores}), w, "node 'topk'", "top_k has 2 outputs, got 3");
  expect_rejected(with_outputs(1, {v, v}), w, "node 'topk'", "already produced by node 'topk'");
  expect_rejected(with_outputs(1, {v, pre}), w, "node 'topk'", "already produced by node 'pre'");
  expect_rejected(with_outputs(1, {v, 100000}), w, "node 'topk'", "out of range");
  expect_rejected(with_outputs(1, {v, -1}), w, "node 'topk'", "out of range");
  expect_rejected(with_outputs(1, {v, 1.5}), w, "node 'topk'", "out of range");
  expect_rejected(with_outputs(1, "v"), w, "node 'topk'", "must be a list");
  expect_rejected(with_outputs(1, {i, v}), w, "topk", "output 0 recorded i64[3,5] but op rule gives f32[3,5]");
  expect_rejected(with_outputs(1, {v, t.x}), w, "topk", "produced twice");  // a graph input
  expect_rejected(with_outputs(2, {j["nodes"][2]["outputs"][0], i}), w, "node 'act'", "activation has 1 output, got 2");
  expect_rejected(with_outputs(2, {i}), w, "node 'act'", "already produced by node 'topk'");
  json no_outputs = j;
  no_outputs["nodes"][1].erase("outputs");
  expect_rejected(no_outputs, w, "node 'topk'", "missing key 'outputs'");
  json constant_out = j;
  constant_out["values"].push_back({{"name", "c"}, {"dtype", "i64"}, {"shape", {3, 5}}, {"data", {{"offset", 0}, {"nbytes", 120}}}});
  std::vector<uint8_t> bytes(128, 0);
  const Blob w2 = Blob::from_vector(bytes);
  constant_out["nodes"][1]["outputs"] = {v, constant_out["values"].size() - 1};
  expect_rejected(constant_out, w2, "node 'topk'", "output 'c' is a constant");
}

// Random output lists on every node: each is either the original list
// (accepted) or rejected as an input error naming the node; never a crash.
TEST(MultiOutput, GraphJsonFuzzedOutputListsAreRejectedNamingTheNode) {
  TopKNet t = top_k_net();
  const SerializedGraph s = serialize_graph(t.g);
  const Blob w = Blob::from_vector(s.weights);
  const json j = json::parse(s.graph_json);
  const int nv = static_cast<int>(t.g.values.size());
  std::mt19937 rng(7);
  int rejected = 0;
  for (int round = 0; round < 400; ++round) {
    const size_t node = rng() % j["nodes"].size();
    json outs = json::array();
    const int len = static_cast<int>(rng() % 4);
    for (int k = 0; k < len; ++k) {
      const int pick = static_cast<int>(rng() % 10);
      if (pick == 0) outs.push_back(nullptr);
      else if (pick == 1) outs.push_back(-static_cast<int>(rng() % 3) - 1);
      else if (pick == 2) outs.push_back(nv + static_cast<int>(rng() % 3));
      else outs.push_back(static_cast<int>(rng() % nv));
    }
    json m = j;
    m["nodes"][node]["outputs"] = outs;
    const std::string name = j["nodes"][node]["name"].get<std::string>();
    try {
      const Graph g = deserialize_graph(m.dump(), w, "f.bundle: graph.json");
      EXPECT_EQ(outs, j["nodes"][node]["outputs"]) << "accepted a changed output list on '" << name << "': " << outs.dump();
      EXPECT_EQ(print_graph(g), print_graph(t.g));
    } catch (const Error& e) {
      ++rejected;
      EXPECT_EQ(e.kind(), ErrorKind::Input) << e.what();
      EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << outs.dump() << ": " << e.what();
    }
  }
  EXPECT_GT(rejected, 300);
}

// ------------------------------------------------------------ verifier

TEST(MultiOutput, VerifierChecksOutputCountsProducersAndTypes) {
  const TopKNet t = top_k_net();
  auto verifier_error = [](const Graph& g) { return error_of([&] { verify_graph(g, "test"); }); };
  Graph one = t.g;  // the indices dropped from the node
  one.nodes[1].outputs.pop_back();
  EXPECT_NE(verifier_error(one).find("topk: top_k has 2 outputs, got 1"), std::string::npos) << verifier_error(one);

  Graph three = t.g;  // an extra output value
  three.values.push_back({"extra", DType::I64, {3, 5}, std::nullopt, 1, std::nullopt});
  three.nodes[1].outputs.push_back(static_cast<int>(three.values.size()) - 1);
  three.invalidate_uses();
  EXPECT_NE(verifier_error(three).find("top_k has 2 outputs, got 3"), std::string::npos) << verifier_error(three);

  Graph two_on_relu = t.g;  // an op of one output given two
  two_on_relu.values.push_back({"act:1", DType::F32, {3, 5}, std::nullopt, 2, std::nullopt});
  two_on_relu.nodes[2].outputs.push_back(static_cast<int>(two_on_relu.values.size()) - 1);
  EXPECT_NE(verifier_error(two_on_relu).find("act: activation has 1 output, got 2"), std::string::npos);

  Graph stale = t.g;  // the second output's producer names another node
  stale.values[t.indices].producer = 2;
  EXPECT_NE(verifier_error(stale).find("topk: output 1 'indices' has a stale producer link"), std::string::npos)
      << verifier_error(stale);

  Graph retyped = t.g;  // indices recorded as i32
  retyped.values[t.indices].dtype = DType::I32;
  EXPECT_NE(verifier_error(retyped).find("topk: output 1 recorded i32[3,5] but op rule gives i64[3,5]"), std::string::npos)
      << verifier_error(retyped);

  Graph twice = t.g;  // one value listed as both outputs
  twice.nodes[1].outputs = {t.values, t.values};
  EXPECT_NE(verifier_error(twice).find("produced twice"), std::string::npos);

  Graph stolen = t.g;  // a later node claims the indices
  stolen.nodes[2].outputs = {t.indices};
  EXPECT_NE(verifier_error(stolen).find("produced twice"), std::string::npos);
  verify_graph(t.g, "untouched");
}

// ------------------------------------------------------------ passes

TEST(MultiOutput, DeadNodeEliminationKeepsANodeWhileAnyOutputIsRead) {
  // Only the second output (indices) is used: the node stays, its readerless
  // values output too, and so does the node feeding it.
  Graph g;
  const int x = g.add_input("x", DType::F32, {2, 13});
  const int pre = g.add_node(Op::Activation, "pre", {x}, {{"activation", std::string("relu")}});
  const std::vector<int> vi = g.add_node_multi(Op::TopK, "topk", {pre}, top_k_attrs(3));
  g.add_node(Op::Activation, "unused", {vi[0]}, {{"activation", std::string("relu")}});
  g.mark_output(vi[1]);
  EXPECT_EQ(eliminate_dead_nodes(g), 1);  // "unused" only
  verify_graph(g, "eliminate_dead_nodes");
  ASSERT_NE(g.find_node("topk"), nullptr);
  EXPECT_NE(g.find_node("pre"), nullptr);
  EXPECT_EQ(g.find_node("topk")->outputs.size(), 2u);
  EXPECT_EQ(g.values[g.outputs[0]].dtype, DType::I64);

  // Neither output read: the node goes, then what fed it.
  Graph dead;
  const int y = dead.add_input("y", DType::F32, {2, 13});
  const int keep = dead.add_node(Op::Activation, "keep", {y}, {{"activation", std::string("relu")}});
  const int pre2 = dead.add_node(Op::Activation, "pre", {y}, {{"activation", std::string("relu")}});
  dead.add_node_multi(Op::TopK, "topk", {pre2}, top_k_attrs(3));
  dead.mark_output(keep);
  EXPECT_EQ(eliminate_dead_nodes(dead), 2);
  EXPECT_EQ(dead.nodes.size(), 1u);
  verify_graph(dead, "eliminate_dead_nodes");
}

TEST(MultiOutput, PipelineKeepsTopKAndItsReaders) {
  // The default pipeline with the verifier on: the activation reading top_k's
  // values is not fused into it (top_k carries no epilogue) and both outputs survive.
  TopKNet t = top_k_net();
  const auto x = distinct_inputs(72, 2);
  const auto before = testing::run_cpu(t.g, {x});
  PipelineOptions o;
  o.verify = true;
  run_pipeline(t.g, o);
  EXPECT_EQ(t.g.count_ops(Op::TopK), 1);
  EXPECT_EQ(t.g.count_ops(Op::Activation), 2) << print_graph(t.g);  // "act" reads values: still a node
  EXPECT_EQ(t.g.find_node("sum")->activation(), Activation::None);
  EXPECT_EQ(testing::run_cpu(t.g, {x}), before);
}

TEST(MultiOutput, SetPrecisionNarrowsValuesButNotIndices) {
  TopKNet t = top_k_net();
  const auto x = distinct_inputs(72, 3);  // exact in f16 and distinct: the same order after narrowing
  const auto want = ref::run_reference_graph(t.g, {x});
  PipelineOptions o;
  o.precision = DType::F16;
  o.verify = true;
  run_pipeline(t.g, o);
  const Node& topk = *t.g.find_node("topk");
  EXPECT_EQ(t.g.values[topk.outputs[0]].dtype, DType::F16);
  EXPECT_EQ(t.g.values[topk.outputs[1]].dtype, DType::I64);
  ASSERT_EQ(t.g.outputs.size(), 2u);
  EXPECT_EQ(t.g.values[t.g.outputs[0]].name, "scores");
  EXPECT_EQ(t.g.values[t.g.outputs[0]].dtype, DType::F32);  // cast back at the boundary
  EXPECT_EQ(t.g.values[t.g.outputs[1]].name, "indices");
  EXPECT_EQ(t.g.values[t.g.outputs[1]].dtype, DType::I64);  // handed out as it is: no cast
  EXPECT_EQ(t.g.outputs[1], topk.outputs[1]);
  const auto got = testing::run_cpu(t.g, {x});
  EXPECT_EQ(got.at(1), want.at(1));
  EXPECT_EQ(got.at(0), want.at(0));  // multiples of 1/16 in [0, 2): exact in f16, sums too
}

// ------------------------------------------------------------ memory planner

TEST(MultiOutput, MemoryPlannerGivesEveryOutputItsOwnLifetime) {
  // topk (node 1) -> values read by node 3; indices read by nobody: they live
  // during node 1 only, values until node 3.
  Graph g;
  const int x = g.add_input("x", DType::F32, {1, 4096});
  const int pre = g.add_node(Op::Activation, "pre", {x}, {{"activation", std::string("relu")}});
  const std::vector<int> vi = g.add_node_multi(Op::TopK, "topk", {pre}, top_k_attrs(4096));
  const int other = g.add_node(Op::Activation, "other", {pre}, {{"activation", std::string("relu")}});
  const int late = g.add_node(Op::Add, "late", {vi[0], other});
  const int last = g.add_node(Op::Activation, "last", {late}, {{"activation", std::string("relu")}});
  g.mark_output(last);
  const auto life = value_lifetimes(g, [](int) { return -1; });
  EXPECT_EQ(life[vi[0]].first, 1);
  EXPECT_EQ(life[vi[0]].last, 3);
  EXPECT_EQ(life[vi[1]].first, 1);
  EXPECT_EQ(life[vi[1]].last, 1);
  EXPECT_EQ(life[last].last, static_cast<int>(g.nodes.size()));

  // Read by a later node, the indices live until that node.
  Graph read = g;
  read.add_node(Op::Cast, "idx.f32", {vi[1]}, {{"dtype", std::string("f32")}});
  read.mark_output(static_cast<int>(read.values.size()) - 1);
  EXPECT_EQ(value_lifetimes(read, [](int) { return -1; })[vi[1]].last, 5);

  // Bytes: values alive at the same time never overlap, and the unread
  // indices' bytes are free again after node 1 (the arena is the peak, 3
  // buffers at node 1 or 2, not 4).
  const MemoryPlan p = plan_memory(g, cpu::activation_bytes);
  for (int a = 0; a < static_cast<int>(g.values.size()); ++a)
    for (int b = a + 1; b < static_cast<int>(g.values.size()); ++b) {
      const bool together = !(life[a].last < life[b].first || life[b].last < life[a].first);
      if (!together || p.offsets[a] < 0 || p.offsets[b] < 0) continue;
      const int64_t a1 = p.offsets[a] + static_cast<int64_t>(cpu::activation_bytes(g.values[a]));
      const int64_t b1 = p.offsets[b] + static_cast<int64_t>(cpu::activation_bytes(g.values[b]));
      EXPECT_TRUE(a1 <= p.offsets[b] || b1 <= p.offsets[a]) << g.values[a].name << " and " << g.values[b].name;
    }
  EXPECT_EQ(p.arena_bytes, 3 * 4096 * sizeof(float));
}

// live_until / live_from (a fused step that reads a value after its last
// reader, or writes one before its producer): the lifetimes stretch, and the
// planner keeps the stretched buffers apart. A chain a -> b -> c -> d -> e:
// unstretched, b's and d's buffers never meet and may share bytes.
TEST(MemoryPlanner, LiveFromAndLiveUntilStretchLifetimes) {
  Graph g;
  const int x = g.add_input("x", DType::F32, {1, 1024});
  int v = x;
  std::vector<int> chain;
  for (const char* name : {"a", "b", "c", "d", "e"}) {
    v = g.add_node(Op::Activation, name, {v}, {{"activation", std::string("relu")}});
    chain.push_back(v);
  }
  g.mark_output(v);
  const auto none = [](int) { return -1; };
  const int b = chain[1], d = chain[3];
  EXPECT_EQ(value_lifetimes(g, none)[b].last, 2);
  EXPECT_EQ(value_lifetimes(g, none)[d].first, 3);
  const auto life = value_lifetimes(g, none, {{b, 3}}, {{d, 1}});
  EXPECT_EQ(life[b].last, 3);
  EXPECT_EQ(life[d].first, 1);
  EXPECT_EQ(life[b].first, 1);  // the other ends stay
  EXPECT_EQ(life[d].last, 4);
  const auto bytes = [](const Value& val) { return static_cast<size_t>(shape_numel(val.shape)) * 4; };
  const MemoryPlan loose = plan_memory_with_views(g, bytes, none);
  const MemoryPlan tight = plan_memory_with_views(g, bytes, none, 64, {}, {{d, 1}});
  EXPECT_EQ(loose.arena_bytes, 2 * 1024 * 4u);  // two buffers in turn
  // d written at node 1 meets b (nodes 1-2) and c (2-3): three buffers apart.
  for (int u : {b, chain[2]}) EXPECT_NE(tight.offsets[u], tight.offsets[d]) << g.values[u].name;
  EXPECT_EQ(tight.arena_bytes, 3 * 1024 * 4u);
}

// ------------------------------------------------------------ engine

TEST(MultiOutput, CpuEngineRunMatchesThePlainReference) {
  // pixel_values [N,3,4,4] -> flatten [N,48] -> top_k k 5 (values, indices)
  // -> values read by relu and add (two readers); outputs scores and indices.
  Graph g;
  const int x = g.add_input("pixel_values", DType::F32, {3, 3, 4, 4});
  const int flat = g.add_node(Op::Flatten, "flatten", {x});
  const std::vector<int> vi = g.add_node_multi(Op::TopK, "head.topk", {flat}, top_k_attrs(5));
  const int act = g.add_node(Op::Activation, "act", {vi[0]}, {{"activation", std::string("relu")}});
  const int sum = g.add_node(Op::Add, "sum", {vi[0], act});
  g.values[sum].name = "scores";
  g.values[vi[1]].name = "indices";
  g.mark_output(sum);
  g.mark_output(vi[1]);
  const std::vector<uint8_t> bytes = testing::cpu_bundle(g, "test/top_k");
  const auto engine = Engine::load_from_memory(bytes.data(), bytes.size(), {}, "top_k.bundle");
  ASSERT_EQ(engine->outputs().size(), 2u);
  EXPECT_EQ(engine->outputs()[1].name, "indices");
  EXPECT_EQ(engine->outputs()[1].dtype, "i64");
  for (int64_t batch : {1, 3}) {
    std::vector<float> in = distinct_inputs(static_cast<size_t>(batch * 48), static_cast<uint32_t>(batch));
    in[5] = in[9] = 7.f;  // one tie among the top values of image 0: the smaller index comes first
    Graph shaped = g;
    shaped.values[x].shape[0] = batch;
    shaped.infer_shapes();
    const auto want = ref::run_reference_graph(shaped, {in});
    const auto got = engine->create_context()->run({{"pixel_values", {batch, 3, 4, 4}, in}});
    ASSERT_EQ(got.size(), 2u);
    EXPECT_EQ(got[0].shape, (Shape{batch, 5}));
    EXPECT_EQ(got[0].data, want[0]);
    EXPECT_EQ(got[1].data, want[1]) << "batch " << batch;
    EXPECT_EQ(got[1].data[0], 5.f);
    EXPECT_EQ(got[1].data[1], 9.f);
  }
}

// ------------------------------------------------------------ top_k semantics

// One node top_k over x, run by the plain reference and by the CPU backend.
struct TopKRun {
  std::vector<float> values, indices;
};
std::vector<TopKRun> run_top_k(const Shape& shape, const std::vector<float>& x, Attrs attrs) {
  Graph g;
  const int in = g.add_input("x", DType::F32, shape);
  const std::vector<int> vi = g.add_node_multi(Op::TopK, "t", {in}, std::move(attrs));
  g.mark_output(vi[0]);
  g.mark_output(vi[1]);
  const auto r = ref::run_reference_graph(g, {x});
  const auto c = testing::run_cpu(g, {x});
  return {{r[0], r[1]}, {c[0], c[1]}};
}

TEST(TopK, MatchesTorchOnDistinctValues) {
  // torch.topk(torch.arange(1., 6.), 3) -> values [5, 4, 3], indices [4, 3, 2]
  for (const TopKRun& r : run_top_k({1, 5}, {1, 2, 3, 4, 5}, top_k_attrs(3))) {
    EXPECT_EQ(r.values, (std::vector<float>{5, 4, 3}));
    EXPECT_EQ(r.indices, (std::vector<float>{4, 3, 2}));
  }
  // torch.topk(x, 2, dim=0, largest=False) with x = [[3, 1], [0, 4], [2, 2]]
  // -> values [[0, 1], [2, 2]], indices [[1, 0], [2, 2]]
  for (const TopKRun& r : run_top_k({3, 2}, {3, 1, 0, 4, 2, 2}, top_k_attrs(2, 0, 0))) {
    EXPECT_EQ(r.values, (std::vector<float>{0, 1, 2, 2}));
    EXPECT_EQ(r.indices, (std::vector<float>{1, 0, 2, 2}));
  }
}

TEST(TopK, TiesGiveTheSmallerIndexFirst) {
  // kiln's rule (torch leaves tie order open): equal values by index.
  for (const TopKRun& r : run_top_k({1, 6}, {1, 3, 2, 3, 0, 3}, top_k_attrs(2))) {
    EXPECT_EQ(r.values, (std::vector<float>{3, 3}));
    EXPECT_EQ(r.indices, (std::vector<float>{1, 3}));
  }
  for (const TopKRun& r : run_top_k({1, 5}, {2, -1, 5, -1, -1}, top_k_attrs(4, -1, 0))) {
    EXPECT_EQ(r.values, (std::vector<float>{-1, -1, -1, 2}));
    EXPECT_EQ(r.indices, (std::vector<float>{1, 3, 4, 0}));
  }
  // -0 and +0 are equal values: index order.
  for (const TopKRun& r : run_top_k({1, 3}, {0.f, -0.f, -1.f}, top_k_attrs(2))) EXPECT_EQ(r.indices, (std::vector<float>{0, 1}));
  for (const TopKRun& r : run_top_k({1, 3}, {-0.f, 0.f, -1.f}, top_k_attrs(2))) EXPECT_EQ(r.indices, (std::vector<float>{0, 1}));
}

TEST(TopK, NanRanksAboveEveryNumber) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const std::vector<float> x = {1, nan, inf, -inf, nan, 2};
  for (const TopKRun& r : run_top_k({1, 6}, x, top_k_attrs(3))) {  // largest: the NaNs (by index), then +inf
    EXPECT_TRUE(std::isnan(r.values[0]) && std::isnan(r.values[1]));
    EXPECT_EQ(r.values[2], inf);
    EXPECT_EQ(r.indices, (std::vector<float>{1, 4, 2}));
  }
  for (const TopKRun& r : run_top_k({1, 6}, x, top_k_attrs(5, -1, 0))) {  // smallest: numbers first, then a NaN
    EXPECT_EQ(r.indices, (std::vector<float>{3, 0, 5, 2, 1}));
    EXPECT_TRUE(std::isnan(r.values[4]));
  }
}

}  // namespace
}  // namespace kiln
