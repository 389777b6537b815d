// Channel views (slices as windows, concat inputs written in place): the
// Res2Net block pattern computed with views must equal the dense execution,
// at batch 1 (contiguous views) and batch 3 (strided, image by image), and
// must copy only the chunk that cannot be in place.
#include <gtest/gtest.h>

#include "graph_test_util.hpp"
#include "passes/pass.hpp"
#include "runtime/engine_impl.hpp"
#include "runtime/views.hpp"

namespace kiln {
namespace {

using testing::random_tensor;

Attrs conv_attrs(int pad) {
  return {{"pads", std::vector<int64_t>{pad, pad, pad, pad}}, {"activation", std::string("relu")}};
}

int slice(Graph& g, const std::string& name, int x, int64_t start, int64_t end) {
  return g.add_node(Op::Slice, name, {x}, {{"axis", int64_t{1}}, {"start", start}, {"end", end}});
}

// x -> conv1 (4 chunks of 3) -> chained 3x3s (chunk 0, 1+prev, 2+prev) and a
// pass-through chunk 3 -> concat -> conv3 + residual x.
Graph res2net_like(int64_t batch, std::mt19937& rng) {
  Graph g;
  int x = g.add_input("x", DType::F32, {batch, 12, 7, 5});
  int y = g.add_node(Op::Conv2d, "conv1", {x, g.add_constant("w1", random_tensor({12, 12, 1, 1}, rng))}, conv_attrs(0));
  std::vector<int> chunks;
  for (int k = 0; k < 4; ++k) chunks.push_back(slice(g, "split" + std::to_string(k), y, 3 * k, 3 * k + 3));
  std::vector<int> outs;
  int sp = chunks[0];
  for (int k = 0; k < 3; ++k) {
    if (k > 0) sp = g.add_node(Op::Add, "add" + std::to_string(k), {outs.back(), chunks[k]});
    outs.push_back(g.add_node(Op::Conv2d, "convs" + std::to_string(k),
                              {sp, g.add_constant("wc" + std::to_string(k), random_tensor({3, 3, 3, 3}, rng))}, conv_attrs(1)));
  }
  outs.push_back(chunks[3]);
  int cat = g.add_node(Op::Concat, "cat", outs, {{"axis", int64_t{1}}});
  int w3 = g.add_constant("w3", random_tensor({12, 12, 1, 1}, rng));
  int b3 = g.add_constant("b3", random_tensor({12}, rng));
  g.mark_output(g.add_node(Op::Conv2d, "conv3", {cat, w3, b3, x}, conv_attrs(0)));
  return g;
}

TEST(ChannelViews, Res2netBlockEqualsDenseExecution) {
  for (int64_t batch : {1, 3}) {
    std::mt19937 rng(11);
    Graph g = res2net_like(batch, rng);
    const auto x = random_tensor({batch, 12, 7, 5}, rng).to_f32();
    const auto dense = testing::run_cpu(g, {x})[0];

    fuse_channel_views(g);  // views are the graph's marks (as the build pipeline sets them)
    ShapedPlan plan;
    const auto got = testing::run_cpu_planned(g, {x}, &plan)[0];
    EXPECT_EQ(plan.views.slices_as_views, 4);
    EXPECT_EQ(plan.views.concat_inputs_in_place, 3);  // the three 3x3 outputs
    EXPECT_EQ(plan.views.concat_inputs_copied, 1);    // the pass-through chunk is a window of conv1's output
    EXPECT_LT(plan.memory.arena_bytes, plan_memory(g, cpu::activation_bytes).arena_bytes + 1);
    EXPECT_LE(testing::max_abs_diff(got, dense), 1e-5f * std::max(1.f, testing::max_abs(dense))) << "batch " << batch;
  }
}

}  // namespace
}  // namespace kiln
