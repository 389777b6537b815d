// The transformer ops (issue 12: RT-DETR v2): shape rules and their errors
// naming the node, re-shaping per batch (axis 0 is the batch), values worked
// out by hand on the plain reference and the CPU backend, gather's run-time
// index check, and RT-DETR's query selection (top_k indices read by gather)
// through a CPU engine loaded from a bundle. The op harness (tests/ops/)
// compares the backends on many shapes; this file pins what the ops mean.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "backends/cpu/ref/ref.hpp"
#include "cpu_bundle_util.hpp"
#include "graph_test_util.hpp"
#include "ir/printer.hpp"
#include "ir/verifier.hpp"
#include "kiln/kiln.hpp"

namespace kiln {
namespace {

using testing::error_of;

// The error of building one node `op` named "n" over inputs of these shapes
// (all f32 unless given), or "(no error)".
struct In {
  Shape shape;
  DType dtype = DType::F32;
};
std::string rule_error(Op op, const std::vector<In>& ins, Attrs attrs) {
  return error_of([&] {
    Graph g;
    std::vector<int> ids;
    for (size_t i = 0; i < ins.size(); ++i) ids.push_back(g.add_input("in" + std::to_string(i), ins[i].dtype, ins[i].shape));
    g.add_node(op, "n", ids, std::move(attrs));
  });
}

Shape out_shape(Op op, const std::vector<In>& ins, Attrs attrs) {
  Graph g;
  std::vector<int> ids;
  for (size_t i = 0; i < ins.size(); ++i) ids.push_back(g.add_input("in" + std::to_string(i), ins[i].dtype, ins[i].shape));
  return g.values[g.add_node(op, "n", ids, std::move(attrs))].shape;
}

#define EXPECT_NODE_ERROR(msg, part)                                      \
  do {                                                                    \
    const std::string m_ = (msg);                                         \
    EXPECT_EQ(m_.rfind("n: ", 0), 0u) << m_;                              \
    EXPECT_NE(m_.find(part), std::string::npos) << m_;                    \
  } while (0)

using Ints = std::vector<int64_t>;

// ------------------------------------------------------------ shape rules

TEST(TransformerOps, ShapeRules) {
  EXPECT_EQ(out_shape(Op::LayerNorm, {{{3, 13, 24}}, {{24}}, {{24}}}, {}), (Shape{3, 13, 24}));
  EXPECT_EQ(out_shape(Op::Softmax, {{{1, 8, 13, 13}}}, {}), (Shape{1, 8, 13, 13}));
  EXPECT_EQ(out_shape(Op::MatMul, {{{3, 8, 13, 32}}, {{3, 8, 32, 24}}}, {}), (Shape{3, 8, 13, 24}));
  EXPECT_EQ(out_shape(Op::MatMul, {{{3, 13, 32}}, {{32, 5}}}, {}), (Shape{3, 13, 5}));
  EXPECT_EQ(out_shape(Op::MatMul, {{{13, 32}}, {{3, 2, 32, 5}}}, {}), (Shape{3, 2, 13, 5}));
  EXPECT_EQ(out_shape(Op::Transpose, {{{3, 256, 20, 20}}}, {{"perm", Ints{0, 2, 3, 1}}}), (Shape{3, 20, 20, 256}));
  EXPECT_EQ(out_shape(Op::Reshape, {{{3, 400, 256}}}, {{"shape", Ints{-1, 400, 8, 32}}}), (Shape{3, 400, 8, 32}));
  EXPECT_EQ(out_shape(Op::Reshape, {{{3, 400, 256}}}, {{"shape", Ints{-1, -1, 8, 32}}}), (Shape{3, 400, 8, 32}));
  EXPECT_EQ(out_shape(Op::Reshape, {{{3, 256, 20, 20}}}, {{"shape", Ints{-1, 256, 400}}}), (Shape{3, 256, 400}));
  EXPECT_EQ(out_shape(Op::Reshape, {{{2, 0, 5}}}, {{"shape", Ints{-1, 5, 0}}}), (Shape{2, 5, 0}));  // 0 is an extent
  EXPECT_EQ(out_shape(Op::UpsampleNearest, {{{3, 256, 20, 20}}}, {{"scales", Ints{2, 2}}}), (Shape{3, 256, 40, 40}));
  EXPECT_EQ(out_shape(Op::Gather, {{{3, 8400, 256}}, {{3, 300}, DType::I64}}, {{"axis", int64_t{1}}}), (Shape{3, 300, 256}));
  EXPECT_EQ(out_shape(Op::Gather, {{{3, 4, 13}}, {{3, 4, 6}, DType::I32}}, {{"axis", int64_t{-1}}}), (Shape{3, 4, 6}));
  EXPECT_EQ(out_shape(Op::InverseSigmoid, {{{3, 300, 4}}}, {}), (Shape{3, 300, 4}));
  EXPECT_EQ(out_shape(Op::Linear, {{{3, 300, 256}}, {{1024, 256}}}, {}), (Shape{3, 300, 1024}));
  EXPECT_EQ(out_shape(Op::Linear, {{{3, 256}}, {{80, 256}}}, {}), (Shape{3, 80}));
}

TEST(TransformerOps, ShapeRuleErrorsNameTheNode) {
  EXPECT_NODE_ERROR(rule_error(Op::LayerNorm, {{{3, 13, 24}}, {{13}}}, {}), "weight 'in1' has shape [13], expected [24]");
  EXPECT_NODE_ERROR(rule_error(Op::LayerNorm, {{{24}}}, {}), "expected rank >= 2");
  EXPECT_NODE_ERROR(rule_error(Op::LayerNorm, {{{3, 0}}}, {}), "empty last axis");
  EXPECT_NODE_ERROR(rule_error(Op::LayerNorm, {{{3, 24}}}, {{"eps", -1.0}}), "'eps' must be finite and >= 0");
  EXPECT_NODE_ERROR(rule_error(Op::Softmax, {{{3, 24}}}, {{"axis", int64_t{0}}}), "axis 0, the batch axis");
  EXPECT_NODE_ERROR(rule_error(Op::Softmax, {{{24}}}, {}), "the batch axis");
  EXPECT_NODE_ERROR(rule_error(Op::Softmax, {{{3, 24}}}, {{"axis", int64_t{2}}}), "axis 2 out of range for rank 2");
  EXPECT_NODE_ERROR(rule_error(Op::MatMul, {{{3, 13, 24}}, {{3, 13, 24}}}, {}), "inner extents 24 and 13 differ");
  EXPECT_NODE_ERROR(rule_error(Op::MatMul, {{{3, 2, 13, 24}}, {{3, 1, 24, 5}}}, {}), "leading dims [3,2] and [3,1] differ");
  EXPECT_NODE_ERROR(rule_error(Op::MatMul, {{{3, 13, 24}}, {{2, 3, 24, 5}}}, {}), "leading dims [3] and [2,3] differ");
  EXPECT_NODE_ERROR(rule_error(Op::MatMul, {{{24}}, {{24, 5}}}, {}), "expected rank >= 2");
  EXPECT_NODE_ERROR(rule_error(Op::MatMul, {{{3, 24}}, {{24, 5}, DType::F16}}, {}), "is f16");
  EXPECT_NODE_ERROR(rule_error(Op::Transpose, {{{3, 4, 5}}}, {{"perm", Ints{0, 2, 2}}}), "is not a permutation");
  EXPECT_NODE_ERROR(rule_error(Op::Transpose, {{{3, 4, 5}}}, {{"perm", Ints{0, 1}}}), "is not a permutation");
  EXPECT_NODE_ERROR(rule_error(Op::Transpose, {{{3, 4, 5}}}, {{"perm", Ints{1, 0, 2}}}), "moves axis 0, the batch axis");
  EXPECT_NODE_ERROR(rule_error(Op::Transpose, {{{3, 4, 5}}}, {}), "needs attribute 'perm'");
  EXPECT_NODE_ERROR(rule_error(Op::Reshape, {{{3, 4, 5}}}, {{"shape", Ints{3, 20}}}), "shape[0] must be -1");
  EXPECT_NODE_ERROR(rule_error(Op::Reshape, {{{3, 4, 5}}}, {{"shape", Ints{-1, -1, -1}}}), "more than one -1");
  EXPECT_NODE_ERROR(rule_error(Op::Reshape, {{{3, 4, 5}}}, {{"shape", Ints{-1, 3, 7}}}), "20 elements per image");
  EXPECT_NODE_ERROR(rule_error(Op::Reshape, {{{3, 4, 5}}}, {{"shape", Ints{-1, 3, -1}}}), "do not fill");
  EXPECT_NODE_ERROR(rule_error(Op::Reshape, {{{3, 4, 5}}}, {{"shape", Ints{-1, -2, 10}}}), "has extent -2");
  EXPECT_NODE_ERROR(rule_error(Op::Reshape, {{{3, 4, 5}}}, {{"shape", Ints{-1, 1, 1, 1, 1, 1, 1, 1, 20}}}), "rank 1..8");
  EXPECT_NODE_ERROR(rule_error(Op::UpsampleNearest, {{{3, 4, 5, 5}}}, {}), "needs attribute 'scales'");
  EXPECT_NODE_ERROR(rule_error(Op::UpsampleNearest, {{{3, 4, 5, 5}}}, {{"scales", Ints{2, 0}}}), "two integers >= 1");
  EXPECT_NODE_ERROR(rule_error(Op::UpsampleNearest, {{{3, 4, 5}}}, {{"scales", Ints{2, 2}}}), "expected rank 4");
  EXPECT_NODE_ERROR(rule_error(Op::Gather, {{{3, 24, 13}}, {{3, 5}, DType::I64}}, {{"axis", int64_t{0}}}), "the batch axis");
  // Concat and slice of activations along the batch axis (docs/graph-ir.md: axis 0 is the batch).
  EXPECT_NODE_ERROR(rule_error(Op::Concat, {{{2, 3, 2, 2}}, {{2, 3, 2, 2}}}, {{"axis", int64_t{0}}}), "axis 0, the batch axis");
  EXPECT_NODE_ERROR(rule_error(Op::Concat, {{{2, 4, 8}}, {{2, 4, 8}}}, {{"axis", int64_t{-3}}}), "the batch axis");
  EXPECT_NODE_ERROR(rule_error(Op::Slice, {{{3, 4, 2, 2}}}, {{"axis", int64_t{0}}, {"start", int64_t{0}}, {"end", int64_t{1}}}),
                    "axis 0, the batch axis");
  EXPECT_NODE_ERROR(rule_error(Op::Gather, {{{3, 24, 13}}, {{3, 5}}}, {{"axis", int64_t{1}}}), "is f32, expected i64 or i32");
  EXPECT_NODE_ERROR(rule_error(Op::Gather, {{{3, 24, 13}}, {{3, 5, 13}, DType::I64}}, {{"axis", int64_t{1}}}),
                    "takes an index of shape [3,-1]");
  EXPECT_NODE_ERROR(rule_error(Op::Gather, {{{3, 24, 13}}, {{2, 5}, DType::I64}}, {{"axis", int64_t{1}}}),
                    "takes an index of shape [3,-1]");
  // A table shared by every index row has leading dims of 1; any other extent must match the index's.
  EXPECT_NODE_ERROR(rule_error(Op::Gather, {{{2, 24, 13}}, {{3, 5}, DType::I64}}, {{"axis", int64_t{1}}}),
                    "takes an index of shape [2,-1]");
  EXPECT_NODE_ERROR(rule_error(Op::InverseSigmoid, {{{3, 4}}}, {{"eps", std::nan("")}}), "'eps' must be finite");
  EXPECT_NODE_ERROR(rule_error(Op::Linear, {{{3, 13, 24}}, {{5, 13}}}, {}), "does not fit input [3,13,24]");
  EXPECT_NODE_ERROR(rule_error(Op::Linear, {{{24}}, {{5, 24}}}, {}), "expected rank >= 2");
}

TEST(TransformerOps, ShapesFollowTheBatch) {
  // Built at batch 1, re-shaped at batch 3 as the runtime does (a new extent
  // on the inputs' axis 0, shapes inferred again): every op keeps axis 0.
  Graph g;
  const int x = g.add_input("x", DType::F32, {1, 16, 4, 5});
  const int idx = g.add_input("idx", DType::I64, {1, 7});
  const int up = g.add_node(Op::UpsampleNearest, "up", {x}, {{"scales", Ints{2, 2}}});           // [1,16,8,10]
  const int tok = g.add_node(Op::Reshape, "flat", {up}, {{"shape", Ints{-1, 16, -1}}});          // [1,16,80]
  const int t = g.add_node(Op::Transpose, "t", {tok}, {{"perm", Ints{0, 2, 1}}});               // [1,80,16]
  const int heads = g.add_node(Op::Reshape, "heads", {t}, {{"shape", Ints{-1, 80, 2, 8}}});      // [1,80,2,8]
  const int ht = g.add_node(Op::Transpose, "ht", {heads}, {{"perm", Ints{0, 2, 1, 3}}});         // [1,2,80,8]
  const int kt = g.add_node(Op::Transpose, "kt", {heads}, {{"perm", Ints{0, 2, 3, 1}}});         // [1,2,8,80]
  const int s = g.add_node(Op::MatMul, "qk", {ht, kt});                                          // [1,2,80,80]
  const int p = g.add_node(Op::Softmax, "p", {s}, {});
  const int pv = g.add_node(Op::MatMul, "pv", {p, ht});                                          // [1,2,80,8]
  const int n = g.add_node(Op::LayerNorm, "ln", {pv}, {});
  const int sel = g.add_node(Op::Gather, "sel", {t, idx}, {{"axis", int64_t{1}}});               // [1,7,16]
  g.mark_output(n);
  g.mark_output(sel);
  EXPECT_EQ(g.values[n].shape, (Shape{1, 2, 80, 8}));
  g.values[x].shape[0] = 3;
  g.values[idx].shape[0] = 3;
  g.infer_shapes();
  EXPECT_EQ(g.values[n].shape, (Shape{3, 2, 80, 8}));
  EXPECT_EQ(g.values[sel].shape, (Shape{3, 7, 16}));
  EXPECT_NO_THROW(verify_graph(g, "re-shaped at batch 3"));
  EXPECT_NE(print_graph(g).find("reshape \"heads\"(%"), std::string::npos);
}

// ------------------------------------------------------------ values by hand

// One node over f32 inputs through the plain reference and the CPU backend.
std::vector<std::vector<float>> run_both(Op op, const std::vector<std::pair<In, std::vector<float>>>& ins, Attrs attrs) {
  Graph g;
  std::vector<int> ids;
  std::vector<std::vector<float>> data;
  for (size_t i = 0; i < ins.size(); ++i) {
    ids.push_back(g.add_input("in" + std::to_string(i), ins[i].first.dtype, ins[i].first.shape));
    data.push_back(ins[i].second);
  }
  g.mark_output(g.add_node(op, "n", ids, std::move(attrs)));
  return {ref::run_reference_graph(g, data).at(0), testing::run_cpu(g, data).at(0)};
}

void expect_near_all(const std::vector<std::vector<float>>& got, const std::vector<double>& want, double tol) {
  for (size_t side = 0; side < got.size(); ++side) {
    ASSERT_EQ(got[side].size(), want.size()) << (side ? "cpu" : "reference");
    for (size_t i = 0; i < want.size(); ++i)
      EXPECT_NEAR(got[side][i], want[i], tol) << (side ? "cpu" : "reference") << " element " << i;
  }
}

TEST(TransformerOps, LayerNormSoftmaxGeluByHand) {
  // [1, 2, 3, 4]: mean 2.5, biased variance 1.25.
  const double sd = std::sqrt(1.25 + 1e-5);
  expect_near_all(run_both(Op::LayerNorm, {{{{1, 4}}, {1, 2, 3, 4}}}, {}),
                  {-1.5 / sd, -0.5 / sd, 0.5 / sd, 1.5 / sd}, 1e-6);
  // softmax([0, ln 3]) = [1/4, 3/4]; [1000, 1000]: the max is subtracted, no overflow.
  expect_near_all(run_both(Op::Softmax, {{{{2, 2}}, {0.f, std::log(3.f), 1000.f, 1000.f}}}, {}), {0.25, 0.75, 0.5, 0.5},
                  1e-6);
  // Along axis 1 of [1, 2, 2]: pairs (x[0,0,j], x[0,1,j]).
  expect_near_all(run_both(Op::Softmax, {{{{1, 2, 2}}, {0.f, 5.f, std::log(3.f), 5.f}}}, {{"axis", int64_t{1}}}),
                  {0.25, 0.5, 0.75, 0.5}, 1e-6);
  // torch.nn.functional.gelu(torch.tensor([-1., 0., 1., 3.])) (approximate='none').
  expect_near_all(run_both(Op::Activation, {{{{1, 4}}, {-1, 0, 1, 3}}}, {{"activation", std::string("gelu")}}),
                  {-0.15865525393145707, 0.0, 0.8413447460685429, 2.99595030590511}, 1e-6);
}

TEST(TransformerOps, InverseSigmoidClampsAndUsesEps) {
  // transformers: x.clamp(0, 1); log(x.clamp(min=eps) / (1 - x).clamp(min=eps)).
  const double eps = 1e-5;
  expect_near_all(run_both(Op::InverseSigmoid, {{{{1, 7}}, {-0.5f, 0.f, 1e-7f, 0.5f, 0.75f, 1.f, 2.f}}}, {}),
                  {std::log(eps), std::log(eps), std::log(eps / (1 - 1e-7)), 0.0, std::log(3.0), -std::log(eps),
                   -std::log(eps)},
                  1e-5);
  const auto nan = run_both(Op::InverseSigmoid, {{{{1, 1}}, {std::numeric_limits<float>::quiet_NaN()}}}, {});
  EXPECT_TRUE(std::isnan(nan[0][0]) && std::isnan(nan[1][0]));
}

TEST(TransformerOps, MatMulTransposeReshapeUpsampleByHand) {
  // [[0,1,2],[3,4,5]] x [[0,1],[2,3],[4,5]] = [[10,13],[28,40]], twice (equal leading dims).
  std::vector<float> a = {0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5}, b = {0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5};
  expect_near_all(run_both(Op::MatMul, {{{{2, 2, 3}}, a}, {{{2, 3, 2}}, b}}, {}), {10, 13, 28, 40, 10, 13, 28, 40}, 0);
  // torch.arange(6.).view(1, 2, 3).permute(0, 2, 1)
  expect_near_all(run_both(Op::Transpose, {{{{1, 2, 3}}, {0, 1, 2, 3, 4, 5}}}, {{"perm", Ints{0, 2, 1}}}),
                  {0, 3, 1, 4, 2, 5}, 0);
  // [1, 2, 1, 3] -> perm (0, 3, 2, 1): the extent-1 axis moves, the data is [1, 3, 1, 2].
  expect_near_all(run_both(Op::Transpose, {{{{1, 2, 1, 3}}, {0, 1, 2, 3, 4, 5}}}, {{"perm", Ints{0, 3, 2, 1}}}),
                  {0, 3, 1, 4, 2, 5}, 0);
  expect_near_all(run_both(Op::Reshape, {{{{1, 2, 3}}, {0, 1, 2, 3, 4, 5}}}, {{"shape", Ints{-1, 3, 2}}}),
                  {0, 1, 2, 3, 4, 5}, 0);
  // [[1,2],[3,4]] upsampled 2x nearest.
  expect_near_all(run_both(Op::UpsampleNearest, {{{{1, 1, 2, 2}}, {1, 2, 3, 4}}}, {{"scales", Ints{2, 2}}}),
                  {1, 1, 2, 2, 1, 1, 2, 2, 3, 3, 4, 4, 3, 3, 4, 4}, 0);
  // Linear on [1, 2, 3] rows: each row of 3 times w [2, 3] + b.
  Graph g;
  const int x = g.add_input("x", DType::F32, {1, 2, 3});
  const int w = g.add_constant("w", HostTensor::from_f32({2, 3}, {1, 0, 0, 0, 1, 1}));
  const int bias = g.add_constant("b", HostTensor::from_f32({2}, {10, 20}));
  g.mark_output(g.add_node(Op::Linear, "fc", {x, w, bias}));
  const std::vector<float> xs = {1, 2, 3, 4, 5, 6};
  const std::vector<float> want = {11, 25, 14, 31};
  EXPECT_EQ(ref::run_reference_graph(g, {xs}).at(0), want);
  EXPECT_EQ(testing::run_cpu(g, {xs}).at(0), want);
}

TEST(TransformerOps, GatherPicksRowsAndRefusesBadIndicesNamingTheNode) {
  // x [1, 4, 2] = arange(8); index [1, 3] = [3, 0, 3]: rows 3, 0, 3.
  const std::vector<float> x = {0, 1, 2, 3, 4, 5, 6, 7};
  expect_near_all(run_both(Op::Gather, {{{{1, 4, 2}}, x}, {{{1, 3}, DType::I64}, {3, 0, 3}}}, {{"axis", int64_t{1}}}),
                  {6, 7, 0, 1, 6, 7}, 0);
  for (float bad : {4.f, -1.f, 1.5f}) {
    for (int side = 0; side < 2; ++side) {
      Graph g;
      const int xi = g.add_input("x", DType::F32, {1, 4, 2});
      const int ii = g.add_input("index", DType::I64, {1, 3});
      g.mark_output(g.add_node(Op::Gather, "query_select", {xi, ii}, {{"axis", int64_t{1}}}));
      const std::vector<std::vector<float>> in = {x, {0, bad, 2}};
      const std::string e = error_of([&] { side ? (void)testing::run_cpu(g, in) : (void)ref::run_reference_graph(g, in); });
      EXPECT_EQ(e.rfind("query_select: gather index", 0), 0u) << (side ? "cpu: " : "reference: ") << e;
      EXPECT_NE(e.find("is not an integer in [0, 4)"), std::string::npos) << e;
    }
  }
}

TEST(TransformerOps, CpuBackendReadsIntegerConstantsOnlyAsGatherIndices) {
  auto index_tensor = [](std::vector<int64_t> v) {
    HostTensor t;
    t.dtype = DType::I64;
    t.shape = {1, static_cast<int64_t>(v.size())};
    std::vector<uint8_t> bytes(v.size() * 8);
    std::memcpy(bytes.data(), v.data(), bytes.size());
    t.blob = Blob::from_vector(std::move(bytes));
    return t;
  };
  Graph g;
  const int x = g.add_input("x", DType::F32, {1, 4, 2});
  const int idx = g.add_constant("idx", index_tensor({2, 2, 1}));
  g.mark_output(g.add_node(Op::Gather, "sel", {x, idx}, {{"axis", int64_t{1}}}));
  EXPECT_EQ(testing::run_cpu(g, {{0, 1, 2, 3, 4, 5, 6, 7}}).at(0), (std::vector<float>{4, 5, 4, 5, 2, 3}));
  // An index beyond 2^24 cannot be held exactly by the CPU backend's f32 values.
  Graph big = g;
  big.values[idx].constant = index_tensor({2, int64_t{1} << 25, 1});
  EXPECT_NE(error_of([&] { cpu::CpuProgram p(big); }).find("exact to 2^24"), std::string::npos);
  // Any other reader of an integer value is refused.
  Graph other;
  const int c = other.add_constant("c", index_tensor({1, 2, 3}));
  const int r = other.add_node(Op::Reshape, "r", {c}, {{"shape", Ints{-1, 3}}});
  EXPECT_FALSE(cpu::supports(other, other.nodes[0]));
  EXPECT_TRUE(cpu::supports(g, g.nodes[0]));
  (void)r;
}

// ------------------------------------------------------------ RT-DETR's query selection through an engine

TEST(TransformerOps, QuerySelectionThroughACpuEngine) {
  // pixel_values [N, 24, 6] as memory tokens -> linear "score" [N, 24, 1] ->
  // reshape [N, 24] -> top_k 5 (indices i64) -> gather the memory's rows
  // [N, 5, 6] -> inverse_sigmoid of their sigmoid, layer_norm: the chain of
  // transformers' RTDetrV2Model query selection, at batches 1 and 3.
  Graph g;
  const int x = g.add_input("pixel_values", DType::F32, {3, 24, 6});
  const int w = g.add_constant("score.weight", HostTensor::from_f32({1, 6}, {0.5f, -1.f, 0.25f, 2.f, -0.5f, 1.f}));
  const int score = g.add_node(Op::Linear, "score", {x, w});
  const int flat = g.add_node(Op::Reshape, "score.flat", {score}, {{"shape", Ints{-1, 24}}});
  const std::vector<int> vi = g.add_node_multi(Op::TopK, "topk", {flat}, {{"k", int64_t{5}}, {"axis", int64_t{1}}});
  const int sel = g.add_node(Op::Gather, "select", {x, vi[1]}, {{"axis", int64_t{1}}});
  const int sig = g.add_node(Op::Activation, "sig", {sel}, {{"activation", std::string("sigmoid")}});
  const int inv = g.add_node(Op::InverseSigmoid, "inv", {sig}, {});
  const int ln = g.add_node(Op::LayerNorm, "ln", {inv}, {});
  g.values[ln].name = "queries";
  g.values[vi[1]].name = "indices";
  g.mark_output(ln);
  g.mark_output(vi[1]);
  const std::vector<uint8_t> bytes = testing::cpu_bundle(g, "test/query_selection");
  const auto engine = Engine::load_from_memory(bytes.data(), bytes.size(), {}, "query_selection.bundle");
  std::mt19937 rng(12);
  for (int64_t batch : {1, 3}) {
    std::vector<float> in(static_cast<size_t>(batch * 24 * 6));
    std::uniform_real_distribution<float> d(-2.f, 2.f);
    for (float& v : in) v = d(rng);
    Graph shaped = g;
    shaped.values[x].shape[0] = batch;
    shaped.infer_shapes();
    const auto want = ref::run_reference_graph(shaped, {in});
    const auto got = engine->create_context()->run({{"pixel_values", {batch, 24, 6}, in}});
    ASSERT_EQ(got.size(), 2u);
    EXPECT_EQ(got[0].shape, (Shape{batch, 5, 6}));
    EXPECT_EQ(got[1].data, want[1]) << "batch " << batch;
    EXPECT_LT(testing::max_abs_diff(got[0].data, want[0]), 1e-4f) << "batch " << batch;
    // The selected rows are the memory rows the indices name (before the elementwise tail).
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t j = 0; j < 5; ++j) {
        const float i = got[1].data[b * 5 + j];
        ASSERT_TRUE(i >= 0 && i < 24 && i == std::floor(i)) << i;
      }
  }
}

// A gather from a constant table shared by every image ([1, S, C], leading
// dims 1: RT-DETR's anchors picked by each image's top-k), at batches 1 and 3:
// every output row is the table row its index names, on the CPU engine and
// the plain reference alike.
TEST(TransformerOps, GatherFromATableSharedByEveryImage) {
  Graph g;
  std::vector<float> table(6 * 4);
  for (size_t i = 0; i < table.size(); ++i) table[i] = 0.5f * static_cast<float>(i) - 3.f;
  const int t = g.add_constant("anchors", HostTensor::from_f32({1, 6, 4}, table));
  const int idx = g.add_input("idx", DType::I64, {3, 5});
  const int y = g.add_node(Op::Gather, "pick", {t, idx}, {{"axis", int64_t{1}}});
  g.values[y].name = "picked";
  g.mark_output(y);
  EXPECT_EQ(g.values[y].shape, (Shape{3, 5, 4}));
  const std::vector<uint8_t> bytes = testing::cpu_bundle(g, "test/shared_gather");
  const auto engine = Engine::load_from_memory(bytes.data(), bytes.size(), {}, "shared_gather.bundle");
  for (int64_t batch : {1, 3}) {
    std::vector<float> index(static_cast<size_t>(batch * 5));
    for (size_t i = 0; i < index.size(); ++i) index[i] = static_cast<float>((i * 7 + 3) % 6);
    Graph shaped = g;
    shaped.values[idx].shape[0] = batch;
    shaped.infer_shapes();
    const auto want = ref::run_reference_graph(shaped, {index});
    const auto got = engine->create_context()->run({{"idx", {batch, 5}, index}});
    ASSERT_EQ(got.size(), 1u);
    EXPECT_EQ(got[0].shape, (Shape{batch, 5, 4}));
    ASSERT_EQ(want[0].size(), got[0].data.size());
    for (size_t r = 0; r < index.size(); ++r)
      for (size_t c = 0; c < 4; ++c) {
        const float expect = table[static_cast<size_t>(index[r]) * 4 + c];
        EXPECT_EQ(got[0].data[r * 4 + c], expect) << "batch " << batch << " row " << r;
        EXPECT_EQ(want[0][r * 4 + c], expect) << "batch " << batch << " row " << r;
      }
  }
}

}  // namespace
}  // namespace kiln
