// The CUDA backend's graph plans, which need no GPU (they read only the graph):
// - the window-conv plan (window_plan.cpp) on every Res2Net fixture, as CUDA
//   f16 builds shape the graph (pad_channels to 8 channels): which nodes the
//   window conv covers, which adds it fuses, which convs share a launch, which
//   pass-through chunks ride along, the notes `kiln inspect` shows, and the
//   refusals (f32, grouped 3x3s); window tactic names round trip;
// - the squeeze-excitation plan (se_plan.cpp) on every EfficientNet fixture;
// - the per-thread PDL default that engine contexts set per batch size;
// - RT-DETR's ms_deform_attn inputs read in place (plan_deform_inputs) and its
//   feature maps and token rows sharing bytes (plan_token_rows), and its
//   residual and position adds inside their layer norms (plan_norm_adds) and box
//   refinements as one launch (plan_box_refines), and the slices of its merged
//   projections read in place (plan_row_windows), and its f32 score head
//   reading the 16-bit encoder output (plan_wide_linears), and its FPN
//   upsamples read by their concats (plan_upsample_concats), and its query
//   position and box heads as one launch each (plan_mlp_chains);
// - the simplification of strided copies (shape_ops.cu) before their launch.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <string>
#include <thread>

#include "../unit/family_test_util.hpp"
#include "backends/cuda/kernels.hpp"
#include "backends/cuda/lower.hpp"
#include "backends/cuda/se_plan.hpp"
#include "backends/cuda/window_plan.hpp"
#include "rtdetr_graphs.hpp"
#include "runtime/views.hpp"

namespace kiln::cuda {
namespace {

namespace fs = std::filesystem;
const fs::path kRes2net = fs::path(KILN_FIXTURES_DIR) / "res2net";
const fs::path kEffnet = fs::path(KILN_FIXTURES_DIR) / "efficientnet";

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

class WindowPlanFixture : public ::testing::TestWithParam<std::string> {};

TEST_P(WindowPlanFixture, Res2NetBlocksRunAsTheirConvs) {
  const std::string name = GetParam();
  Graph g = testing::fixture_graph(kRes2net / name, DType::F16, 8, "timm_res2net");
  const ChannelViews cv = plan_channel_views(g);
  const WindowPlan p = plan_window_convs(g, cv);
  if (name == "res2next") {
    EXPECT_NE(p.why_not.find("grouped"), std::string::npos) << p.why_not;
    EXPECT_TRUE(p.convs.empty());
    return;
  }
  ASSERT_EQ(p.why_not, "") << name;
  int chunk_convs = 0, adds = 0, first_blocks = 0, chained_blocks = 0, launches_expected = 0;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    if (n.op == Op::Conv2d && n.name.find(".convs.") != std::string::npos) {
      ++chunk_convs;
      EXPECT_TRUE(p.convs.count(i)) << n.name << ": not a window conv";
    }
    if (n.op == Op::Add) {
      ++adds;
      EXPECT_TRUE(p.fused_adds.count(i)) << n.name << ": chain add not fused into the next conv's load";
    }
    if (n.op == Op::Slice) EXPECT_TRUE(cv.is_view(n.outputs[0])) << n.name << ": slice is not a view";
    if (n.op != Op::Concat) continue;
    // A block: its pass-through chunk is pooled (first block) or copied (chained), in a conv's launch.
    const int last = n.inputs.back();
    const int prod = g.values[last].producer;
    const bool first = prod >= 0 && g.nodes[prod].op == Op::AvgPool2d;
    const int convs_here = static_cast<int>(n.inputs.size()) - 1;
    if (first) {
      ++first_blocks;
      EXPECT_TRUE(p.side_pools.count(static_cast<size_t>(prod))) << g.nodes[prod].name << ": pool not in a conv's launch";
      launches_expected += 1;  // the independent chunk convs share one launch
    } else {
      ++chained_blocks;
      EXPECT_TRUE(p.copied_inputs.count({i, n.inputs.size() - 1})) << n.name << ": pass-through chunk not copied by a conv";
      launches_expected += convs_here;  // each needs the previous one's output
    }
    for (int in : n.inputs)
      if (in != last || first) EXPECT_EQ(cv.parent[in], n.outputs[0]) << n.name << ": input not written in place";
  }
  EXPECT_EQ(static_cast<int>(p.convs.size()), chunk_convs) << name;
  EXPECT_EQ(static_cast<int>(p.fused_adds.size()), adds) << name;
  EXPECT_EQ(static_cast<int>(p.launches.size()), launches_expected) << name;
  EXPECT_EQ(static_cast<int>(p.sides.size()), first_blocks + chained_blocks) << name << ": one side job per block";
  EXPECT_GT(first_blocks, 0) << name;
  for (const auto& [lead, run] : p.launches) {
    EXPECT_TRUE(ends_with(g.nodes[lead].name, ".convs.0") || run.size() == 1) << g.nodes[lead].name;
    for (size_t k = 1; k < run.size(); ++k) EXPECT_TRUE(p.grouped.count(run[k]));
  }
  // What `kiln inspect` shows for the nodes that launch nothing.
  const auto notes = window_plan_notes(g, cv, p);
  for (size_t add : p.fused_adds) {
    ASSERT_TRUE(notes.count(g.nodes[add].name)) << g.nodes[add].name;
    EXPECT_NE(notes.at(g.nodes[add].name).find("'s load (no store)"), std::string::npos);
  }
  for (const Node& n : g.nodes) {
    if (n.op == Op::Slice) EXPECT_EQ(notes.count(n.name) ? notes.at(n.name) : "", "view (no copy)") << n.name;
    if (n.op == Op::Concat) EXPECT_NE(notes.at(n.name).find(" written in place"), std::string::npos) << n.name;
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, WindowPlanFixture,
                         ::testing::ValuesIn(testing::fixture_cases(kRes2net)),
                         [](const auto& info) { return info.param; });

// Window conv vs cuDNN per view block: the blocks of a Res2Net fixture are
// its Res2Net blocks; clearing some blocks' views leaves a window plan over
// exactly the others (their convs, chain adds, side jobs), and the cleared
// blocks' slices and concats copy.
TEST_P(WindowPlanFixture, ViewBlocksAreTheRes2NetBlocksAndClearOneByOne) {
  const std::string name = GetParam();
  Graph g = testing::fixture_graph(kRes2net / name, DType::F16, 8, "timm_res2net");
  const ChannelViews cv = plan_channel_views(g);
  const std::vector<ViewBlock> blocks = view_blocks(g, cv);
  int concats = 0;
  for (const Node& n : g.nodes) concats += n.op == Op::Concat;
  ASSERT_EQ(static_cast<int>(blocks.size()), concats) << name << ": one view block per Res2Net block";
  std::map<size_t, size_t> block_of;  // node -> block
  std::set<std::string> names;
  for (size_t b = 0; b < blocks.size(); ++b) {
    EXPECT_TRUE(names.insert(blocks[b].name).second) << blocks[b].name << ": two blocks of one name";
    EXPECT_EQ(blocks[b].name.find("#views"), std::string::npos) << blocks[b].name << ": no common prefix";
    for (size_t ni : blocks[b].nodes) {
      EXPECT_TRUE(block_of.emplace(ni, b).second) << g.nodes[ni].name << ": in two blocks";
      EXPECT_EQ(g.nodes[ni].name.rfind(blocks[b].name + ".", 0), 0u) << g.nodes[ni].name << " in block " << blocks[b].name;
    }
    for (int v : blocks[b].views) EXPECT_TRUE(cv.is_view(v)) << g.values[v].name;
  }
  size_t views = 0;
  for (size_t v = 0; v < g.values.size(); ++v) views += cv.is_view(static_cast<int>(v));
  size_t listed = 0;
  for (const ViewBlock& b : blocks) listed += b.views.size();
  EXPECT_EQ(listed, views) << name << ": every view in exactly one block";
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    const bool chunk_conv = n.op == Op::Conv2d && n.name.find(".convs.") != std::string::npos;
    if (n.op == Op::Slice || n.op == Op::Concat || chunk_conv) EXPECT_EQ(block_of.count(i), 1u) << n.name << ": in no block";
    if (block_of.count(i))  // a block has its slices, chain adds, chunk convs, pass-through pool, concat
      EXPECT_TRUE(n.op == Op::Slice || n.op == Op::Concat || n.op == Op::Add || n.op == Op::AvgPool2d || chunk_conv) << n.name;
  }

