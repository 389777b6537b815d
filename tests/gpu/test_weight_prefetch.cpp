// Switch weight_prefetch's placement (weight_prefetch.hpp), which needs no
// GPU: which tail of a program's steps the L2 prefetch covers, and which
// device ranges it reads. Whether an engine with the step computes what one
// without it computes is CudaRtDetr.WeightPrefetchChangesNoBit.
#include <gtest/gtest.h>

#include "backends/cuda/weight_prefetch.hpp"

namespace kiln::cuda {
namespace {

using Constants = std::map<int, std::vector<std::pair<int, int64_t>>>;

TEST(WeightPrefetchPlan, TheLongestTailThatFitsTheBudget) {
  // Steps run nodes 0 (no constants), 1, 2, 3, 4; node 2 has two steps.
  const std::vector<int> steps = {0, 1, 2, 2, 3, 4};
  const Constants c = {{1, {{10, 500}}}, {2, {{11, 300}, {12, 100}}}, {3, {{13, 200}}}, {4, {{14, 250}}}};
  // 250 + 200 + 400 = 850 fits 900; adding node 1's 500 does not: the tail starts at node 2's first step.
  EXPECT_EQ(weight_prefetch_start(steps, c, 900), std::optional<size_t>(2));
  EXPECT_EQ(weight_prefetch_start(steps, c, 850), std::optional<size_t>(2));
  EXPECT_EQ(weight_prefetch_start(steps, c, 849), std::optional<size_t>(4));
  // Everything fits: the tail starts at the first step with a constant, not at node 0's.
  EXPECT_EQ(weight_prefetch_start(steps, c, 1 << 20), std::optional<size_t>(1));
  // Not even the last step's constants fit; no constants at all.
  EXPECT_EQ(weight_prefetch_start(steps, c, 249), std::nullopt);
  EXPECT_EQ(weight_prefetch_start(steps, Constants{}, 1 << 20), std::nullopt);
  EXPECT_EQ(weight_prefetch_start({}, c, 1 << 20), std::nullopt);
}

TEST(WeightPrefetchPlan, AConstantSharedByLaunchesCountsOnce) {
  // Nodes 5 and 6 read constant 20 (a shared weight); node 7 reads it twice.
  const std::vector<int> steps = {5, 6, 7};
  const Constants c = {{5, {{20, 400}}}, {6, {{20, 400}, {21, 100}}}, {7, {{20, 400}, {20, 400}}}};
  // Walking back: node 7 brings 400, node 6 only constant 21 (100), node 5 nothing new.
  EXPECT_EQ(weight_prefetch_start(steps, c, 500), std::optional<size_t>(1));
  EXPECT_EQ(weight_prefetch_start(steps, c, 499), std::optional<size_t>(2));
}

TEST(WeightPrefetchPlan, RangesOfTheTailsNodesOnceEach) {
  int a = 0, b = 0, d = 0;  // stand-ins for device addresses
  const std::vector<int> steps = {0, 1, 1, 2, 3};
  const std::map<int, std::vector<DeviceRange>> reads = {
      {0, {{&a, 64}}}, {1, {{&b, 128}, {&a, 64}}}, {2, {{&b, 128}}}, {3, {{&d, 32}, {&d, 32}}}};
  const std::vector<DeviceRange> r = weight_prefetch_ranges(steps, 1, reads);
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(r[0].ptr, &b);
  EXPECT_EQ(r[0].bytes, 128u);
  EXPECT_EQ(r[1].ptr, &a);
  EXPECT_EQ(r[2].ptr, &d);
  EXPECT_TRUE(weight_prefetch_ranges(steps, 5, reads).empty());
  EXPECT_EQ(weight_prefetch_ranges(steps, 3, reads).size(), 2u);
}

}  // namespace
}  // namespace kiln::cuda
