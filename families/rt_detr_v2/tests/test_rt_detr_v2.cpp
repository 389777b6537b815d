// rt_detr_v2 against PyTorch: the seeded fixtures of
// tools/reference/make_fixtures_rtdetr.py (basic and bottleneck backbones,
// 1 and 2 decoder layers, invalid anchors, the discrete method) built into
// bundles and run on the CPU backend in fp32, and the family's graph run on
// the plain reference; error messages; the structure after the pass pipeline.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <nlohmann/json.hpp>

#include "../../../tests/unit/family_test_util.hpp"
#include "../../../tests/unit/graph_test_util.hpp"
#include "rtdetr_test_util.hpp"
#include "backends/cpu/ref/ref.hpp"
#include "bundle/builder.hpp"
#include "checkpoint/safetensors.hpp"
#include "core/error.hpp"
#include "core/npy.hpp"
#include "families/family.hpp"
#include "kiln/kiln.hpp"
#include "passes/pass.hpp"
#include "quant/recipe.hpp"
#include "../src/rtdetr_graph.hpp"

namespace kiln {
namespace {

using testing::rtdetr::expect_matches;
using testing::rtdetr::kFixtures;
namespace fs = std::filesystem;

class RtDetrFixture : public ::testing::TestWithParam<std::string> {};

TEST_P(RtDetrFixture, Fp32CpuEngineMatchesPyTorch) {
  const auto out = testing::rtdetr::run_fixture(GetParam(), "cpu", DType::F32);
  ASSERT_EQ(out.size(), 2u);
  expect_matches("cpu engine", out[0].data, out[1].data, kFixtures / GetParam());
}

TEST_P(RtDetrFixture, PlainReferenceMatchesPyTorch) {
  const fs::path dir = kFixtures / GetParam();
  Checkpoint ckpt = Checkpoint::open(dir);
  const ModelSource src = testing::model_source(dir, ckpt);
  const Family& f = family_registry().select(src);
  ASSERT_EQ(f.name(), "rt_detr_v2");
  const HostTensor x = read_npy(dir / "input.npy");
  BuildRequest req;
  req.source = &src;
  req.batch = static_cast<int>(x.shape[0]);
  FamilyBuild fb = f.build(req);
  EXPECT_EQ(fb.task, "detection");
  EXPECT_EQ(fb.runtime["num_queries"], read_npy(dir / "logits.npy").shape[1]);
  const auto ys = ref::run_reference_graph(fb.graph, {x.to_f32()});
  ASSERT_EQ(ys.size(), 2u);
  expect_matches("reference", ys[0], ys[1], dir);
}

// The fp16 CPU engine (16-bit storage emulated exactly) against PyTorch fp32
// with the rule the CUDA fp16 engines are held to (tests/gpu/test_cuda_rtdetr.cpp).
TEST_P(RtDetrFixture, Fp16CpuEngineDetectionsMatchPyTorch) {
  const fs::path dir = kFixtures / GetParam();
  const auto out = testing::rtdetr::run_fixture(GetParam(), "cpu", DType::F16);
  ASSERT_EQ(out.size(), 2u);
  testing::rtdetr::expect_fp16_rule("cpu fp16 engine", out[0].data, out[1].data, read_npy(dir / "input.npy").shape, dir);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, RtDetrFixture, ::testing::ValuesIn(testing::fixture_cases(kFixtures)),
                         [](const auto& info) { return info.param; });

// The 16-bit detection rule itself (hand-made detections).
TEST(RtDetrRules, DetectionMatchingRule) {
  using testing::rtdetr::detection_mismatch;
  auto det = [](float x, float score, int cls) { return Detection{x, 0, x + 10, 10, score, cls, ""}; };
  Detections want, got;
  want.boxes = {det(0, 0.9f, 1), det(20, 0.8f, 2), det(40, 0.7f, 1)};
  got.boxes = {det(41, 0.72f, 1), det(0.5f, 0.88f, 1), det(20, 0.8f, 2)};  // order and small shifts do not matter
  EXPECT_EQ(detection_mismatch(want, got), "");
  Detections far = got;
  far.boxes[0].score = 0.64f;  // |score diff| 0.06
  EXPECT_NE(detection_mismatch(want, far), "");
  EXPECT_EQ(detection_mismatch(want, far, 1), "");  // one unmatched allowed
  Detections moved = got;
  moved.boxes[0].x_min = 45, moved.boxes[0].x_max = 55;  // IoU 1/3 with [40, 50]
  EXPECT_NE(detection_mismatch(want, moved).find("reference detection 2"), std::string::npos);
  Detections relabelled = got;
  relabelled.boxes[2].class_id = 3;
  EXPECT_NE(detection_mismatch(want, relabelled), "");
  Detections fewer = got;
  fewer.boxes.pop_back();
  EXPECT_NE(detection_mismatch(want, fewer).find("2 detections, the reference has 3"), std::string::npos);
}

// ---------------------------------------------------------------- errors

void edit_config(const fs::path& dir, const std::function<void(nlohmann::json&)>& edit) {
  nlohmann::json j = nlohmann::json::parse(std::ifstream(dir / "config.json"));
  edit(j);
  std::ofstream(dir / "config.json") << j.dump(2);
}

std::string error_after_config_edit(const std::string& name, const std::function<void(nlohmann::json&)>& edit) {
  const fs::path d = testing::copy_fixture(kFixtures, name, "rtdetr_cfg");
  edit_config(d, edit);
  std::string msg = testing::build_error(d);
  fs::remove_all(d);
  return msg;
}

TEST(RtDetrErrors, MissingTensorIsNamed) {
  const std::string t = "model.decoder.layers.0.encoder_attn.sampling_offsets.weight";
  const std::string msg = testing::build_error_after_rename(kFixtures, "basic_1l", t, "");
  EXPECT_NE(msg.find(t), std::string::npos) << msg;
}

TEST(RtDetrErrors, UnexpectedTensorIsNamed) {
  const std::string msg = testing::build_error_after_rename(
      kFixtures, "basic_1l", "model.enc_output.0.bias", "model.enc_output.9.bias");
  EXPECT_NE(msg.find("model.enc_output."), std::string::npos) << msg;
}

TEST(RtDetrErrors, UnknownDecoderMethodIsNamed) {
  const std::string msg = error_after_config_edit("basic_1l", [](nlohmann::json& j) { j["decoder_method"] = "cubic"; });
  EXPECT_NE(msg.find("decoder_method"), std::string::npos) << msg;
  EXPECT_NE(msg.find("cubic"), std::string::npos) << msg;
}

TEST(RtDetrErrors, MissingBackboneKeyIsNamed) {
  const std::string msg = error_after_config_edit("basic_1l", [](nlohmann::json& j) { j["backbone_config"].erase("depths"); });
  EXPECT_NE(msg.find("'depths'"), std::string::npos) << msg;
}

TEST(RtDetrErrors, WrongDecoderLayersIsNamed) {
  const std::string msg = error_after_config_edit("bottleneck_2l", [](nlohmann::json& j) { j["decoder_layers"] = 3; });
  EXPECT_NE(msg.find("decoder_layers"), std::string::npos) << msg;
}

TEST(RtDetrErrors, WrongPointsIsNamed) {
  const std::string msg = error_after_config_edit("basic_1l", [](nlohmann::json& j) { j["decoder_n_points"] = 3; });
  EXPECT_NE(msg.find("points"), std::string::npos) << msg;
}

TEST(RtDetrErrors, WrongLayerTypeShapeIsNamed) {
  const std::string msg =
      error_after_config_edit("basic_1l", [](nlohmann::json& j) { j["backbone_config"]["layer_type"] = "bottleneck"; });
  EXPECT_NE(msg.find("model.backbone.model.encoder.stages.0.layers.0"), std::string::npos) << msg;
}

// ---------------------------------------------------------------- structure

Graph optimized(const std::string& name) {
  return testing::fixture_graph(kFixtures / name, DType::F32, 0, "rt_detr_v2");
}

// Every BatchNorm folds into its conv; one ms_deform_attn, two self-attention
// matmuls... per decoder layer; one AIFI layer; query selection is two top_k
// and two gathers; the masking mul only where some anchor is invalid.
TEST(RtDetrStructure, NodeCountsAfterPasses) {
  struct Want {
    const char* name;
    int layers;
    bool mask;
  };
  for (const Want& w : {Want{"basic_1l", 1, false}, Want{"bottleneck_2l", 2, true}, Want{"discrete_1l", 1, false}}) {
    const Graph g = optimized(w.name);
    EXPECT_EQ(g.count_ops(Op::BatchNorm), 0) << w.name;
    EXPECT_EQ(g.count_ops(Op::MsDeformAttn), w.layers) << w.name;
    EXPECT_EQ(g.count_ops(Op::Attention), w.layers + 1) << w.name;  // AIFI's and each decoder layer's self-attention
    EXPECT_EQ(g.count_ops(Op::MatMul), 0) << w.name;
    EXPECT_EQ(g.count_ops(Op::Softmax), 0) << w.name;
    EXPECT_EQ(g.count_ops(Op::LayerNorm), 3 * w.layers + 2 + 1) << w.name;
    EXPECT_EQ(g.count_ops(Op::TopK), 2) << w.name;
    EXPECT_EQ(g.count_ops(Op::Gather), 2) << w.name;
    EXPECT_EQ(g.count_ops(Op::InverseSigmoid), w.layers) << w.name;
    EXPECT_EQ(g.count_ops(Op::UpsampleNearest), 2) << w.name;
    EXPECT_EQ(g.count_ops(Op::Mul), w.mask ? 1 : 0) << w.name;
    Graph again = g;
    EXPECT_EQ(fold_parallel_convs(again), 0) << w.name << ": every RepVGG pair is one conv";
    ASSERT_NE(g.find_node("model.decoder.layers.0.encoder_attn.core"), nullptr) << w.name;
    EXPECT_EQ(g.find_node("model.decoder.layers.0.encoder_attn.core")->attr_str("method"),
              std::string(w.name) == "discrete_1l" ? "discrete" : "default");
  }
}


// The published RT-DETR v2 FP8 study's seven linear groups (FIELD-NOTES §4)
// are recipe parts: each names exactly its linears of the graph kiln builds,
// no linear is in two parts, and together they are every linear. (The
// study's counts are for 3 decoder layers; bottleneck_2l has 2.) On the graph
// the quantize pass sees: before merge_parallel_linears joins linears.
TEST(RtDetrQuantParts, NameTheStudysLinearGroups) {
  const Graph g = testing::fixture_graph(kFixtures / "bottleneck_2l", DType::F32, 0, "rt_detr_v2", false);
  const quant::PartTable parts = rtdetr::quant_parts();
  const size_t layers = 2;
  const std::map<std::string, size_t> want = {
      {"aifi", 6},                        // q, k, v, out, fc1, fc2 of the one AIFI layer
      {"decoder_self", 4 * layers},       // q, k, v, out
      {"decoder_value", 2 * layers},      // value_proj, output_proj
      {"decoder_sampling", 2 * layers},   // sampling_offsets, attention_weights
      {"decoder_ffn", 2 * layers},        // fc1, fc2
      {"query_select", 5},                // enc_output.0, enc_score_head, enc_bbox_head (3 layers)
      {"refine", 5 * layers + 1},         // query_pos (2) and bbox_embed (3) per layer, the last layer's class head
  };
  ASSERT_EQ(parts.size(), want.size());
  quant::Recipe r;
  r.defaults = {false, false, false, 0};  // membership only: no default exclusion
  std::set<int> seen;
  for (const auto& [part, n] : want) {
    r.parts = {part};
    const quant::Selection sel = quant::select_quantized(g, r, parts);
    EXPECT_EQ(sel.quantized.size(), n) << part;
    for (int i : sel.quantized) {
      EXPECT_EQ(g.nodes[i].op, Op::Linear) << part << ": " << g.nodes[i].name;
      EXPECT_TRUE(seen.insert(i).second) << g.nodes[i].name << " is in two parts";
    }
  }
  size_t linears = 0, candidates = 0;
  for (const Node& n : g.nodes) {
    candidates += quant::is_quantization_candidate(g, n);
    // Every linear of K > 1 (none of K = 1 remains since the per-image constants became add/mul operands).
    linears += n.op == Op::Linear && quant::is_quantization_candidate(g, n) && g.values[n.inputs[1]].shape[1] > 1;
  }
  EXPECT_EQ(seen.size(), linears) << "a linear in no part";
  r.parts = {"aifi", "decoder_value"};  // the study's default
  EXPECT_EQ(quant::select_quantized(g, r, parts).quantized.size(), 6 + 2 * layers);
  r.parts = {"all", "no-decoder_sampling"};  // what went non-finite on TensorRT, left out
  EXPECT_EQ(quant::select_quantized(g, r, parts).quantized.size(), candidates - 2 * layers);
  r.parts = {"decoder_values"};  // a typo names nothing: refused, listing the family's parts
  try {
    quant::select_quantized(g, r, parts);
    ADD_FAILURE() << "a part that names nothing was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("decoder_value"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace kiln