  // Each block alone: res2next's grouped 3x3s refuse, the others can; the
  // largest conv is that block's.
  const std::vector<BlockWindows> can = plan_block_windows(g, cv, blocks);
  ASSERT_EQ(can.size(), blocks.size());
  for (size_t b = 0; b < blocks.size(); ++b) {
    int64_t rows = 0;
    for (size_t ni : blocks[b].nodes)
      if (g.nodes[ni].op == Op::Conv2d) {
        const Shape& y = g.values[g.nodes[ni].outputs[0]].shape;
        rows = std::max(rows, y[0] * y[2] * y[3]);
      }
    if (name == "res2next") {
      EXPECT_NE(can[b].why_not.find("grouped"), std::string::npos) << blocks[b].name << ": " << can[b].why_not;
      continue;
    }
    EXPECT_EQ(can[b].why_not, "") << blocks[b].name;
    EXPECT_EQ(can[b].max_rows, rows) << blocks[b].name;
  }
  if (name == "res2next") return;

  // Keep every other block: the window plan covers exactly the kept blocks.
  std::vector<char> keep(blocks.size(), 0);
  for (size_t b = 0; b < blocks.size(); b += 2) keep[b] = 1;
  const ChannelViews kept = keep_view_blocks(g, cv, blocks, keep);
  int kept_slices = 0, kept_in_place = 0;
  for (size_t b = 0; b < blocks.size(); ++b)
    for (size_t ni : blocks[b].nodes) {
      const Node& n = g.nodes[ni];
      if (n.op == Op::Slice) kept_slices += keep[b] && cv.is_view(n.outputs[0]);
      if (n.op == Op::Concat)
        for (int in : n.inputs) kept_in_place += keep[b] && cv.parent[in] == n.outputs[0];
    }
  EXPECT_EQ(kept.slices_as_views, kept_slices) << name;
  EXPECT_EQ(kept.concat_inputs_in_place, kept_in_place) << name;
  EXPECT_EQ(kept.concat_inputs_copied + kept.concat_inputs_in_place, cv.concat_inputs_copied + cv.concat_inputs_in_place);
  for (size_t b = 0; b < blocks.size(); ++b)
    for (int v : blocks[b].views) {
      EXPECT_EQ(kept.is_view(v), keep[b] != 0) << g.values[v].name;
      if (keep[b]) EXPECT_EQ(kept.root_offset(v), cv.root_offset(v)) << g.values[v].name;
    }
  const WindowPlan p = plan_window_convs(g, kept);
  ASSERT_EQ(p.why_not, "") << name;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    const bool in_kept = block_of.count(i) && keep[block_of.at(i)];
    if (n.op == Op::Conv2d && n.name.find(".convs.") != std::string::npos)
      EXPECT_EQ(p.convs.count(i), in_kept ? 1u : 0u) << n.name;
    if (n.op == Op::Add) EXPECT_EQ(p.fused_adds.count(i), in_kept ? 1u : 0u) << n.name;
  }
  for (const auto& [lead, side] : p.sides) EXPECT_TRUE(keep[block_of.at(lead)]) << g.nodes[lead].name;
  const auto notes = window_plan_notes(g, kept, p);
  for (size_t b = 0; b < blocks.size(); ++b)
    for (size_t ni : blocks[b].nodes)
      if (!keep[b]) EXPECT_EQ(notes.count(g.nodes[ni].name), 0u) << g.nodes[ni].name << ": a note in a block on cuDNN";
  // No block kept: no views, no window plan.
  const ChannelViews none = keep_view_blocks(g, cv, blocks, std::vector<char>(blocks.size(), 0));
  EXPECT_EQ(none.slices_as_views + none.concat_inputs_in_place, 0);
  EXPECT_NE(plan_window_convs(g, none).why_not, "");
}

// The timing signature of a view block names its work: the blocks of one
// fixture (all of different shapes) differ, one block's is stable, and the
// batch changes it.
TEST(WindowPlan, ViewBlockSignaturesNameTheirWork) {
  Graph g = testing::fixture_graph(kRes2net / "s4_26w", DType::F16, 8, "timm_res2net");
  const ChannelViews cv = plan_channel_views(g);
  const auto blocks = view_blocks(g, cv);
  std::vector<std::string> names;
  for (const ViewBlock& b : blocks) names.push_back(b.name);
  EXPECT_EQ(names, (std::vector<std::string>{"layer1.0", "layer2.0", "layer2.1", "layer3.0", "layer4.0"}));
  ASSERT_GT(blocks.size(), 2u);
  std::set<std::string> sigs;
  for (const ViewBlock& b : blocks) {
    const std::string s = view_block_signature(g, cv, b, false).str();
    EXPECT_EQ(s.rfind("view block window-vs-cudnn f16 ", 0), 0u) << s;
    EXPECT_EQ(s, view_block_signature(g, cv, b, false).str());
    EXPECT_NE(s, view_block_signature(g, cv, b, true).str()) << "split_always changes the cuDNN side's steps";
    sigs.insert(s);
  }
  EXPECT_EQ(sigs.size(), blocks.size());
  Graph g2 = g;
  for (int in : g2.inputs) g2.values[in].shape[0] = 2;
  g2.infer_shapes();
  const ChannelViews cv2 = plan_channel_views(g2);
  EXPECT_NE(view_block_signature(g2, cv2, view_blocks(g2, cv2)[0], false).str(), view_block_signature(g, cv, blocks[0], false).str());
}

// A block whose nodes share no dotted prefix, or whose prefix is a node's
// name, is named by its first node (the record keys nodes and blocks alike).
TEST(WindowPlan, ViewBlockNamesNeverMeetNodeNames) {
  Graph g = testing::fixture_graph(kRes2net / "s4_26w", DType::F16, 8, "timm_res2net");
  ChannelViews cv = plan_channel_views(g);
  auto blocks = view_blocks(g, cv);
  ASSERT_EQ(blocks.size(), 5u);
  g.nodes[blocks[0].nodes.back()].name = "cat_of_the_first_block";  // layer1.0's concat
  g.nodes[0].name = "layer2.0";                                      // the stem's first node
  blocks = view_blocks(g, cv);
  EXPECT_EQ(blocks[0].name, g.nodes[blocks[0].nodes[0]].name + "#views");
  EXPECT_EQ(blocks[1].name, g.nodes[blocks[1].nodes[0]].name + "#views");
  EXPECT_EQ(blocks[2].name, "layer2.1");
}

TEST(WindowPlan, GraphsWithoutViewsHaveNoBlocks) {
  Graph g = testing::fixture_graph(kRes2net / "s4_26w", DType::F16, 8, "timm_res2net");
  ChannelViews cv = plan_channel_views(g);
  cv.parent.assign(g.values.size(), -1);
  EXPECT_TRUE(view_blocks(g, cv).empty());
}

TEST(WindowPlan, F32GraphsStayOnCudnn) {
  Graph g = testing::fixture_graph(kRes2net / "s4_26w", DType::F32, 4, "timm_res2net");
  const WindowPlan p = plan_window_convs(g, plan_channel_views(g));
  EXPECT_NE(p.why_not.find("f16/bf16"), std::string::npos) << p.why_not;
  EXPECT_TRUE(p.convs.empty() && p.launches.empty() && p.fused_adds.empty());
}

TEST(WindowPlan, TacticNamesRoundTrip) {
  for (int nt : {1, 2, 4})
    for (int warps : {1, 2, 4, 8, 16}) {
      WindowLaunch l{};
      ASSERT_TRUE(parse_window_tactic(window_tactic_name({nt, warps}) + " x3 +layer1.0.chain.1", l));
      EXPECT_EQ(l.nt, nt);
      EXPECT_EQ(l.warps, warps);
    }
  WindowLaunch l{7, 7};
  for (const char* bad : {"", "kiln window conv", "kiln window conv nt3 w4", "kiln window conv nt2 w3",
                          "kiln window conv nt2 w32", "kiln window conv ntx", "eng4_k24=33", "kiln depthwise"})
    EXPECT_FALSE(parse_window_tactic(bad, l)) << bad;
  EXPECT_EQ(l.nt, 7) << "a refused name must leave the launch alone";
}

