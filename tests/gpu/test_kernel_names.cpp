// What an engine call launches, named (kernel_names.hpp): the demangled short
// names (no GPU needed), and on the GPU the per-layer kernel lists of
// `kiln bench --profile` adding up to the captured graph's node count, with
// RT-DETR's fused adds and box refinements where the plan puts them.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <filesystem>

#include "backends/cuda/kernel_names.hpp"
#include "backends/cuda/kernel_trace.hpp"
#include "bundle/builder.hpp"
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

bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

// One f16 CUDA engine of a fixture at its input's batch, run once and profiled.
struct Profiled {
  size_t kernels_per_call = 0;
  std::vector<LayerTime> layers;
};
Profiled profile_fixture(const std::string& fixture) {
  const fs::path out = fs::temp_directory_path() / ("kiln_kernel_names_" + std::to_string(::getpid()) + ".bundle");
  BuildOptions o;
  o.model = (kFixtures / fixture).string();
  o.backend = "cuda";
  o.precision = DType::F16;
  o.opt_level = 1;
  const HostTensor x = read_npy(kFixtures / fixture / "input.npy");
  o.batch = x.shape[0];
  build_bundle(o, out);
  auto e = Engine::load(out.string());
  auto ctx = e->create_context();
  const std::vector<Tensor> in = {{"pixel_values", x.shape, x.to_f32()}};
  ctx->run(in);
  Profiled p;
  p.kernels_per_call = kernels_per_call(*ctx);
  p.layers = profile_layers(*ctx, in, 1);
  fs::remove(out);
  return p;
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
