// What an engine call launches, named (kernel_names.hpp): the demangled short
// names (no GPU needed), and on the GPU the per-layer kernel lists of
// `kiln bench --profile` adding up to the captured graph's node count, with
// RT-DETR's fused adds and box refinements where the plan puts them.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <map>

#include "backends/cuda/kernel_names.hpp"
#include "backends/cuda/kernel_trace.hpp"
#include "bundle/builder.hpp"
#include "core/error.hpp"
#include "core/npy.hpp"
#include "kiln/kiln.hpp"
#include "runtime/engine_impl.hpp"

namespace kiln {
namespace {

namespace fs = std::filesystem;
const fs::path kFixtures = fs::path(KILN_FIXTURES_DIR);

TEST(KernelNames, ShortNamesKeepScopeAndDropArguments) {
  // Device symbols as nvcc mangles them (anonymous namespaces as _GLOBAL__N_...).
  EXPECT_EQ(cuda::short_kernel_name("_ZN4kiln4cuda47_GLOBAL__N__4b273e4c_14_elementwise_cu_97f8db3810map_kernelIfaLi1ELb1E"
                                    "NS1_5MulOpEEEvPKT_S6_PT0_llT3_"),
            "kiln::cuda::map_kernel");
  EXPECT_EQ(cuda::short_kernel_name("_ZN4kiln4cuda39_GLOBAL__N__5eaf9eb3_7_norm_cu_0160fec417layer_norm_kernelIfEEvPKT_"
                                    "S5_S5_S5_PS3_S5_S6_lif"),
            "kiln::cuda::layer_norm_kernel");
  EXPECT_EQ(cuda::short_kernel_name("_ZN7cutlass13device_kernelIiEEvNT_6ParamsE"), "cutlass::device_kernel");
  // cuDNN's and cuBLASLt's kernels are extern "C" names: kept as they are.
  EXPECT_EQ(cuda::short_kernel_name("sm90_xmma_fprop_implicit_gemm_f16f16_f16f32_f32_nhwckrsc_nhwc_tilesize128x128x64"),
            "sm90_xmma_fprop_implicit_gemm_f16f16_f16f32_f32_nhwckrsc_nhwc_tilesize128x128x64");
  EXPECT_EQ(cuda::short_kernel_name("_Z"), "_Z");  // not a valid mangling: as given
}

// kiln bench --trace's attribution (kernel_trace.hpp), host-side: the last
// replay's records, sorted by start, matched to the listed launches in order.
TEST(KernelTrace, LastReplayAttributedToItsSteps) {
  const std::vector<std::string> steps = {"a", "b", "c"};
  const std::vector<std::vector<std::string>> listed = {{"k1"}, {"memset", "k2"}, {"host function"}};
  std::vector<cuda::TraceRecord> records;
  for (uint64_t r = 0; r < 2; ++r) {  // two replays, the second 1000 ns later; out of order on purpose
    records.push_back({"k2", 1000 * r + 300, 1000 * r + 500});
    records.push_back({"k1", 1000 * r + 0, 1000 * r + 100});
    records.push_back({"memset", 1000 * r + 150, 1000 * r + 200});
  }
  const CallTrace t = cuda::attribute_trace(records, steps, listed, 2);
  ASSERT_TRUE(t.unavailable.empty()) << t.unavailable;
  EXPECT_TRUE(t.note.empty()) << t.note;
  ASSERT_EQ(t.spans.size(), 3u);  // the host function is not a GPU launch
  EXPECT_EQ(t.spans[0].step, "a");
  EXPECT_EQ(t.spans[0].kernel, "k1");
  EXPECT_DOUBLE_EQ(t.spans[0].start_us, 0.0);
  EXPECT_DOUBLE_EQ(t.spans[2].start_us, 0.3);
  EXPECT_DOUBLE_EQ(t.spans[2].us, 0.2);
  EXPECT_EQ(t.spans[1].step, "b");
  EXPECT_EQ(t.spans[2].step, "b");
  // Names that disagree keep the times and drop the steps, saying so.
  records[3].name = "other";  // the second replay's k2
  const CallTrace u = cuda::attribute_trace(records, steps, listed, 2);
  EXPECT_FALSE(u.note.empty());
  ASSERT_EQ(u.spans.size(), 3u);
  EXPECT_TRUE(u.spans[0].step.empty());
  // Fewer records than one call launches: no spans, a reason.
  const CallTrace v = cuda::attribute_trace({records[1]}, steps, listed, 1);
  EXPECT_FALSE(v.unavailable.empty());
  EXPECT_TRUE(v.spans.empty());
}

// The engine's own call (kernel_trace.hpp attribute_call_trace), host-side:
// records found through their graph node (directly or through the clone
// instantiation made of it), the last replay's, in start order, with lanes.
TEST(KernelTrace, CallTraceAttributesNodesToStepsAndLanes) {
  cuda::GraphTrace g;
  g.step_of_node = {{11, 0}, {12, 1}, {13, 1}, {14, 2}};  // captured node id -> step
  g.original_of = {{21, 11}, {22, 12}, {23, 13}, {31, 21}};  // clones (31 is a clone of a clone)
  const std::vector<std::string> steps = {"a", "side.b", "c"};
  const std::vector<char> on_side = {0, 1, 0};
  for (uint64_t r = 0; r < 2; ++r) {  // two replays 1000 ns apart, out of order on purpose
    g.records.push_back({"kc", 1000 * r + 300, 1000 * r + 450, 14});
    g.records.push_back({"ka", 1000 * r + 100, 1000 * r + 400, r ? 31u : 11u});  // the side launch overlaps it
    g.records.push_back({"memset", 1000 * r + 120, 1000 * r + 130, 22});
    g.records.push_back({"kb", 1000 * r + 140, 1000 * r + 260, 23});
  }
  g.records.push_back({"outside", 5000, 5100, 0});  // not a graph launch: ignored
  const CallTrace t = cuda::attribute_call_trace(g, steps, on_side, 2);
  ASSERT_EQ(t.spans.size(), 4u);
  const std::vector<std::string> order = {"ka", "memset", "kb", "kc"};
  const std::vector<std::string> step = {"a", "side.b", "side.b", "c"};
  const std::vector<std::string> lane = {"main", "side", "side", "main"};
  for (size_t k = 0; k < 4; ++k) {
    EXPECT_EQ(t.spans[k].kernel, order[k]) << k;
    EXPECT_EQ(t.spans[k].step, step[k]) << k;
    EXPECT_EQ(t.spans[k].lane, lane[k]) << k;
  }
  EXPECT_DOUBLE_EQ(t.spans[0].start_us, 0.0);  // from the last replay's first start (1100 ns)
  EXPECT_DOUBLE_EQ(t.spans[3].start_us, 0.2);
  EXPECT_DOUBLE_EQ(t.spans[0].us, 0.3);
  // Without lanes (no side lane): every span on the main lane.
  EXPECT_EQ(cuda::attribute_call_trace(g, steps, {}, 2).spans[1].lane, "main");
  // What cannot be attributed is an error, never a guess: a record of a node
  // the capture did not make, a node recorded fewer times than replayed, no nodes.
  cuda::GraphTrace bad = g;
  bad.records.push_back({"stray", 10, 20, 99});
  EXPECT_THROW(cuda::attribute_call_trace(bad, steps, on_side, 2), Error);
  bad = g;
  bad.records.erase(bad.records.begin());  // the first replay's kc
  EXPECT_THROW(cuda::attribute_call_trace(bad, steps, on_side, 2), Error);
  EXPECT_THROW(cuda::attribute_call_trace(g, steps, on_side, 3), Error);
  bad = g;
  bad.original_of.erase(31);  // a clone not reported: its records lead nowhere
  EXPECT_THROW(cuda::attribute_call_trace(bad, steps, on_side, 2), Error);
  EXPECT_THROW(cuda::attribute_call_trace(cuda::GraphTrace{}, steps, on_side, 2), Error);
}

bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

// One f16 CUDA engine of a fixture at its input's batch (opt level 1), its
// input, and the engine's outputs of one run.
struct FixtureEngine {
  std::shared_ptr<const Engine> engine;
  std::unique_ptr<ExecutionContext> ctx;
  std::vector<Tensor> in, out;
};
FixtureEngine fixture_engine(const std::string& fixture) {
  const fs::path out = fs::temp_directory_path() / ("kiln_kernel_names_" + std::to_string(::getpid()) + ".bundle");
  BuildOptions o;
  o.model = (kFixtures / fixture).string();
  o.backend = "cuda";
  o.precision = DType::F16;
  o.opt_level = 1;
  const HostTensor x = read_npy(kFixtures / fixture / "input.npy");
  o.batch = x.shape[0];
  build_bundle(o, out);
  FixtureEngine f;
  f.engine = Engine::load(out.string());
  fs::remove(out);
  f.ctx = f.engine->create_context();
  f.in = {{"pixel_values", x.shape, x.to_f32()}};
  f.out = f.ctx->run(f.in);
  return f;
}

// One f16 CUDA engine of a fixture at its input's batch, run once and profiled.
struct Profiled {
  size_t kernels_per_call = 0;
  std::vector<LayerTime> layers;
};
Profiled profile_fixture(const std::string& fixture) {
  FixtureEngine f = fixture_engine(fixture);
  Profiled p;
  p.kernels_per_call = kernels_per_call(*f.ctx);
  p.layers = profile_layers(*f.ctx, f.in, 1);
  return p;
}

// kiln bench --trace on the GPU: the engine's own call with its side lane,
// every launch of the call attributed to its step and lane (RT-DETR runs each
// decoder layer's value projection on the side lane).
TEST(KernelTrace, EngineCallTracedWithBothLanes) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  FixtureEngine f = fixture_engine("rt_detr_v2/bottleneck_2l");
  const CallTrace t = trace_call(*f.ctx, f.in, 3);
  if (t.unavailable.find("CUPTI") != std::string::npos && t.unavailable.find("not found") != std::string::npos)
    GTEST_SKIP() << t.unavailable;
  ASSERT_TRUE(t.unavailable.empty()) << t.unavailable;
  EXPECT_TRUE(t.note.empty()) << t.note;  // "one stream, ..." where the lane trace failed
  EXPECT_EQ(t.spans.size(), kernels_per_call(*f.ctx));
  std::map<std::string, std::string> lane_of;
  int side = 0, v_side = 0;
  for (size_t k = 0; k < t.spans.size(); ++k) {
    const KernelSpan& s = t.spans[k];
    EXPECT_FALSE(s.step.empty()) << k << " " << s.kernel;
    ASSERT_TRUE(s.lane == "main" || s.lane == "side") << k << " " << s.step << ": '" << s.lane << "'";
    if (k) EXPECT_GE(s.start_us, t.spans[k - 1].start_us) << k;
    EXPECT_GT(s.us, 0.0) << s.step;
    const auto [it, fresh] = lane_of.insert({s.step, s.lane});
    EXPECT_EQ(it->second, s.lane) << s.step << ": one step, one lane";
    side += s.lane == "side";
    v_side += s.lane == "side" && s.step.starts_with("model.decoder.layers.") && s.step.ends_with("self_attn.v_proj");
  }
  EXPECT_GT(side, 0);
  EXPECT_GT(v_side, 0) << "no decoder value projection on the side lane";
  // The trace's graph is its own: the engine's results do not change.
  const std::vector<Tensor> after = f.ctx->run(f.in);
  ASSERT_EQ(after.size(), f.out.size());
  for (size_t i = 0; i < after.size(); ++i) EXPECT_EQ(after[i].data, f.out[i].data) << after[i].name;
}

TEST(KernelNames, ProfileListsEveryNodeOfTheCapturedCall) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  for (const std::string fixture : {"resnet/bottleneck", "rt_detr_v2/bottleneck_2l"}) {
    const Profiled p = profile_fixture(fixture);
    size_t listed = 0;
    for (const LayerTime& l : p.layers) {
      listed += l.kernels.size();
      for (const std::string& k : l.kernels) {
        EXPECT_FALSE(k.empty()) << fixture << " " << l.name;
        EXPECT_NE(k, "kernel") << fixture << " " << l.name << ": the driver named no kernel";
      }
    }
    EXPECT_EQ(listed, p.kernels_per_call) << fixture;
    if (fixture.starts_with("resnet/")) continue;
    // RT-DETR: residual adds and inverse sigmoids have no layer of their own;
    // a box refinement before another layer runs inside the box head chain's
    // launch with the next query position head (plan_mlp_chains' links).
    int norms = 0, refines = 0, links = 0;
    for (const LayerTime& l : p.layers) {
      EXPECT_FALSE(l.name.ends_with(".residual")) << l.name;
      EXPECT_FALSE(l.name.ends_with(".inverse_sigmoid")) << l.name;
      // A post-norm runs alone or with the projection before it inside (plan_mlp_chains).
      if (l.name.ends_with("layer_norm") && l.kernels.size() == 1 &&
          (l.kernels[0].starts_with("kiln::cuda::layer_norm") || l.kernels[0].starts_with("kiln::cuda::mlp_chain")))
        ++norms;
      if (l.name.starts_with("model.decoder.bbox_embed.") && l.name.ends_with(".add")) {
        EXPECT_EQ(l.kernels, std::vector<std::string>{"kiln::cuda::box_refine_kernel"}) << l.name;
        ++refines;
      }
      if ((l.name.starts_with("model.decoder.bbox_embed.") || l.name.starts_with("model.enc_bbox_head.")) &&
          l.name.ends_with(".layers.2") && l.kernels.size() == 1 && l.kernels[0].starts_with("kiln::cuda::mlp_chain"))
        ++links;
      EXPECT_FALSE(l.name.ends_with(".query_pos.1")) << l.name << ": inside the box head chain before it";
    }
    EXPECT_GE(norms, 5) << "AIFI's two and three per decoder layer, each one launch";
    EXPECT_EQ(refines, 1) << "the last decoder layer's (the pred_boxes output)";
    EXPECT_EQ(links, 3) << "the encoder's box head and both decoder layers' box heads, each one launch";
  }
}

}  // namespace
}  // namespace kiln