// Squeeze-excitation: every SE block of the EfficientNet fixtures (none in
// the Lite ones) becomes one se_mlp step, or one se_mlp_scale step with the
// gate fused; the pooled tensor lives until that step.
TEST(SePlan, EveryEfficientNetFixture) {
  for (const std::string& name : testing::fixture_cases(kEffnet)) {
    Graph g = testing::fixture_graph(kEffnet / name, DType::F16, 8, "timm_efficientnet");
    int se_blocks = 0;  // global pools that feed a 1x1 conv (the head's feeds the classifier)
    for (const Node& n : g.nodes)
      if (n.op == Op::GlobalAvgPool)
        for (int r : g.consumers(n.outputs[0])) se_blocks += g.nodes[r].op == Op::Conv2d;
    const bool lite = name.find("lite") != std::string::npos;
    EXPECT_EQ(se_blocks == 0, lite) << name;
    for (bool fuse_mul : {false, true}) {
      const SePlan p = plan_squeeze_excitation(g, fuse_mul);
      const std::string what = name + (fuse_mul ? " +gate" : "");
      EXPECT_EQ(p.fused_away.size(), size_t(se_blocks) * (fuse_mul ? 2 : 1)) << what;
      EXPECT_EQ(p.mlp_at.size(), fuse_mul ? 0u : size_t(se_blocks)) << what;
      EXPECT_EQ(p.scale_at.size(), fuse_mul ? size_t(se_blocks) : 0u) << what;
      EXPECT_EQ(p.live_until.size(), size_t(se_blocks)) << what;
      for (const auto& [second, se] : p.mlp_at) {
        EXPECT_EQ(second, se.expand) << what;
        EXPECT_EQ(g.nodes[second].activation(), Activation::Sigmoid) << g.nodes[second].name;
        EXPECT_EQ(p.live_until.at(g.nodes[se.reduce].inputs[0]), static_cast<int>(second)) << g.nodes[se.reduce].name;
      }
      for (const auto& [mul, se] : p.scale_at) {
        EXPECT_EQ(g.nodes[mul].op, Op::Mul) << g.nodes[mul].name;
        EXPECT_EQ(se.mul, mul) << what;
        EXPECT_EQ(p.live_until.at(g.nodes[se.reduce].inputs[0]), static_cast<int>(mul)) << g.nodes[se.reduce].name;
      }
    }
  }
}

// Layout assignment (lower.hpp): a flatten is a byte alias exactly where the
// NHWC bytes are already in NCHW order (1x1 maps, one channel) or the value is
// stored row-major (not 4-D); elsewhere it transposes.
TEST(LayoutAssignment, FlattenAliasesOnlyWhereBytesAgree) {
  const std::pair<Shape, bool> cases[] = {{{3, 24, 1, 1}, true},  {{2, 1, 3, 3}, true},  {{3, 12, 2, 2}, false},
                                          {{1, 13, 3, 5}, false}, {{2, 3, 5}, true},     {{2, 3, 1, 2, 2}, true}};
  for (const auto& [s, alias] : cases) {
    Graph g;
    const int x = g.add_input("x", DType::F16, s);
    g.mark_output(g.add_node(Op::Flatten, "flatten", {x}));
    EXPECT_EQ(flatten_is_alias(g, g.nodes[0]), alias) << shape_str(s);
    EXPECT_EQ(stored_nhwc(g.values[x]), s.size() == 4) << shape_str(s);
  }
}

// The facts of g after one plan function alone (nothing fused before it).
GraphFacts planned(const Graph& g, void (*plan)(const Graph&, GraphFacts&)) {
  GraphFacts f;
  f.fused_away.assign(g.nodes.size(), 0);
  f.folded_cast.assign(g.nodes.size(), 0);
  f.alias.assign(g.values.size(), -1);
  plan(g, f);
  return f;
}

// The first node of op `op` whose name ends with `suffix` (null when none).
const Node* first_node(const Graph& g, Op op, const std::string& suffix) {
  for (const Node& n : g.nodes)
    if (n.op == op && n.name.ends_with(suffix)) return &n;
  return nullptr;
}

// RT-DETR v2 on CUDA (ms_deform_attn.cpp, plan_deform_inputs): in every
// fixture, f32 and f16 as CUDA builds shape it, each ms_deform_attn reads its
// value and logits (4-D, stored NHWC by the layout rule) as the row-major
// linear outputs they are reshaped from: the two reshapes are fused away and
// alias their inputs. A reshaped value that is also an engine output stays
// stored (NHWC) and is read through the workspace.
TEST(DeformPlan, RtDetrValueAndLogitsAreReadInPlace) {
  for_each_rtdetr_graph([](const std::string& name, DType, Graph& g) {
    auto facts = [&] { return planned(g, plan_deform_inputs); };
    const GraphFacts f = facts();
    int deform = 0;
    for (const Node& n : g.nodes) {
      if (n.op != Op::MsDeformAttn) continue;
      ++deform;
      for (int v : {n.inputs[0], n.inputs[3]}) {
        const int pr = g.values[v].producer;
        ASSERT_GE(pr, 0) << n.name;
        EXPECT_EQ(g.nodes[pr].op, Op::Reshape) << n.name;
        EXPECT_TRUE(f.fused_away[pr]) << g.nodes[pr].name;
        EXPECT_EQ(f.alias[v], g.nodes[pr].inputs[0]) << g.nodes[pr].name;
        EXPECT_FALSE(stored_nhwc(g.values[g.nodes[pr].inputs[0]])) << g.nodes[pr].name;
      }
      EXPECT_EQ(f.alias[n.inputs[1]], -1) << n.name;  // ref and offsets are not touched
      EXPECT_EQ(f.alias[n.inputs[2]], -1) << n.name;
    }
    EXPECT_EQ(std::count(f.fused_away.begin(), f.fused_away.end(), 1), 2 * deform) << name;
    EXPECT_GT(deform, 0) << name;
    // The first layer's value also an engine output: not fused.
    const Node* core = g.find_node("model.decoder.layers.0.encoder_attn.core");
    ASSERT_NE(core, nullptr);
    const int value = core->inputs[0];
    g.mark_output(value);
    const GraphFacts f2 = facts();
    EXPECT_FALSE(f2.fused_away[g.values[value].producer]) << name;
    EXPECT_EQ(f2.alias[value], -1) << name;
    EXPECT_TRUE(f2.fused_away[g.values[core->inputs[3]].producer]) << name;  // logits still read in place
  });
}

// RT-DETR v2 on CUDA (shape_ops.cpp, plan_token_rows): a feature map turned
// into token rows (reshape to [N, C, HW], transpose(0, 2, 1)) and back (the
// reverse pair) costs no copy: the NHWC bytes of the map are the row-major
// tokens. In every fixture AIFI's two pairs and each decoder input level's
// pair are fused away and alias their source; a pair whose intermediate value
// is an engine output is left alone.
TEST(TokenRowsPlan, RtDetrMapsAndTokensShareBytes) {
  for_each_rtdetr_graph([](const std::string& name, DType, Graph& g) {
    auto facts = [&] { return planned(g, plan_token_rows); };
    const GraphFacts f = facts();
    auto fused = [&](const GraphFacts& ff, const std::string& node) {
      const Node* n = g.find_node(node);
      EXPECT_NE(n, nullptr) << node;
      return n != nullptr && ff.fused_away[static_cast<size_t>(n - g.nodes.data())] != 0;
    };
    auto out = [&](const std::string& node) { return g.find_node(node)->outputs[0]; };
    auto in = [&](const std::string& node) { return g.find_node(node)->inputs[0]; };
    int pairs = 0;
    for (const Node& n : g.nodes) {
      if (n.op != Op::Transpose || !n.name.ends_with(".tokens")) continue;
      const std::string p = n.name.substr(0, n.name.size() - 7);  // map -> tokens
      EXPECT_TRUE(fused(f, p + ".flatten")) << name << " " << p;
      EXPECT_TRUE(fused(f, p + ".tokens")) << name << " " << p;
      EXPECT_EQ(f.alias[out(p + ".tokens")], in(p + ".flatten")) << name << " " << p;
      EXPECT_TRUE(stored_nhwc(g.values[in(p + ".flatten")])) << p;
      ++pairs;
    }
    for (const Node& n : g.nodes) {
      if (n.op != Op::Reshape || !n.name.ends_with(".unflatten")) continue;
      const std::string p = n.name.substr(0, n.name.size() - 10);  // tokens -> map
      EXPECT_TRUE(fused(f, p + ".channels")) << name << " " << p;
      EXPECT_TRUE(fused(f, p + ".unflatten")) << name << " " << p;
      EXPECT_EQ(f.alias[out(p + ".unflatten")], in(p + ".channels")) << name << " " << p;
      ++pairs;
    }
    EXPECT_EQ(pairs, 5) << name;  // AIFI in and out, three decoder input levels
    EXPECT_EQ(std::count(f.fused_away.begin(), f.fused_away.end(), 1), 2 * pairs) << name;
    // An intermediate [N, C, HW] value that is also an engine output: that pair stays.
    const Node* first = first_node(g, Op::Reshape, ".flatten");
    ASSERT_NE(first, nullptr);
    const std::string p = first->name.substr(0, first->name.size() - 8);
    g.mark_output(first->outputs[0]);
    const GraphFacts f2 = facts();
    EXPECT_FALSE(fused(f2, p + ".flatten")) << name;
    EXPECT_FALSE(fused(f2, p + ".tokens")) << name;
    EXPECT_EQ(std::count(f2.fused_away.begin(), f2.fused_away.end(), 1), 2 * pairs - 2) << name;
  });
}

