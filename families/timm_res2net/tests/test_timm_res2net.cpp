// timm_res2net against PyTorch: seeded fixtures from
// tools/reference/make_fixtures_res2net.py (every parameter and BatchNorm
// statistic randomized), built into bundles and run on the CPU backend; plus
// error messages and the structure left after the pass pipeline.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "../../../tests/unit/graph_test_util.hpp"
#include "../../../tests/unit/family_test_util.hpp"
#include "bundle/builder.hpp"
#include "checkpoint/safetensors.hpp"
#include "core/error.hpp"
#include "core/file.hpp"
#include "core/npy.hpp"
#include "families/family.hpp"
#include "kiln/kiln.hpp"
#include "passes/pass.hpp"
#include "runtime/engine_impl.hpp"

namespace kiln {
namespace {

namespace fs = std::filesystem;
const fs::path kFixtures = fs::path(KILN_FIXTURES_DIR) / "res2net";

KILN_FAMILY_FIXTURE_TESTS(Res2netFixture, kFixtures);

// ---------------------------------------------------------------- structure after passes

// The family's graph for a fixture, after the default f32 pipeline
// (channel_align > 1: with pad_channels, as CUDA builds run it).
Graph optimized_graph(const std::string& name, int64_t channel_align = 0) {
  return testing::fixture_graph(kFixtures / name, DType::F32, channel_align, "timm_res2net");
}

struct Expected {
  int conv, slice, concat, add, avg_pool;
};

void expect_structure(const std::string& name, const Expected& e) {
  Graph g = optimized_graph(name);
  EXPECT_EQ(g.count_ops(Op::BatchNorm), 0) << name;
  EXPECT_EQ(g.count_ops(Op::Activation), 0) << name << ": every ReLU fuses into a conv or an add";
  EXPECT_EQ(g.count_ops(Op::Conv2d), e.conv) << name;
  EXPECT_EQ(g.count_ops(Op::Slice), e.slice) << name;
  EXPECT_EQ(g.count_ops(Op::Concat), e.concat) << name;
  EXPECT_EQ(g.count_ops(Op::Add), e.add) << name << ": only the chunk-chaining adds remain";
  EXPECT_EQ(g.count_ops(Op::AvgPool2d), e.avg_pool) << name;
  EXPECT_EQ(g.count_ops(Op::MaxPool2d), 1) << name;
  int conv3 = 0;
  for (const Node& n : g.nodes) {
    const bool is_conv3 = n.name.size() > 6 && n.name.compare(n.name.size() - 6, 6, ".conv3") == 0;
    if (n.op == Op::Add) EXPECT_NE(n.name.find(".chain."), std::string::npos) << n.name << " was not fused";
    if (!is_conv3) continue;
    ++conv3;
    EXPECT_EQ(n.op, Op::Conv2d) << n.name;
    EXPECT_EQ(n.inputs.size(), 4u) << n.name << ": conv3 must carry the residual input";
    EXPECT_EQ(n.activation(), Activation::Relu) << n.name;
  }
  EXPECT_GT(conv3, 0) << name;
}

// layers [1,2,1,1], scale 4, layer1.0 without downsample: blocks 1.0 and 2.1 chain (2 adds each),
// 2.0/3.0/4.0 are first blocks (pass-through pool). Convs: stem 1 + 5 blocks x (1 + 3 + 1) + 3 shortcuts.
TEST(TimmRes2netStructure, Scale4AfterPasses) { expect_structure("s4_26w", {29, 20, 5, 4, 3}); }

// Deep stem (3 convs) + 5 blocks x 5 convs + 4 avg-down shortcut convs; every stage's block 0 is
// first (layer1 has an Identity-pool shortcut); pools: 4 pass-through + 3 avg-down (stages 2-4).
TEST(TimmRes2netStructure, DeepStemAvgDownAfterPasses) { expect_structure("res2net_d", {32, 20, 5, 2, 7}); }

// layers [2,1,1,1], scale 2: one 3x3 per block, so no chain adds even in layer1.1.
TEST(TimmRes2netStructure, Scale2AfterPasses) { expect_structure("s2_48w", {1 + 5 * 3 + 4, 10, 5, 0, 4}); }

TEST(TimmRes2netStructure, NodeNamesFollowCheckpoint) {
  Graph g = optimized_graph("res2next");
  for (const char* n : {"layer1.0.convs.0", "layer1.0.convs.2", "layer1.0.split.3", "layer1.0.cat", "layer1.0.chain.1",
                        "layer2.0.pool", "layer4.0.conv3", "fc"})
    EXPECT_NE(g.find_node(n), nullptr) << n;
  const Node* c = g.find_node("layer2.0.convs.1");
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->attr_int("groups"), 4);  // res2next: grouped 3x3 read from the weight shape
  EXPECT_EQ(c->attr_ints("strides"), (std::vector<int64_t>{2, 2}));
}

// pad_channels (what a CUDA fp16 build runs) widens odd chunk widths to 8 and
// keeps every fixture's logits; grouped 3x3s (res2next) are left alone.
TEST(TimmRes2netPadChannels, EveryFixtureKeepsItsLogits) {
  for (const std::string& name : testing::fixture_cases(kFixtures)) {
    Graph g = optimized_graph(name, 8);
    const HostTensor x = read_npy(kFixtures / name / "input.npy");
    const std::vector<float> want = read_npy(kFixtures / name / "logits.npy").to_f32();
    ASSERT_EQ(g.inputs.size(), 1u) << name;
    g.values[g.inputs[0]].shape = x.shape;
    g.infer_shapes();
    const std::vector<float> got = testing::run_cpu(g, {x.to_f32()})[0];
    EXPECT_LE(testing::max_abs_diff(got, want), 1e-4f * testing::max_abs(want)) << name;
    const Node* c0 = g.find_node("layer1.0.convs.0");
    ASSERT_NE(c0, nullptr) << name;
    const Shape& ws = g.values[c0->inputs[1]].shape;
    const bool grouped = c0->attr_int("groups", 1) != 1;
    if (!grouped) EXPECT_EQ(ws[0] % 8, 0) << name << ": chunk width " << ws[0] << " was not padded";
  }
}

// The chain adds run inside the 3x3 conv that reads them (CPU backend): no
// node of their own in the engine call, and the same numbers as with
// the fuse_add switch off (`kiln build --disable fuse_add`), bit for bit (the conv gathers the same columns), in fp32
// and fp16, at batch 2 (so over strided channel windows, image by image).
TEST(TimmRes2netChainAdd, FusedIntoTheNextConv) {
  const HostTensor x = read_npy(kFixtures / "s4_26w" / "input.npy");
  ASSERT_GT(x.shape[0], 1);
  for (DType dt : {DType::F32, DType::F16}) {
    const fs::path dir = testing::temp_dir("chain_add");
    BuildOptions o;
    o.model = (kFixtures / "s4_26w").string();
    o.precision = dt;
    build_bundle(o, dir / "m.bundle");
    auto e = Engine::load((dir / "m.bundle").string());
    const Graph& g = e->impl().graph;
    const size_t chain_adds = static_cast<size_t>(g.count_ops(Op::Add));
    ASSERT_EQ(chain_adds, 4u);  // layer1.0 and layer2.1: chain.1 and chain.2 each
    auto fused_ctx = e->create_context();
    const auto fused = fused_ctx->run({{"pixel_values", x.shape, x.to_f32()}}).at(0).data;
    EXPECT_EQ(kernels_per_call(*fused_ctx), g.nodes.size() - chain_adds);
    for (const LayerTime& l : profile_layers(*fused_ctx, {{"pixel_values", x.shape, x.to_f32()}}, 1))
      EXPECT_EQ(l.name.find(".chain."), std::string::npos) << l.name << " still runs as a node";
    o.switches.set(Switch::FuseAdd, false);
    build_bundle(o, dir / "plain.bundle");
    auto plain_engine = Engine::load((dir / "plain.bundle").string());
    auto plain_ctx = plain_engine->create_context();
    const auto plain = plain_ctx->run({{"pixel_values", x.shape, x.to_f32()}}).at(0).data;
    const size_t plain_kernels = kernels_per_call(*plain_ctx);
    EXPECT_EQ(plain_kernels, g.nodes.size());
    EXPECT_EQ(fused, plain) << dtype_name(dt);
    fs::remove_all(dir);
  }
}

// ---------------------------------------------------------------- errors

// The last 3x3 of a block can only be missed by counting chunks (conv1 channels / width).
TEST(TimmRes2netErrors, MissingLastConvIsNamed) {
  std::string msg = testing::build_error_after_rename(kFixtures, "s6_26w_odd", "layer2.0.convs.4.weight", "");
  EXPECT_NE(msg.find("layer2.0.convs.4.weight"), std::string::npos) << msg;
}

TEST(TimmRes2netErrors, MissingMiddleConvIsNamed) {
  std::string msg = testing::build_error_after_rename(kFixtures, "res2next", "layer3.0.convs.1.weight", "");
  EXPECT_NE(msg.find("layer3.0.convs.1.weight"), std::string::npos) << msg;
}

TEST(TimmRes2netErrors, UnexpectedTensorIsNamed) {
  std::string msg = testing::build_error_after_rename(kFixtures, "s4_26w", "fc.bias", "layer4.0.se.fc1.bias");
  EXPECT_TRUE(msg.find("fc.bias") != std::string::npos || msg.find("layer4.0.se.fc1.bias") != std::string::npos) << msg;
}

TEST(TimmRes2netBuild, BundlesAreReproducible) {
  testing::expect_reproducible(kFixtures / "s8_14w");
}

}  // namespace
}  // namespace kiln
