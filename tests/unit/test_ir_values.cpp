// Use-lists, multi-output nodes, dtypes/ranks and quantization parameters in
// the IR (issue 10): the machinery below the op table, tested directly.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "graph_test_util.hpp"
#include "ir/printer.hpp"
#include "ir/serialize.hpp"
#include "ir/verifier.hpp"

namespace kiln {
namespace {

using testing::random_tensor;

Graph two_readers(std::mt19937& rng) {
  Graph g;
  int x = g.add_input("x", DType::F32, {1, 2, 3, 3});
  int a = g.add_node(Op::Activation, "a", {x}, {{"activation", std::string("relu")}});
  g.add_node(Op::Add, "b", {a, a});  // reads `a` twice: listed once
  int c = g.add_node(Op::Conv2d, "c", {a, g.add_constant("w", random_tensor({2, 2, 1, 1}, rng))});
  g.mark_output(c);
  return g;
}

TEST(UseList, ConsumersFollowEdits) {
  std::mt19937 rng(1);
  Graph g = two_readers(rng);
  const int a = g.nodes[0].outputs[0], x = g.inputs[0];
  EXPECT_EQ(g.consumers(a), (std::vector<int>{1, 2}));
  EXPECT_EQ(g.consumers(x), (std::vector<int>{0}));
  g.set_node_inputs(1, {x, x});  // node b now reads x
  EXPECT_EQ(g.consumers(a), (std::vector<int>{2}));
  EXPECT_EQ(g.consumers(x), (std::vector<int>{0, 1}));
  int n = g.add_node(Op::Activation, "d", {a}, {{"activation", std::string("relu")}});
  EXPECT_EQ(g.consumers(a), (std::vector<int>{2, 3}));
  EXPECT_TRUE(g.consumers(n).empty());
  EXPECT_TRUE(g.uses_are_current());
  verify_graph(g, "edits");
}

TEST(UseList, HandOverDetachesAndCanonicalizeDropsIt) {
  std::mt19937 rng(2);
  Graph g = two_readers(rng);
  const int a = g.nodes[0].outputs[0], b_out = g.nodes[1].outputs[0];
  g.hand_over_outputs(1, 0);  // nonsense semantically; checks the bookkeeping only
  EXPECT_TRUE(g.nodes[1].inputs.empty());
  EXPECT_EQ(g.values[b_out].producer, 0);
  EXPECT_EQ(g.consumers(a), (std::vector<int>{2}));  // b's reads of `a` are gone
  g.canonicalize();
  EXPECT_EQ(g.nodes.size(), 2u);
  EXPECT_EQ(g.find_node("b"), nullptr);
}

TEST(UseList, VerifierCatchesDirectEditWithoutInvalidate) {
  std::mt19937 rng(3);
  Graph g = two_readers(rng);
  (void)g.consumers(0);  // build the cache
  g.nodes[2].inputs[0] = g.inputs[0];  // edited behind the cache's back
  EXPECT_FALSE(g.uses_are_current());
  try {
    verify_graph(g, "test");
    ADD_FAILURE() << "stale use-list accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("stale use-list"), std::string::npos) << e.what();
  }
  g.invalidate_uses();
  EXPECT_TRUE(g.uses_are_current());
  EXPECT_EQ(g.consumers(g.inputs[0]), (std::vector<int>{0, 2}));
}

}  // namespace
}  // namespace kiln