// RT-DETR v2 on CUDA (norm.cpp, plan_norm_adds): every post-norm residual
// add (the encoder's and each decoder layer's `*.residual`) runs inside the
// layer norm that reads it, and lives until that layer norm's step; each
// decoder layer's `encoder_attn.pos_add` (the self-attention's layer norm
// output + the query position, computed before it) is written by that layer
// norm's launch, its buffer live from there, as is the f32 copy of the
// encoder output's layer norm in 16-bit graphs. A residual sum that is also an
// engine output keeps its own launch; the self-attention's pos_add reads a
// position computed after the previous layer's norm and stays.
TEST(NormAddPlan, RtDetrResidualsAndPositionsRunInsideTheirLayerNorms) {
  for_each_rtdetr_graph([](const std::string& name, DType dt, Graph& g) {
    auto facts = [&] { return planned(g, plan_norm_adds); };
    const GraphFacts f = facts();
    size_t residuals = 0, positions = 0;
    for (size_t ni = 0; ni < g.nodes.size(); ++ni) {
      const Node& n = g.nodes[ni];
      if (n.op != Op::Add) continue;
      if (n.name.ends_with(".residual")) {
        ++residuals;
        EXPECT_TRUE(f.fused_away[ni]) << name << " " << n.name;
        const auto readers = g.consumers(n.outputs[0]);
        ASSERT_EQ(readers.size(), 1u) << n.name;
        EXPECT_EQ(g.nodes[readers[0]].op, Op::LayerNorm) << n.name;
        ASSERT_EQ(f.norm_adds.count(readers[0]), 1u) << n.name;
        EXPECT_EQ(f.norm_adds.at(readers[0]).residual, ni) << n.name;
        for (int in : n.inputs) EXPECT_GE(f.live_until.at(in), static_cast<int>(readers[0])) << n.name;
      } else if (n.name.starts_with("model.decoder.layers.") && n.name.ends_with(".encoder_attn.pos_add")) {
        ++positions;
        EXPECT_TRUE(f.fused_away[ni]) << name << " " << n.name;
        const int norm = g.values[n.inputs[0]].producer;
        ASSERT_GE(norm, 0) << n.name;
        EXPECT_EQ(g.nodes[norm].op, Op::LayerNorm) << n.name;
        ASSERT_EQ(f.norm_adds.count(norm), 1u) << n.name;
        EXPECT_EQ(f.norm_adds.at(norm).pos, ni) << n.name;
        EXPECT_EQ(f.norm_adds.at(norm).pos_value, n.inputs[1]) << n.name;
        EXPECT_EQ(f.live_from.at(n.outputs[0]), norm) << n.name;
      } else {
        EXPECT_FALSE(f.fused_away[ni]) << name << " " << n.name;  // AIFI's constant, the self-attention's
      }
    }
    // 16-bit graphs: the encoder output's layer norm also writes its f32 copy for the score head.
    size_t widened = 0;
    for (size_t ni = 0; ni < g.nodes.size(); ++ni) {
      const Node& n = g.nodes[ni];
      if (n.op != Op::Cast || g.values[n.inputs[0]].producer < 0) continue;
      const int norm = g.values[n.inputs[0]].producer;
      if (g.nodes[norm].op != Op::LayerNorm) continue;
      ++widened;
      EXPECT_TRUE(f.fused_away[ni]) << name << " " << n.name;
      ASSERT_EQ(f.norm_adds.count(norm), 1u) << n.name;
      EXPECT_EQ(f.norm_adds.at(norm).widen, ni) << n.name;
      EXPECT_EQ(f.live_from.at(n.outputs[0]), norm) << n.name;
    }
    EXPECT_EQ(widened, dt == DType::F16 ? 1u : 0u) << name;  // model.enc_output.1.to_f32
    EXPECT_GE(residuals, 5u) << name;  // AIFI's two, three per decoder layer
    EXPECT_GE(positions, 1u) << name;  // one per decoder layer
    EXPECT_EQ(static_cast<size_t>(std::count(f.fused_away.begin(), f.fused_away.end(), 1)), residuals + positions + widened)
        << name;
    const Node* first = first_node(g, Op::Add, ".residual");
    ASSERT_NE(first, nullptr);
    g.mark_output(first->outputs[0]);
    const GraphFacts f2 = facts();
    EXPECT_FALSE(f2.fused_away[static_cast<size_t>(first - g.nodes.data())]) << name;
    EXPECT_EQ(static_cast<size_t>(std::count(f2.fused_away.begin(), f2.fused_away.end(), 1)),
              residuals + positions + widened - 1)
        << name;
  });
}

// RT-DETR v2 on CUDA (layout.cpp, plan_upsample_concats): each FPN level's
// nearest upsample (`model.encoder.fpn_up.<i>`) is read by its concat
// (`fpn_cat.<i>`) inside the concat's launch: fused away, its output an alias
// of the lateral map, which lives until the concat. An upsample that is also
// an engine output keeps its launch.
TEST(UpsampleConcatPlan, RtDetrFpnUpsamplesRunInsideTheirConcats) {
  for_each_rtdetr_graph([](const std::string& name, DType dt, Graph& g) {
    const GraphFacts f = planned(g, plan_upsample_concats);
    size_t ups = 0;
    for (size_t ni = 0; ni < g.nodes.size(); ++ni) {
      const Node& n = g.nodes[ni];
      if (n.op != Op::UpsampleNearest) continue;
      ++ups;
      EXPECT_TRUE(f.fused_away[ni]) << name << " " << n.name;
      const auto readers = g.consumers(n.outputs[0]);
      ASSERT_EQ(readers.size(), 1u) << n.name;
      const auto cat = static_cast<size_t>(readers[0]);
      EXPECT_EQ(g.nodes[cat].op, Op::Concat) << n.name;
      size_t k = 0;
      while (g.nodes[cat].inputs[k] != n.outputs[0]) ++k;
      ASSERT_EQ(f.upsample_reads.count({cat, k}), 1u) << n.name;
      const UpsampleRead& r = f.upsample_reads.at({cat, k});
      EXPECT_EQ(r.src, n.inputs[0]) << n.name;
      EXPECT_EQ(r.sh, 2) << n.name;
      EXPECT_EQ(r.sw, 2) << n.name;
      EXPECT_EQ(r.upsample, ni) << n.name;
      EXPECT_EQ(f.alias[n.outputs[0]], n.inputs[0]) << n.name;
      EXPECT_GE(f.live_until.at(n.inputs[0]), static_cast<int>(cat)) << n.name;
    }
    EXPECT_GE(ups, 1u) << name;
    EXPECT_EQ(f.upsample_reads.size(), ups) << name;
    EXPECT_EQ(static_cast<size_t>(std::count(f.fused_away.begin(), f.fused_away.end(), 1)), ups) << name;
    const Node* first = first_node(g, Op::UpsampleNearest, "");
    ASSERT_NE(first, nullptr);
    g.mark_output(first->outputs[0]);
    const GraphFacts f2 = planned(g, plan_upsample_concats);
    EXPECT_FALSE(f2.fused_away[static_cast<size_t>(first - g.nodes.data())]) << name;
    EXPECT_EQ(f2.upsample_reads.size(), ups - 1) << name;
  });
}

