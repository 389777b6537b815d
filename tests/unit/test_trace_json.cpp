// kiln bench --trace's summary (tools/kiln/profile_json.hpp trace_json): span,
// busy time, gaps and per-group shares of one traced call, from its spans.
#include <gtest/gtest.h>

#include "tools/kiln/profile_json.hpp"

namespace kiln {
namespace {

TEST(TraceJson, SpanBusyGapsAndGroupsOfOneCall) {
  CallTrace t;
  t.replays = 5;
  // layer1: two launches with a 1 us gap; layer2: one launch 2 us after; a PDL-style overlap.
  t.spans = {{"layer1.0.conv1", "kiln::cuda::map_kernel", 0.0, 4.0},
             {"layer1.0.conv2", "memset", 5.0, 1.0},
             {"layer2.0.conv1", "nvjet_x", 8.0, 3.0},
             {"layer2.0.add", "kiln::cuda::map_kernel", 10.5, 2.0}};
  const auto j = cli::trace_json(t);
  EXPECT_EQ(j["replays"], 5);
  EXPECT_EQ(j["launches"], 4);
  EXPECT_DOUBLE_EQ(j["span_us"].get<double>(), 12.5);
  EXPECT_DOUBLE_EQ(j["busy_us"].get<double>(), 10.0);
  EXPECT_DOUBLE_EQ(j["gaps_us"].get<double>(), 3.0);  // 4 -> 5 and 6 -> 8; the overlap is no gap
  ASSERT_EQ(j["groups"].size(), 2u);
  EXPECT_EQ(j["groups"][0]["group"], "layer1");
  EXPECT_DOUBLE_EQ(j["groups"][0]["us"].get<double>(), 6.0);  // to its last end
  EXPECT_DOUBLE_EQ(j["groups"][0]["busy_us"].get<double>(), 5.0);
  EXPECT_EQ(j["groups"][1]["launches"], 2);
  EXPECT_DOUBLE_EQ(j["groups"][1]["us"].get<double>(), 6.5);  // 6 -> 11, then the overlapping launch's 1.5 past it
  EXPECT_DOUBLE_EQ(j["groups"][0]["us"].get<double>() + j["groups"][1]["us"].get<double>(), j["span_us"].get<double>());
  EXPECT_EQ(j["spans"][2]["kernel"], "nvjet_x");
}

// With a family's groups (RT-DETR v2's), each group is one row however its
// launches interleave with another's (the side lane's run beside the main
// line's), rows in the family's order.
TEST(TraceJson, FamilyGroupsSumInterleavedLaunches) {
  CallTrace t;
  t.replays = 1;
  t.spans = {{"model.backbone.model.embedder.embedder.0.convolution", "a", 0.0, 2.0},
             {"model.encoder.encoder.0.layers.0.fc1", "b", 2.0, 1.0},
             {"model.backbone.model.encoder.stages.3.layers.1.layer.1.convolution", "c", 3.0, 1.0},
             {"model.encoder.fpn_blocks.0.conv1.conv", "d", 4.0, 2.0},
             {"model.topk", "e", 6.0, 1.0},
             {"model.decoder.layers.0.fc1", "f", 7.0, 1.0}};
  const auto j = cli::trace_json(t, cli::LayerGrouping::of_family("rt_detr_v2"));
  ASSERT_EQ(j["groups"].size(), 5u) << j["groups"].dump();
  const char* want[] = {"backbone", "AIFI", "encoder", "query selection", "decoder"};
  for (size_t i = 0; i < 5; ++i) EXPECT_EQ(j["groups"][i]["group"], want[i]);
  EXPECT_EQ(j["groups"][0]["launches"], 2);
  EXPECT_DOUBLE_EQ(j["groups"][0]["us"].get<double>(), 3.0);
  EXPECT_DOUBLE_EQ(j["groups"][0]["start_us"].get<double>(), 0.0);
}

// The engine's own call with its side lane: per lane the launches, busy time
// and the time its launches run with no launch of the other lane running; the
// side launches that run alone, most first (the main lane waited for them).
TEST(TraceJson, LanesSayWhenTheMainLaneWaited) {
  CallTrace t;
  t.replays = 2;
  t.spans = {{"a", "k", 0.0, 4.0, "main"},
             {"s1", "k", 1.0, 2.0, "side"},  // [1, 3] under a: never alone
             {"b", "k", 4.0, 2.0, "main"},   // [4, 6]
             {"s2", "k", 5.0, 3.0, "side"},  // [5, 8]: alone on [6, 8]
             {"s3", "k", 8.5, 1.0, "side"},  // [8.5, 9.5]: alone throughout
             {"c", "k", 9.0, 2.0, "main"}};  // [9, 11]
  const auto j = cli::trace_json(t);
  ASSERT_EQ(j["lanes"].size(), 2u) << j.dump();
  EXPECT_EQ(j["lanes"][0]["lane"], "main");
  EXPECT_EQ(j["lanes"][0]["launches"], 3);
  EXPECT_DOUBLE_EQ(j["lanes"][0]["busy_us"].get<double>(), 8.0);
  EXPECT_DOUBLE_EQ(j["lanes"][0]["alone_us"].get<double>(), 2.0 + 1.0 + 1.5);  // a but [1, 3]; b but [5, 6]; c but [9, 9.5]
  EXPECT_EQ(j["lanes"][1]["lane"], "side");
  EXPECT_DOUBLE_EQ(j["lanes"][1]["busy_us"].get<double>(), 6.0);
  EXPECT_DOUBLE_EQ(j["lanes"][1]["alone_us"].get<double>(), 2.5);
  ASSERT_EQ(j["side_alone"].size(), 2u) << "s1 is hidden under a";
  EXPECT_EQ(j["side_alone"][0]["step"], "s2");
  EXPECT_DOUBLE_EQ(j["side_alone"][0]["alone_us"].get<double>(), 2.0);
  EXPECT_EQ(j["side_alone"][1]["step"], "s3");
  EXPECT_DOUBLE_EQ(j["side_alone"][1]["alone_us"].get<double>(), 0.5);
  EXPECT_EQ(j["spans"][1]["lane"], "side");
  // Overlapping launches of one lane (PDL) do not count as the other lane's.
  t.spans = {{"a", "k", 0.0, 4.0, "main"}, {"b", "k", 3.0, 2.0, "main"}, {"s", "k", 4.5, 1.0, "side"}};
  const auto pdl = cli::trace_json(t);
  EXPECT_DOUBLE_EQ(pdl["lanes"][1]["alone_us"].get<double>(), 0.5);  // [5, 5.5]
  EXPECT_DOUBLE_EQ(pdl["lanes"][0]["alone_us"].get<double>(), 4.0 + 1.5);
  // A trace without lanes (one stream) has neither.
  t.spans = {{"a", "k", 0.0, 1.0}};
  const auto one = cli::trace_json(t);
  EXPECT_FALSE(one.contains("lanes"));
  EXPECT_FALSE(one.contains("side_alone"));
  EXPECT_FALSE(one["spans"][0].contains("lane"));
}

TEST(TraceJson, UnavailableTraceSaysWhyAndNothingElse) {
  CallTrace t;
  t.replays = 3;
  t.unavailable = "CUPTI not found";
  const auto j = cli::trace_json(t);
  EXPECT_EQ(j["unavailable"], "CUPTI not found");
  EXPECT_FALSE(j.contains("spans"));
}

}  // namespace
}  // namespace kiln
