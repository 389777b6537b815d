// The CUDA side lane's plan (side_lane.cpp), which needs no GPU: on the
// RT-DETR fixtures (basic and bottleneck backbones, both decoder methods) in
// f16 and f32, planned as plan_fusions plans them, which branches go to the
// second stream, and the property the two streams rely on: no value another
// launch uses while a side run can be running shares bytes with a value the
// run reads or writes (the arena the memory planner lays out from the facts).
// Whether the GPU computes the same numbers with and without the lane is
// CudaEngine.SideLaneComputesWhatOneStreamComputes (test_cuda_engine.cpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>

#include "../unit/family_test_util.hpp"
#include "backends/cuda/lower.hpp"
#include "rtdetr_graphs.hpp"
#include "runtime/memory_planner.hpp"

namespace kiln::cuda {
namespace {

namespace fs = std::filesystem;

// The facts plan_fusions gives an RT-DETR graph (no views, no window convs,
// no squeeze-excitation), side lane last.
GraphFacts rtdetr_facts(const Graph& g, bool side_lane, bool late_fork = false, bool chain_fork = false) {
  GraphFacts f;
  f.start(g);
  plan_deform_inputs(g, f);
  plan_token_rows(g, f);
  plan_upsample_concats(g, f);
  plan_concat_masks(g, f);
  plan_wide_linears(g, f);
  plan_norm_adds(g, f);
  plan_box_refines(g, f);
  plan_row_windows(g, f);
  plan_output_casts(g, f);
  plan_mlp_chains(g, f, 132, true, false, LinearNormRule{});  // fuse_mlp auto, linear_norm on (as concat_mask above)
  if (side_lane) plan_side_lane(g, f, late_fork, chain_fork);
  return f;
}

// for_each_rtdetr_graph with the dtype in the name: "basic_1l f16".
template <typename F>
void for_each_rtdetr(F&& fn) {
  for_each_rtdetr_graph([&](const std::string& name, DType dt, Graph& g) { fn(name + (dt == DType::F16 ? " f16" : " f32"), g); });
}

bool has_run_with(const Graph& g, const GraphFacts& f, const std::string& suffix) {
  for (const SideRun& r : f.side_runs)
    for (size_t n : r.nodes)
      if (g.nodes[n].name.ends_with(suffix)) return true;
  return false;
}

TEST(SideLanePlan, RtDetrBranchesOffTheCriticalPathGoToTheSideLane) {
  for_each_rtdetr([](const std::string& name, Graph& g) {
    const GraphFacts f = rtdetr_facts(g, true);
    ASSERT_FALSE(f.side_runs.empty()) << name;
    const std::vector<int> at = launch_nodes(g, f);
    std::set<size_t> seen;
    for (const SideRun& r : f.side_runs) {
      std::string names;
      for (size_t n : r.nodes) names += g.nodes[n].name + " ";
      ASSERT_FALSE(r.nodes.empty()) << name;
      // A chain of convs, pools and linears, each read by the next alone.
      for (size_t k = 0; k < r.nodes.size(); ++k) {
        const Node& n = g.nodes[r.nodes[k]];
        EXPECT_TRUE(n.op == Op::Conv2d || n.op == Op::Linear || n.op == Op::MaxPool2d || n.op == Op::AvgPool2d) << names;
        EXPECT_TRUE(seen.insert(r.nodes[k]).second) << names << ": a node in two runs";
        EXPECT_EQ(at[r.nodes[k]], static_cast<int>(r.nodes[k])) << names << ": runs in a launch of its own";
        if (k + 1 < r.nodes.size()) EXPECT_EQ(g.consumers(n.outputs[0]), std::vector<int>{static_cast<int>(r.nodes[k + 1])}) << names;
      }
      // Forked after what it reads is written, joined before its result is read, with a main-lane launch between.
      EXPECT_LT(r.fork, static_cast<int>(r.nodes.front())) << names;
      EXPECT_GT(r.join, static_cast<int>(r.nodes.back())) << names;
      int between = 0;
      for (int k = r.fork + 1; k < r.join; ++k)
        between += at[k] == k && !seen.count(static_cast<size_t>(k)) &&
                   std::find(r.nodes.begin(), r.nodes.end(), static_cast<size_t>(k)) == r.nodes.end();
      EXPECT_GT(between, 0) << names;
      for (size_t n : r.nodes)
        for (int in : g.nodes[n].inputs) {
          const int p = g.values[in].producer;
          if (p >= 0 && at[p] >= 0 && std::find(r.nodes.begin(), r.nodes.end(), static_cast<size_t>(p)) == r.nodes.end())
            EXPECT_LE(at[p], r.fork) << names << " reads " << g.values[in].name;
        }
      for (int c : g.consumers(g.nodes[r.nodes.back()].outputs[0]))
        if (at[c] >= 0) EXPECT_GE(at[c], r.join) << names << " is read by " << g.nodes[c].name;
    }
    // The branches the lane is for: the decoder's value projections (merged into one linear)
    // beside the query selection, each decoder layer's self-attention value projection
    // beside its query/key projection, the encoder's input projections of the two larger
    // levels beside the backbone and AIFI, and the CSP blocks' second branch.
    EXPECT_TRUE(has_run_with(g, f, "encoder_attn.value_proj}") || has_run_with(g, f, "encoder_attn.value_proj")) << name;
    EXPECT_TRUE(has_run_with(g, f, "layers.0.self_attn.v_proj")) << name;
    EXPECT_TRUE(has_run_with(g, f, "encoder_input_proj.0.0")) << name;
    EXPECT_TRUE(has_run_with(g, f, "fpn_blocks.0.conv2.conv") || has_run_with(g, f, "fpn_blocks.0.conv1.conv")) << name;
  });
}

// No value shares bytes with a value a side run reads or writes while the run may run.
void expect_no_shared_bytes_while_running(const std::string& name, const Graph& g, const GraphFacts& f) {
  auto alias_of = [&](int v) { return f.alias[v]; };
  const MemoryPlan mp = plan_memory_with_views(g, value_bytes, alias_of, 64, f.live_until, f.live_from);
  const std::vector<Lifetime> life = value_lifetimes(g, alias_of, f.live_until, f.live_from);
  auto root = [&](int v) {
    while (f.alias[v] >= 0) v = f.alias[v];
    return v;
  };
  int checked = 0;
  for (const SideRun& r : f.side_runs) {
    std::set<int> touched;  // roots the run reads or writes
    for (size_t n : r.nodes) {
      for (int in : g.nodes[n].inputs)
        if (!g.values[in].constant) touched.insert(root(in));
      for (int o : g.nodes[n].outputs) touched.insert(root(o));
    }
    for (int t : touched) {
      const int64_t t0 = mp.offsets[t], t1 = t0 + static_cast<int64_t>(value_bytes(g.values[t]));
      for (size_t w = 0; w < g.values.size(); ++w) {
        const int wv = static_cast<int>(w);
        if (g.values[w].constant || root(wv) != wv || touched.count(wv)) continue;
        const int64_t w0 = mp.offsets[w], w1 = w0 + static_cast<int64_t>(value_bytes(g.values[w]));
        if (w1 <= t0 || t1 <= w0) continue;  // other bytes
        ++checked;
        // The run may be running at any main-lane position in [fork + 1, join].
        EXPECT_TRUE(life[w].last < r.fork + 1 || life[w].first > r.join)
            << name << ": " << g.values[w].name << " (nodes " << life[w].first << ".." << life[w].last
            << ") shares bytes with " << g.values[t].name << " of the side run forked after " << r.fork << ", joined before " << r.join;
      }
    }
  }
  EXPECT_GT(checked, 0) << name << ": the arena reuses no side run's bytes, so this test checks nothing";
}

TEST(SideLanePlan, NoValueSharesBytesWithASideRunWhileItMayRun) {
  for_each_rtdetr([](const std::string& name, Graph& g) { expect_no_shared_bytes_while_running(name, g, rtdetr_facts(g, true)); });
}

// Switch late_side_fork: the merged decoder value projection forks right
// before the query selection's top_k instead of after the encoder's memory;
// every other run is planned as without the switch, and the arena still
// gives no value the bytes of a run that may be running.
TEST(SideLanePlan, LateForkPutsTheValueProjectionBesideTopK) {
  for_each_rtdetr([](const std::string& name, Graph& g) {
    const GraphFacts early = rtdetr_facts(g, true), late = rtdetr_facts(g, true, true);
    ASSERT_EQ(early.side_runs.size(), late.side_runs.size()) << name;
    int top_k = -1;  // the query selection's (the per-anchor class max before it is a top_k of k 1 over 80 classes)
    for (size_t i = 0; i < g.nodes.size(); ++i)
      if (g.nodes[i].name == "model.topk") top_k = static_cast<int>(i);
    ASSERT_GE(top_k, 0) << name;
    ASSERT_EQ(g.nodes[static_cast<size_t>(top_k)].op, Op::TopK) << name;
    int moved = 0;
    for (size_t r = 0; r < late.side_runs.size(); ++r) {
      const SideRun &a = early.side_runs[r], &b = late.side_runs[r];
      ASSERT_EQ(a.nodes, b.nodes) << name;
      EXPECT_EQ(a.join, b.join) << name;
      const bool value_proj = g.nodes[b.nodes.front()].name.find("encoder_attn.value_proj") != std::string::npos;
      if (value_proj && a.fork < top_k && top_k < a.join) {
        EXPECT_EQ(b.fork, top_k - 1) << name << ": " << g.nodes[b.nodes.front()].name;
        ++moved;
      } else {
        EXPECT_EQ(a.fork, b.fork) << name << ": " << g.nodes[b.nodes.front()].name;
      }
    }
    EXPECT_EQ(moved, 1) << name;
    expect_no_shared_bytes_while_running(name + " late fork", g, late);
  });
}

// Switch chain_side_fork: each decoder layer's self-attention value
// projection forks right after the mlp_chain launch before it (the box head
// and query position chain whose output the q/k projection reads) instead of
// beside it; the merged value projection stays where late_side_fork puts it;
// every moved run keeps a main-lane launch to overlap, and the arena still
// gives no value the bytes of a run that may be running.
TEST(SideLanePlan, ChainForkPutsTheValueProjectionsAfterTheirChains) {
  for_each_rtdetr([](const std::string& name, Graph& g) {
    const GraphFacts before = rtdetr_facts(g, true, true), after = rtdetr_facts(g, true, true, true);
    ASSERT_EQ(before.side_runs.size(), after.side_runs.size()) << name;
    const std::vector<int> at = launch_nodes(g, after);
    std::set<size_t> on_side;
    for (const SideRun& r : after.side_runs) on_side.insert(r.nodes.begin(), r.nodes.end());
    // f32 graphs have no chains (f32 linears run as separate GEMMs): nothing moves there.
    const bool chains = !after.mlp_chains.empty();
    int moved = 0, v_projs = 0;
    for (size_t r = 0; r < after.side_runs.size(); ++r) {
      const SideRun &a = before.side_runs[r], &b = after.side_runs[r];
      const std::string& first = g.nodes[b.nodes.front()].name;
      ASSERT_EQ(a.nodes, b.nodes) << name;
      EXPECT_EQ(a.join, b.join) << name << ": " << first;
      const bool v_proj = first.find("self_attn.v_proj") != std::string::npos && first.find("decoder.layers.") != std::string::npos;
      v_projs += v_proj;
      if (first.find("encoder_attn.value_proj") != std::string::npos) EXPECT_EQ(a.fork, b.fork) << name << ": " << first;
      if (a.fork == b.fork) {
        EXPECT_FALSE(v_proj && chains) << name << ": " << first << " did not move";
        continue;
      }
      ++moved;
      EXPECT_GT(b.fork, a.fork) << name << ": " << first;
      const auto k = static_cast<size_t>(b.fork);
      EXPECT_TRUE(after.mlp_chains.count(k) || after.mlp_chain_links.count(k)) << name << ": " << first << " forks after " << g.nodes[k].name;
      EXPECT_EQ(at[k], b.fork) << name << ": " << first;
      int between = 0;
      for (int j = b.fork + 1; j < b.join; ++j) between += at[j] == j && !on_side.count(static_cast<size_t>(j));
      EXPECT_GT(between, 0) << name << ": " << first << " has no main-lane launch beside it";
    }
    EXPECT_GT(v_projs, 0) << name;
    EXPECT_EQ(chains, name.ends_with("f16")) << name;
    if (chains) EXPECT_GE(moved, v_projs) << name;
    else EXPECT_EQ(moved, 0) << name;
    expect_no_shared_bytes_while_running(name + " chain fork", g, after);
  });
}

// The timm ResNets (side lane on by default there too): a block's downsample
// shortcut runs beside its first convs, never the other way round, and the
// same memory rule holds.
TEST(SideLanePlan, ResNetShortcutsGoToTheSideLane) {
  const fs::path root = fs::path(KILN_FIXTURES_DIR) / "resnet";
  for (const std::string name : {"basic", "bottleneck", "resnet_d", "resnext"})
    for (DType dt : {DType::F32, DType::F16}) {
      Graph g = testing::fixture_graph(root / name, dt, dt == DType::F16 ? 8 : 4, "timm_resnet");
      const GraphFacts f = rtdetr_facts(g, true);  // the same plans; only the side lane finds anything here
      const std::string tag = name + (dt == DType::F16 ? " f16" : " f32");
      ASSERT_FALSE(f.side_runs.empty()) << tag;
      for (const SideRun& r : f.side_runs)
        for (size_t n : r.nodes) EXPECT_NE(g.nodes[n].name.find("downsample"), std::string::npos) << tag << ": " << g.nodes[n].name;
      expect_no_shared_bytes_while_running(tag, g, f);
    }
}

TEST(SideLanePlan, OffWithoutThePlanAndTheArenaGrowsLittle) {
  for_each_rtdetr([](const std::string& name, Graph& g) {
    const GraphFacts off = rtdetr_facts(g, false), on = rtdetr_facts(g, true);
    EXPECT_TRUE(off.side_runs.empty());
    auto bytes = [&](const GraphFacts& f) {
      return plan_memory_with_views(g, value_bytes, [&](int v) { return f.alias[v]; }, 64, f.live_until, f.live_from).arena_bytes;
    };
    const size_t a = bytes(off), b = bytes(on);
    EXPECT_GE(b, a) << name;
    EXPECT_LE(b, a * 2) << name << ": the side lane doubles the arena";
  });
}

}  // namespace
}  // namespace kiln::cuda