// RT-DETR v2 on CUDA (linear.cpp, plan_wide_linears): in 16-bit graphs the
// f32 score head (`model.enc_score_head`, the top-k's f32 island) reads the
// encoder output through a widening cast; the plan fuses the cast away, the
// linear reads the 16-bit value (a 16-bit product with f32 output) and the
// cast's output has no bytes of its own. f32 graphs have no such cast; a
// widened value that is also an engine output keeps its cast.
TEST(WideLinearPlan, RtDetrScoreHeadReadsTheSixteenBitEncoderOutput) {
  for_each_rtdetr_graph([](const std::string& name, DType dt, Graph& g) {
    const GraphFacts f = planned(g, plan_wide_linears);
    const Node* head = first_node(g, Op::Linear, "model.enc_score_head");
    ASSERT_NE(head, nullptr) << name;
    const size_t hi = static_cast<size_t>(head - g.nodes.data());
    if (dt == DType::F32) {
      EXPECT_TRUE(f.wide_linears.empty()) << name;
      return;
    }
    ASSERT_EQ(f.wide_linears.size(), 1u) << name;
    ASSERT_EQ(f.wide_linears.count(hi), 1u) << name;
    const int widened = head->inputs[0];
    const auto cast = static_cast<size_t>(g.values[widened].producer);
    EXPECT_EQ(g.nodes[cast].op, Op::Cast) << name;
    EXPECT_TRUE(f.fused_away[cast]) << name;
    const int u = f.wide_linears.at(hi);
    EXPECT_EQ(u, g.nodes[cast].inputs[0]) << name;
    EXPECT_EQ(g.values[u].dtype, DType::F16) << name;
    EXPECT_EQ(f.alias[widened], u) << name;
    EXPECT_GE(f.live_until.at(u), static_cast<int>(hi)) << name;
    EXPECT_EQ(static_cast<size_t>(std::count(f.fused_away.begin(), f.fused_away.end(), 1)), 1u) << name;
    g.mark_output(widened);
    const GraphFacts f2 = planned(g, plan_wide_linears);
    EXPECT_TRUE(f2.wide_linears.empty()) << name;
    EXPECT_FALSE(f2.fused_away[cast]) << name;
  });
}

// RT-DETR v2 on CUDA (linear.cpp, plan_mlp_chains): in 16-bit graphs each
// decoder layer's query position head (query_pos.0 -> .1) and box head
// (bbox_embed.<i>.layers.0 -> 1 -> 2) run as one mlp_chain launch at their
// last linear: the others are fused away and the chain's input lives until
// the launch. The encoder's box head joins them while its rows (anchors) are
// few. The projections before a post-norm residual (self-attention out_proj,
// deformable attention output_proj) and the FFN (fc1 -> fc2), of AIFI and of
// every decoder layer, run inside their layer norm's launch. No chain takes
// a linear read by anything but the next.
// f32 graphs run their linears one by one; so do chains cut by an output.
TEST(MlpChainPlan, RtDetrQueryPositionAndBoxHeadsAreOneLaunchEach) {
  auto plan = [](const Graph& g, GraphFacts& f) {
    plan_wide_linears(g, f);
    plan_norm_adds(g, f);
    plan_mlp_chains(g, f, 132, true, true, LinearNormRule{});  // an H100's or H200's multiprocessors; switch fuse_mlp on
  };
  for_each_rtdetr_graph([&](const std::string& name, DType dt, Graph& g) {
    const GraphFacts f = planned(g, plan);
    if (dt == DType::F32) {
      EXPECT_TRUE(f.mlp_chains.empty()) << name;
      return;
    }
    size_t query_pos = 0, box = 0, norms = 0;
    for (const auto& [last, chain] : f.mlp_chains) {
      const std::string& ln = g.nodes[last].name;
      if (g.nodes[last].op == Op::LayerNorm) {
        // Inside the norm: its residual add reads the chain's last result.
        ++norms;
        const size_t residual = f.norm_adds.at(last).residual;
        ASSERT_NE(residual, kNoNode) << ln;
        const int d = g.nodes[chain.back()].outputs[0];
        EXPECT_TRUE(g.nodes[residual].inputs[0] == d || g.nodes[residual].inputs[1] == d) << ln;
        EXPECT_TRUE(ln.ends_with("self_attn_layer_norm") || ln.ends_with("encoder_attn_layer_norm") ||
                    ln.ends_with("final_layer_norm"))
            << ln;
        EXPECT_EQ(chain.size(), ln.ends_with("final_layer_norm") ? 2u : 1u) << ln;  // fc1 (ReLU, AIFI's GELU) -> fc2; out_proj or output_proj
        for (size_t c : chain) EXPECT_TRUE(f.fused_away[c]) << g.nodes[c].name;
        EXPECT_GE(f.live_until.at(g.nodes[chain.front()].inputs[0]), static_cast<int>(last)) << ln;
        continue;
      }
      ASSERT_GE(chain.size(), 2u) << name;
      EXPECT_EQ(chain.back(), last) << name;
      if (ln.ends_with(".query_pos.1")) {
        ++query_pos;
        EXPECT_EQ(chain.size(), 2u) << ln;
        // The self-attention's query + position add is written by the chain's
        // launch: fused away, its buffer live from the launch, and the query
        // (produced before) kept until it.
        ASSERT_EQ(f.mlp_chain_sums.count(last), 1u) << ln;
        const size_t add = f.mlp_chain_sums.at(last);
        const Node& an = g.nodes[add];
        EXPECT_EQ(an.name, ln.substr(0, ln.size() - std::string(".query_pos.1").size()) + ".self_attn.pos_add") << ln;
        EXPECT_TRUE(f.fused_away[add]) << an.name;
        EXPECT_EQ(f.live_from.at(an.outputs[0]), static_cast<int>(last)) << an.name;
        const int other = an.inputs[0] == g.nodes[last].outputs[0] ? an.inputs[1] : an.inputs[0];
        EXPECT_LT(g.values[other].producer, static_cast<int>(last)) << an.name;
        EXPECT_GE(f.live_until.at(other), static_cast<int>(last)) << an.name;
      } else if (ln.starts_with("model.decoder.bbox_embed.")) {
        ++box;
        EXPECT_EQ(chain.size(), 3u) << ln;
      } else {
        EXPECT_EQ(ln, "model.enc_bbox_head.layers.2") << name;
      }
      for (size_t k = 0; k < chain.size(); ++k) {
        const Node& n = g.nodes[chain[k]];
        EXPECT_EQ(n.op, Op::Linear) << n.name;
        EXPECT_EQ(static_cast<bool>(f.fused_away[chain[k]]), k + 1 < chain.size()) << n.name;
        if (k > 0) {
          EXPECT_EQ(n.inputs[0], g.nodes[chain[k - 1]].outputs[0]) << n.name;
          EXPECT_EQ(g.consumers(n.inputs[0]).size(), 1u) << n.name;
        }
      }
      EXPECT_GE(f.live_until.at(g.nodes[chain.front()].inputs[0]), static_cast<int>(last)) << ln;
    }
    size_t layers = 0;  // FFNs: AIFI's and the decoder layers'
    for (const Node& n : g.nodes) layers += n.op == Op::Linear && n.name.ends_with(".fc2");
    EXPECT_GE(query_pos, 1u) << name;
    EXPECT_EQ(box, query_pos) << name;
    EXPECT_EQ(f.mlp_chain_sums.size(), query_pos) << name;  // no other chain's output is added to an earlier value
    size_t post_norms = 0;  // two per AIFI layer, three per decoder layer
    for (const Node& n : g.nodes)
      post_norms += n.op == Op::LayerNorm && (n.name.ends_with("self_attn_layer_norm") || n.name.ends_with("encoder_attn_layer_norm") ||
                                              n.name.ends_with("final_layer_norm"));
    EXPECT_EQ(norms, post_norms) << name;
    // Cut by an output: the box head's middle layer read outside the chain
    // ends a chain of the first two; the third runs alone.
    const Node* mid = g.find_node("model.decoder.bbox_embed.0.layers.1");
    ASSERT_NE(mid, nullptr) << name;
    const auto mi = static_cast<size_t>(mid - g.nodes.data());
    g.mark_output(mid->outputs[0]);
    const GraphFacts f2 = planned(g, plan);
    ASSERT_EQ(f2.mlp_chains.count(mi), 1u) << name;
    EXPECT_EQ(f2.mlp_chains.at(mi).size(), 2u) << name;
    for (const auto& [last, chain] : f2.mlp_chains)
      EXPECT_NE(g.nodes[last].name, "model.decoder.bbox_embed.0.layers.2") << name;
    EXPECT_EQ(f2.mlp_chains.size(), f.mlp_chains.size()) << name;
    EXPECT_GE(layers, 1u) << name;
  });
}

