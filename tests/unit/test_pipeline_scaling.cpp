// The pass pipeline must stay linear in graph size (issue 10: transformer
// graphs reach 5,000+ nodes). Builds synthetic residual chains of ~1,000 and
// ~10,000 nodes, runs the real pipeline on both and compares the times: a
// quadratic pipeline takes ~100x longer on the big graph (the pipeline before
// use-lists: 153x), a linear one ~10x plus cache effects (the small graph's
// ~7,000 values stay in cache, the big one's do not: 15-27x measured).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>

#include "graph_test_util.hpp"
#include "passes/pass.hpp"

namespace kiln {
namespace {

constexpr int64_t kChannels = 4;
constexpr int kNodesPerBlock = 7;  // conv, bn, relu, conv, bn, add, relu

int conv_bn(Graph& g, const std::string& name, int x, std::mt19937& rng, bool relu) {
  int w = g.add_constant(name + ".conv.weight", testing::random_tensor({kChannels, kChannels, 1, 1}, rng));
  int y = g.add_node(Op::Conv2d, name + ".conv", {x, w});
  std::vector<int> bn = {y};
  for (const char* p : {".weight", ".bias", ".mean", ".var"})
    bn.push_back(g.add_constant(name + ".bn" + p, testing::random_tensor({kChannels}, rng, 0.5f, 1.5f)));
  y = g.add_node(Op::BatchNorm, name + ".bn", bn, {{"eps", 1e-5}});
  if (relu) y = g.add_node(Op::Activation, name + ".act", {y}, {{"activation", std::string("relu")}});
  return y;
}

// A chain of residual blocks, about `nodes` nodes in all.
Graph residual_chain(int nodes) {
  std::mt19937 rng(7);
  Graph g;
  int x = g.add_input("x", DType::F32, {1, kChannels, 2, 2});
  for (int b = 0; b < nodes / kNodesPerBlock; ++b) {
    const std::string name = "block" + std::to_string(b);
    int y = conv_bn(g, name + ".a", x, rng, true);
    y = conv_bn(g, name + ".b", y, rng, false);
    y = g.add_node(Op::Add, name + ".add", {y, x});
    x = g.add_node(Op::Activation, name + ".out", {y}, {{"activation", std::string("relu")}});
  }
  g.mark_output(x);
  return g;
}

// Seconds for run_pipeline on a fresh graph (graph building not counted);
// the best of `reps` runs, so a busy machine inflates it less.
double pipeline_seconds(int nodes, int reps, size_t* nodes_after) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    Graph g = residual_chain(nodes);
    const auto t0 = std::chrono::steady_clock::now();
    run_pipeline(g, PipelineOptions{});
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    *nodes_after = g.nodes.size();
  }
  return best;
}

TEST(PipelineScaling, TenThousandNodesIsLinear) {
  size_t small_after = 0, big_after = 0;
  const double small = pipeline_seconds(1000, 5, &small_after);
  const double big = pipeline_seconds(10000, 3, &big_after);  // best of 3: one run can land on a busy machine
  std::printf("pipeline: 1,000-node graph %.4f s, 10,000-node graph %.4f s (ratio %.1f)\n", small, big, big / small);
  // Each block folds to conv(+relu), conv(+residual add+relu): 2 nodes of 7.
  EXPECT_EQ(small_after, static_cast<size_t>(1000 / kNodesPerBlock * 2));
  EXPECT_EQ(big_after, static_cast<size_t>(10000 / kNodesPerBlock * 2));
  // Linear: 15-27x measured. Quadratic: 100x or more. 50x sits between.
  EXPECT_LT(big, 50 * small);
}

}  // namespace
}  // namespace kiln
