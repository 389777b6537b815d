#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "graph_test_util.hpp"
#include "ir/printer.hpp"
#include "ir/serialize.hpp"
#include "ir/verifier.hpp"
#include "runtime/memory_planner.hpp"

namespace kiln {
namespace {

using testing::random_tensor;

Graph small_net(std::mt19937& rng) {
  Graph g;
  int x = g.add_input("pixel_values", DType::F32, {1, 3, 16, 16});
  int w = g.add_constant("conv.weight", random_tensor({8, 3, 3, 3}, rng));
  int y = g.add_node(Op::Conv2d, "conv", {x, w},
                     {{"strides", std::vector<int64_t>{2, 2}}, {"pads", std::vector<int64_t>{1, 1, 1, 1}}});
  y = g.add_node(Op::Activation, "act", {y}, {{"activation", std::string("relu")}});
  y = g.add_node(Op::MaxPool2d, "pool", {y},
                 {{"kernel", std::vector<int64_t>{3, 3}}, {"strides", std::vector<int64_t>{2, 2}},
                  {"pads", std::vector<int64_t>{1, 1, 1, 1}}});
  y = g.add_node(Op::GlobalAvgPool, "gap", {y});
  y = g.add_node(Op::Flatten, "flat", {y});
  y = g.add_node(Op::Linear, "fc", {y, g.add_constant("fc.weight", random_tensor({5, 8}, rng)),
                                    g.add_constant("fc.bias", random_tensor({5}, rng))});
  g.mark_output(y);
  return g;
}

TEST(OpTable, NamesRoundTrip) {
  for (size_t i = 0; i < kOpCount; ++i) {
    Op op = static_cast<Op>(i);
    auto back = op_from_name(op_name(op));
    ASSERT_TRUE(back.has_value()) << op_name(op);
    EXPECT_EQ(*back, op);
  }
  EXPECT_FALSE(op_from_name("no_such_op").has_value());
}

TEST(ShapeInference, ConvPoolLinear) {
  std::mt19937 rng(1);
  Graph g = small_net(rng);
  EXPECT_EQ(g.values[g.find_node("conv")->outputs[0]].shape, (Shape{1, 8, 8, 8}));
  EXPECT_EQ(g.values[g.find_node("pool")->outputs[0]].shape, (Shape{1, 8, 4, 4}));
  EXPECT_EQ(g.values[g.outputs[0]].shape, (Shape{1, 5}));
}

TEST(ShapeInference, CeilModeAvgPoolMatchesPyTorch) {
  Graph g;
  int x = g.add_input("x", DType::F32, {1, 1, 7, 7});
  int y = g.add_node(Op::AvgPool2d, "p", {x},
                     {{"kernel", std::vector<int64_t>{2, 2}}, {"strides", std::vector<int64_t>{2, 2}}, {"ceil_mode", int64_t{1}}});
  EXPECT_EQ(g.values[y].shape, (Shape{1, 1, 4, 4}));  // torch.nn.AvgPool2d(2, 2, ceil_mode=True) on 7x7
}

TEST(ShapeInference, ErrorsNameTheNode) {
  std::mt19937 rng(2);
  Graph g;
  int x = g.add_input("x", DType::F32, {1, 3, 8, 8});
  int w = g.add_constant("bad.weight", random_tensor({4, 5, 3, 3}, rng));
  try {
    g.add_node(Op::Conv2d, "layer9.conv", {x, w});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("layer9.conv"), std::string::npos) << e.what();
  }
}

TEST(Verifier, CatchesUseBeforeDefinitionAndStaleShapes) {
  std::mt19937 rng(3);
  Graph g = small_net(rng);
  verify_graph(g, "test");
  Graph swapped = g;
  std::swap(swapped.nodes[0], swapped.nodes[1]);
  EXPECT_THROW(verify_graph(swapped, "test"), Error);
  Graph stale = g;
  stale.values[stale.outputs[0]].shape = {1, 6};
  EXPECT_THROW(verify_graph(stale, "test"), Error);
  Graph dup = g;
  dup.nodes[1].name = dup.nodes[0].name;
  EXPECT_THROW(verify_graph(dup, "test"), Error);
}

TEST(Serialize, RoundTripGivesSameGraphAndNumbers) {
  std::mt19937 rng(4);
  Graph g = small_net(rng);
  SerializedGraph s = serialize_graph(g);
  EXPECT_EQ(s.weights.size() % 4, 0u);
  Blob weights = Blob::from_vector(s.weights);
  Graph back = deserialize_graph(s.graph_json, weights, "test graph.json");
  EXPECT_EQ(print_graph(back), print_graph(g));
  auto x = random_tensor({1, 3, 16, 16}, rng).to_f32();
  EXPECT_EQ(testing::run_cpu(g, {x})[0], testing::run_cpu(back, {x})[0]);
}

TEST(Serialize, RejectsBadGraphs) {
  std::mt19937 rng(5);
  Graph g = small_net(rng);
  SerializedGraph s = serialize_graph(g);
  Blob weights = Blob::from_vector(s.weights);
  auto expect_input_error = [&](const std::string& text, const Blob& w, const char* needle) {
    try {
      deserialize_graph(text, w, "m.bundle: graph.json");
      ADD_FAILURE() << "accepted: " << needle;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::Input);
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  auto j = nlohmann::json::parse(s.graph_json);
  expect_input_error("not json", weights, "graph.json");
  auto bad_op = j;
  bad_op["nodes"][0]["op"] = "frobnicate";
  expect_input_error(bad_op.dump(), weights, "frobnicate");
  auto bad_id = j;
  bad_id["nodes"][1]["inputs"][0] = 100000;
  expect_input_error(bad_id.dump(), weights, "out of range");
  auto bad_off = j;
  bad_off["values"][1]["data"]["offset"] = 1 << 30;
  expect_input_error(bad_off.dump(), weights, "outside weights.bin");
  auto bad_shape = j;
  bad_shape["values"][1]["shape"] = {8, 3, 3, 4};
  expect_input_error(bad_shape.dump(), weights, "conv.weight");
  Blob short_weights = weights;
  short_weights.size = 16;
  expect_input_error(s.graph_json, short_weights, "outside weights.bin");
}

TEST(MemoryPlanner, ReusesMemoryWithoutOverlap) {
  std::mt19937 rng(6);
  Graph g = small_net(rng);
  MemoryPlan p = plan_memory(g, cpu::activation_bytes);
  EXPECT_LT(p.arena_bytes, p.naive_bytes);
  // Values alive at the same time never share bytes: check every node's
  // inputs against its output.
  for (const Node& n : g.nodes) {
    int o = n.outputs[0];
    for (int in : n.inputs) {
      if (g.values[in].constant) continue;
      int64_t a0 = p.offsets[in], a1 = a0 + static_cast<int64_t>(cpu::activation_bytes(g.values[in]));
      int64_t b0 = p.offsets[o], b1 = b0 + static_cast<int64_t>(cpu::activation_bytes(g.values[o]));
      EXPECT_TRUE(a1 <= b0 || b1 <= a0) << n.name;
    }
  }
}

}  // namespace
}  // namespace kiln