// RT-DETR v2 on CUDA (layout.cpp, plan_concat_masks): the memory (the concat
// of the decoder input projections' token rows) times the valid-anchor mask
// runs inside the concat's launch — the mul fused away, its output live from
// the concat — where the fixture has invalid anchors (else the family builds
// no mul). A mask of another shape, or a mul reading the concat second, is
// not taken.
TEST(ConcatMaskPlan, RtDetrMemoryMaskIsWrittenByTheConcat) {
  int masked = 0;
  for_each_rtdetr_graph([&](const std::string& name, DType, Graph& g) {
    const GraphFacts f = planned(g, [](const Graph& gg, GraphFacts& ff) {
      plan_token_rows(gg, ff);
      plan_concat_masks(gg, ff);
    });
    const Node* mul = g.find_node("model.memory.masked");
    const Node* cat = g.find_node("model.memory");
    ASSERT_NE(cat, nullptr) << name;
    const auto ci = static_cast<size_t>(cat - g.nodes.data());
    if (!mul) {
      EXPECT_TRUE(f.concat_masks.empty()) << name;
      return;
    }
    const auto mi = static_cast<size_t>(mul - g.nodes.data());
    ++masked;
    ASSERT_EQ(f.concat_masks.count(ci), 1u) << name;
    EXPECT_EQ(f.concat_masks.at(ci), mi) << name;
    EXPECT_TRUE(f.fused_away[mi]) << name;
    EXPECT_EQ(f.live_from.at(mul->outputs[0]), static_cast<int>(ci)) << name;
    // The mask as [S] (not [1, S, 1]): not taken.
    Graph h = g;
    Value& mask = h.values[h.nodes[mi].inputs[1]];
    mask.shape = {mask.shape[1]};
    const GraphFacts f2 = planned(h, [](const Graph& gg, GraphFacts& ff) { plan_concat_masks(gg, ff); });
    EXPECT_TRUE(f2.concat_masks.empty()) << name;
  });
  EXPECT_GT(masked, 0);  // some fixture has anchors outside (0.01, 0.99)
}

// RT-DETR v2 on CUDA (linear.cpp, plan_mlp_chains, switch linear_norm): by
// default each post-norm's one projection (AIFI's and every decoder layer's
// self_attn out_proj, the deformable attention's output_proj) runs inside its
// layer norm's launch as small_gemm_norm where that kernel takes its shape (d
// model a multiple of 16, k <= 256): the linear fused away, its input live
// until the norm. The FFN (two linears) never does; f32 graphs never do. Off:
// none; over max_rows rows: none; at load exactly the norms the plan names.
TEST(MlpChainPlan, RtDetrPostNormProjectionsRunAsSmallGemmNorm) {
  static LinearNormRule rule;
  auto plan = [](const Graph& g, GraphFacts& f) {
    plan_wide_linears(g, f);
    plan_norm_adds(g, f);
    plan_box_refines(g, f);
    plan_mlp_chains(g, f, 132, true, false, rule);
  };
  for_each_rtdetr_graph([&](const std::string& name, DType dt, Graph& g) {
    rule = LinearNormRule{};
    const GraphFacts f = planned(g, plan);
    size_t expected = 0;
    std::string some;
    for (size_t ni = 0; ni < g.nodes.size(); ++ni) {
      const Node& n = g.nodes[ni];
      if (n.op != Op::LayerNorm || !(n.name.ends_with("self_attn_layer_norm") || n.name.ends_with("encoder_attn_layer_norm")))
        continue;
      const int64_t c = g.values[n.outputs[0]].shape.back();
      const bool takes = dt != DType::F32 && c % 16 == 0;
      expected += takes;
      EXPECT_EQ(f.linear_norms.count(ni), takes ? 1u : 0u) << name << " " << n.name;
      if (!takes) continue;
      some = n.name;
      ASSERT_EQ(f.mlp_chains.count(ni), 1u) << n.name;
      const std::vector<size_t>& chain = f.mlp_chains.at(ni);
      ASSERT_EQ(chain.size(), 1u) << n.name;
      const Node& lin = g.nodes[chain[0]];
      EXPECT_TRUE(lin.name.ends_with(".out_proj") || lin.name.ends_with(".output_proj")) << lin.name;
      EXPECT_TRUE(f.fused_away[chain[0]]) << lin.name;
      EXPECT_GE(f.live_until.at(lin.inputs[0]), static_cast<int>(ni)) << lin.name;
    }
    EXPECT_EQ(f.linear_norms.size(), expected) << name;
    for (size_t ln : f.linear_norms) EXPECT_FALSE(g.nodes[ln].name.ends_with("final_layer_norm")) << g.nodes[ln].name;
    rule.on = false;
    EXPECT_TRUE(planned(g, plan).linear_norms.empty()) << name;
    rule = LinearNormRule{};
    rule.max_rows = 1;
    EXPECT_TRUE(planned(g, plan).linear_norms.empty()) << name;
    if (some.empty()) return;
    const std::set<std::string> recorded = {some};
    rule = LinearNormRule{};
    rule.recorded = &recorded;
    const GraphFacts r = planned(g, plan);
    ASSERT_EQ(r.linear_norms.size(), 1u) << name;
    EXPECT_EQ(g.nodes[*r.linear_norms.begin()].name, some) << name;
    const std::set<std::string> none;
    rule.recorded = &none;  // a plan from before the switch: none, whatever the rule would take
    EXPECT_TRUE(planned(g, plan).linear_norms.empty()) << name;
  });
}

// RT-DETR v2 on CUDA (linear.cpp, plan_mlp_chains' links): in 16-bit graphs
// the box head chain before each query position head (the encoder's head
// before the first decoder layer, layer i's box head before layer i + 1's),
// the box refinement between them and that query position chain run as one
// launch at the box head's last linear: the refinement (its add, casts and
// inverse_sigmoid), the second chain and its query + position sum are fused
// away, and everything they write lives from that launch. The last layer's
// box head and refinement (the pred_boxes output) keep their own launches.
TEST(MlpChainPlan, RtDetrBoxHeadRefinementAndNextQueryPositionAreOneLaunch) {
  auto plan = [](const Graph& g, GraphFacts& f) {
    plan_wide_linears(g, f);
    plan_norm_adds(g, f);
    plan_box_refines(g, f);
    plan_mlp_chains(g, f, 132, true, false, LinearNormRule{});  // the default: switch fuse_mlp auto
  };
  for_each_rtdetr_graph([&](const std::string& name, DType dt, Graph& g) {
    const GraphFacts f = planned(g, plan);
    if (dt == DType::F32) {
      EXPECT_TRUE(f.mlp_chain_links.empty()) << name;
      return;
    }
    size_t decoder_layers = 0;
    for (const Node& n : g.nodes) decoder_layers += n.op == Op::Add && n.name.starts_with("model.decoder.bbox_embed.");
    ASSERT_GE(decoder_layers, 1u) << name;
    EXPECT_EQ(f.mlp_chain_links.size(), decoder_layers) << name;  // before the first layer, and between layers
    for (const auto& [a, link] : f.mlp_chain_links) {
      const std::string& an = g.nodes[a].name;
      EXPECT_TRUE(an == "model.enc_bbox_head.layers.2" || (an.starts_with("model.decoder.bbox_embed.") && an.ends_with(".layers.2")))
          << an;
      ASSERT_EQ(f.mlp_chains.count(a), 1u) << an;
      EXPECT_EQ(f.mlp_chains.at(a).size(), 3u) << an;
      ASSERT_EQ(link.next.size(), 2u) << an;
      const Node& qp = g.nodes[link.next.back()];
      EXPECT_TRUE(qp.name.ends_with(".query_pos.1")) << qp.name;
      EXPECT_EQ(f.mlp_chains.count(link.next.back()), 0u) << qp.name;  // no launch of its own
      ASSERT_EQ(f.box_refines.count(link.refine), 1u) << an;
      const BoxRefine& r = f.box_refines.at(link.refine);
      EXPECT_EQ(r.delta, g.nodes[a].outputs[0]) << an;
      ASSERT_NE(r.narrow, kNoNode) << an;
      EXPECT_EQ(g.nodes[link.next.front()].inputs[0], g.nodes[r.narrow].outputs[0]) << an;  // the narrowed reference
      EXPECT_EQ(r.inverse == kNoNode, an == "model.enc_bbox_head.layers.2") << an;  // the picked anchors are added as they are
      for (size_t k : {link.refine, r.narrow, link.next.front(), link.next.back()}) EXPECT_TRUE(f.fused_away[k]) << g.nodes[k].name;
      for (size_t k : {link.refine, r.narrow, link.next.back()})
        EXPECT_EQ(f.live_from.at(g.nodes[k].outputs[0]), static_cast<int>(a)) << g.nodes[k].name;
      ASSERT_EQ(f.mlp_chain_sums.count(link.next.back()), 1u) << qp.name;
      const size_t sum = f.mlp_chain_sums.at(link.next.back());
      EXPECT_EQ(f.live_from.at(g.nodes[sum].outputs[0]), static_cast<int>(a)) << g.nodes[sum].name;
      EXPECT_GE(f.live_until.at(r.ref), static_cast<int>(a)) << an;
      EXPECT_LT(g.values[r.ref].producer, static_cast<int>(a)) << an;
    }
    // The last layer: its box head is a chain alone, its refinement its own launch.
    const std::string last = "model.decoder.bbox_embed." + std::to_string(decoder_layers - 1);
    const Node* head = g.find_node(last + ".layers.2");
    const Node* refine = g.find_node(last + ".add");
    ASSERT_NE(head, nullptr) << name;
    ASSERT_NE(refine, nullptr) << name;
    const auto hi = static_cast<size_t>(head - g.nodes.data()), ri = static_cast<size_t>(refine - g.nodes.data());
    EXPECT_EQ(f.mlp_chains.count(hi), 1u) << name;
    EXPECT_EQ(f.mlp_chain_links.count(hi), 0u) << name;
    EXPECT_FALSE(f.fused_away[ri]) << name;
  });
}

// RT-DETR v2 on CUDA (elementwise.cpp, plan_box_refines): each decoder
// layer's box refinement (`bbox_embed.<i>.add`) takes in its inverse_sigmoid,
// and in 16-bit graphs the cast that widens the delta and the cast that
// narrows the new reference for the next layer (none after the last layer);
// the narrowed value's buffer lives from the add's step. The initial
// reference points (head + picked anchors, sigmoid, narrowing cast) are one
// launch too.
TEST(BoxRefinePlan, RtDetrRefinementsAreOneLaunchEach) {
  for_each_rtdetr_graph([](const std::string& name, DType dt, Graph& g) {
    const GraphFacts f = planned(g, plan_box_refines);
    size_t layers = 0, narrowed = 0;
    for (size_t ni = 0; ni < g.nodes.size(); ++ni) {
      const Node& n = g.nodes[ni];
      if (n.op != Op::Add || !n.name.starts_with("model.decoder.bbox_embed.")) continue;
      ++layers;
      ASSERT_EQ(f.box_refines.count(ni), 1u) << name << " " << n.name;
      const BoxRefine& r = f.box_refines.at(ni);
      ASSERT_NE(r.inverse, kNoNode) << n.name;
      EXPECT_EQ(g.nodes[r.inverse].op, Op::InverseSigmoid) << n.name;
      EXPECT_TRUE(f.fused_away[r.inverse]) << n.name;
      EXPECT_EQ(g.values[r.ref].dtype, DType::F32) << n.name;
      if (dt == DType::F32) {
        EXPECT_EQ(r.widen, kNoNode) << n.name;
        EXPECT_EQ(r.narrow, kNoNode) << n.name;
        EXPECT_EQ(r.delta, n.inputs[0]) << n.name;
        continue;
      }
      ASSERT_NE(r.widen, kNoNode) << n.name;
      EXPECT_EQ(g.nodes[r.widen].op, Op::Cast) << n.name;
      EXPECT_TRUE(f.fused_away[r.widen]) << n.name;
      EXPECT_EQ(g.values[r.delta].dtype, DType::F16) << n.name;
      if (r.narrow == kNoNode) continue;
      ++narrowed;
      EXPECT_EQ(g.nodes[r.narrow].op, Op::Cast) << n.name;
      EXPECT_TRUE(f.fused_away[r.narrow]) << n.name;
      const int out = g.nodes[r.narrow].outputs[0];
      EXPECT_EQ(g.values[out].dtype, DType::F16) << n.name;
      EXPECT_EQ(f.live_from.at(out), static_cast<int>(ni)) << n.name;
      EXPECT_GE(f.live_until.at(r.delta), static_cast<int>(r.narrow)) << n.name;
      EXPECT_GE(f.live_until.at(r.ref), static_cast<int>(r.narrow)) << n.name;
    }
    EXPECT_GE(layers, 1u) << name;
    // The reference points before the first layer: sigmoid(box head on the
    // picked rows + the picked anchors), the sigmoid folded into the add. One
    // launch with the head's widening cast and, in 16-bit graphs, the
    // narrowing cast for the first layer; the anchors are added as they are.
    const Node* init = g.find_node("model.enc_bbox_head.anchors");
    ASSERT_NE(init, nullptr) << name;
    EXPECT_EQ(init->activation(), Activation::Sigmoid) << name;
    const size_t ii = static_cast<size_t>(init - g.nodes.data());
    ASSERT_EQ(f.box_refines.count(ii), 1u) << name;
    const BoxRefine& r0 = f.box_refines.at(ii);
    EXPECT_EQ(r0.inverse, kNoNode) << name;
    EXPECT_EQ(r0.ref, init->inputs[1]) << name;
    const int anchors_from = g.values[r0.ref].producer;
    ASSERT_GE(anchors_from, 0) << name;
    EXPECT_EQ(g.nodes[anchors_from].name, "model.enc_topk_anchors") << name;
    EXPECT_EQ(g.nodes[anchors_from].op, Op::Gather) << name;
    if (dt == DType::F16) {
      ASSERT_NE(r0.widen, kNoNode) << name;
      EXPECT_TRUE(f.fused_away[r0.widen]) << name;
      EXPECT_EQ(g.values[r0.delta].dtype, DType::F16) << name;
      ASSERT_NE(r0.narrow, kNoNode) << name;
      EXPECT_TRUE(f.fused_away[r0.narrow]) << name;
      EXPECT_EQ(f.live_from.at(g.nodes[r0.narrow].outputs[0]), static_cast<int>(ii)) << name;
    } else {
      EXPECT_EQ(r0.widen, kNoNode) << name;
      EXPECT_EQ(r0.narrow, kNoNode) << name;
    }
    EXPECT_EQ(f.box_refines.size(), layers + 1) << name;  // no other node matches
    if (dt == DType::F16) EXPECT_EQ(narrowed, layers - 1) << name;  // the last layer's boxes are an output, in f32
  });
}

// RT-DETR v2 on CUDA (shape_ops.cpp, plan_row_windows): every slice of a
// merged projection (merge_parallel_linears: q and k, the sampling offsets
// and attention logits, the decoder layers' values) is fused away and read in
// place as a window of each row of the projection, which lives until the
// last reader; a slice that is also an engine output is copied.
TEST(RowWindowPlan, RtDetrSlicesOfMergedProjectionsAreReadInPlace) {
  auto plan = [](const Graph& g, GraphFacts& f) {
    for (const Node& n : g.nodes)  // plan_fusions' byte aliases first
      if (n.op == Op::Reshape && reshape_is_alias(g, n)) f.alias[n.outputs[0]] = n.inputs[0];
    plan_deform_inputs(g, f);
    plan_row_windows(g, f);
  };
  for_each_rtdetr_graph([&](const std::string& name, DType, Graph& g) {
    const GraphFacts f = planned(g, plan);
    size_t slices = 0, layers = 0;
    for (const Node& n : g.nodes) layers += n.op == Op::MsDeformAttn;
    for (size_t ni = 0; ni < g.nodes.size(); ++ni) {
      const Node& n = g.nodes[ni];
      if (n.op != Op::Slice) continue;
      const int src = n.inputs[0];
      const int p = g.values[src].producer;
      ASSERT_GE(p, 0) << n.name;
      EXPECT_EQ(g.nodes[p].op, Op::Linear) << n.name;
      EXPECT_NE(g.nodes[p].name.find('{'), std::string::npos) << n.name << " slices " << g.nodes[p].name;
      ++slices;
      EXPECT_TRUE(f.fused_away[ni]) << name << " " << n.name;
      ASSERT_EQ(f.windows.count(n.outputs[0]), 1u) << n.name;
      const RowWindow& w = f.windows.at(n.outputs[0]);
      EXPECT_EQ(w.src, src) << n.name;
      EXPECT_EQ(w.offset, n.attr_int("start")) << n.name;
      EXPECT_EQ(w.ld, g.values[src].shape.back()) << n.name;
      EXPECT_EQ(w.slice, ni) << n.name;
      EXPECT_EQ(f.alias[n.outputs[0]], src) << n.name;  // no bytes of its own
      int last = -1;  // the readers: attention, or ms_deform_attn through a reshape
      for (int c : g.consumers(n.outputs[0]))
        for (int d : g.nodes[c].op == Op::Reshape ? g.consumers(g.nodes[c].outputs[0]) : std::vector<int>{c}) last = std::max(last, d);
      EXPECT_GE(f.live_until.at(src), last) << n.name;
    }
    // AIFI's q and k; each layer's q, k, offsets, logits; the values where there are two layers or more.
    EXPECT_EQ(slices, 2 + 4 * layers + (layers > 1 ? layers : 0)) << name;
    const Node* first = first_node(g, Op::Slice, ".q_proj");
    ASSERT_NE(first, nullptr);
    g.mark_output(first->outputs[0]);
    const GraphFacts f2 = planned(g, plan);
    EXPECT_FALSE(f2.fused_away[static_cast<size_t>(first - g.nodes.data())]) << name;
    EXPECT_EQ(f2.windows.size(), slices - 1) << name;
  });
}

// The f32 cast of a 16-bit output (`logits` in every fp16 engine) is folded
// into the output conversion after the graph (cuda_program.cpp,
// plan_output_casts): the cast has no step, the conversion reads its 16-bit
// input, which lives to the end. f32 graphs have no such cast; an output
// cast of a constant or of an f32 value is left alone.
TEST(OutputCastPlan, SixteenBitOutputsAreConvertedFromTheirOwnBytes) {
  for_each_rtdetr_graph([](const std::string& name, DType dt, Graph& g) {
    const GraphFacts f = planned(g, plan_output_casts);
    size_t folded = 0;
    for (int v : g.outputs) {
      const int c = g.values[v].producer;
      const bool cast16 = c >= 0 && g.nodes[c].op == Op::Cast && g.values[g.nodes[c].inputs[0]].dtype == DType::F16;
      EXPECT_EQ(f.output_from.count(v), cast16 ? 1u : 0u) << name << " " << g.values[v].name;
      if (!cast16) continue;
      ++folded;
      EXPECT_TRUE(f.fused_away[static_cast<size_t>(c)]) << name;
      const int u = g.nodes[c].inputs[0];
      EXPECT_EQ(f.output_from.at(v), u) << name;
      EXPECT_EQ(f.live_until.at(u), static_cast<int>(g.nodes.size())) << name;
    }
    EXPECT_EQ(folded, dt == DType::F16 ? 1u : 0u) << name;  // logits; pred_boxes are f32 (the box island)
  });
  const fs::path resnet = fs::path(KILN_FIXTURES_DIR) / "resnet" / "bottleneck";
  const Graph g = testing::fixture_graph(resnet, DType::F16, 8, "timm_resnet");
  const GraphFacts f = planned(g, plan_output_casts);
  ASSERT_EQ(g.outputs.size(), 1u);
  EXPECT_EQ(f.output_from.count(g.outputs[0]), 1u) << "the classifier's logits cast";
}

// Contexts open a PdlDefault scope per call (on up to batch 4): scopes nest,
// restore what they replaced, and belong to their thread.
// Every byte y gets from x, by the copy as asked (elements) and as launched
// (words): the simplified copy must move exactly the same bytes.
std::vector<int64_t> byte_sources(const StridedCopy& c, size_t word) {
  int64_t total = 1;
  for (int d = 0; d < c.rank; ++d) total *= c.shape[d];
  std::vector<int64_t> src;
  for (int64_t i = 0; i < total; ++i) {
    int64_t rest = i, off = 0;
    for (int d = c.rank - 1; d >= 0; --d) off += (rest % c.shape[d]) * c.x_strides[d], rest /= c.shape[d];
    for (size_t b = 0; b < word; ++b) src.push_back(off * int64_t(word) + int64_t(b));
  }
  return src;
}

StridedCopy copy_of(std::vector<int64_t> shape, std::vector<int64_t> strides) {
  StridedCopy c;
  c.rank = int(shape.size());
  for (int d = 0; d < c.rank; ++d) c.shape[d] = shape[d], c.x_strides[d] = strides[d];
  return c;
}

TEST(StridedCopyPlan, SimplifiedCopiesMoveTheSameBytes) {
  // NHWC upsample 2x of a [1, 4, 3, 16] map (N, H, sh, W, sw, C): 16 halves per pixel.
  {
    const StridedCopy up = copy_of({1, 4, 2, 3, 2, 16}, {4 * 3 * 16, 3 * 16, 0, 16, 0, 1});
    size_t word = 2;
    const StridedCopy c = simplify_strided_copy(up, word, 0, 256);
    EXPECT_EQ(word, 16u);  // 8 halves a word
    EXPECT_EQ(c.rank, 5);  // the batch axis dropped
    EXPECT_EQ(byte_sources(c, word), byte_sources(up, 2));
  }
  // A plain contiguous copy is one axis; misaligned addresses keep narrower words.
  {
    const StridedCopy flat = copy_of({2, 3, 8}, {24, 8, 1});
    size_t word = 4;
    StridedCopy c = simplify_strided_copy(flat, word, 0, 0);
    EXPECT_EQ(c.rank, 1);
    EXPECT_EQ(word, 16u);
    EXPECT_EQ(byte_sources(c, word), byte_sources(flat, 4));
    word = 4;
    c = simplify_strided_copy(flat, word, 8, 0);
    EXPECT_EQ(word, 8u);
    EXPECT_EQ(byte_sources(c, word), byte_sources(flat, 4));
    word = 4;
    c = simplify_strided_copy(flat, word, 4, 0);
    EXPECT_EQ(word, 4u);
  }
  // A transpose whose innermost axis is strided stays one element per word.
  {
    const StridedCopy t = copy_of({3, 5}, {1, 3});
    size_t word = 2;
    const StridedCopy c = simplify_strided_copy(t, word, 0, 0);
    EXPECT_EQ(word, 2u);
    EXPECT_EQ(byte_sources(c, word), byte_sources(t, 2));
  }
  // Random permutations, broadcasts and slices of small tensors, every element size.
  std::mt19937 rng(7);
  for (int trial = 0; trial < 400; ++trial) {
    const int rank = 1 + int(rng() % 5);
    std::vector<int64_t> shape(rank), dense(rank), strides(rank);
    const int64_t extents[] = {1, 2, 3, 4, 8, 16};
    for (int d = 0; d < rank; ++d) shape[d] = extents[rng() % 6];
    int64_t st = 1;
    for (int d = rank - 1; d >= 0; --d) dense[d] = st, st *= shape[d] + int64_t(rng() % 2);  // some padding
    std::vector<int> perm(rank);
    for (int d = 0; d < rank; ++d) perm[d] = d;
    if (rng() % 2) std::shuffle(perm.begin(), perm.end(), rng);
    for (int d = 0; d < rank; ++d) strides[d] = rng() % 6 == 0 ? 0 : dense[perm[d]];
    const StridedCopy s = copy_of(shape, strides);
    const size_t es = size_t(1) << (rng() % 4);
    size_t word = es;
    const StridedCopy c = simplify_strided_copy(s, word, 16 * (rng() % 3), 16 * (rng() % 3));
    EXPECT_EQ(word % es, 0u);
    ASSERT_EQ(byte_sources(c, word), byte_sources(s, es)) << "trial " << trial;
  }
}

TEST(PdlDefault, ScopesNestAndStayOnTheirThread) {
  EXPECT_TRUE(pdl_default());
  {
    const PdlDefault off(false);
    EXPECT_FALSE(pdl_default());
    bool other = false;
    std::thread([&] { other = pdl_default(); }).join();
    EXPECT_TRUE(other) << "a scope leaked to another thread";
    {
      const PdlDefault on(true);
      EXPECT_TRUE(pdl_default());
    }
    EXPECT_FALSE(pdl_default());
  }
  EXPECT_TRUE(pdl_default());
}

}  // namespace
}  // namespace kiln::cuda
