// Every pass: build a tiny graph in code, run it on the CPU before and after,
// compare the numbers and assert the structural change (op counts).
#include <gtest/gtest.h>

#include <cmath>

#include "graph_test_util.hpp"
#include "backends/cpu/ref/ref.hpp"
#include "ir/verifier.hpp"
#include "core/error.hpp"
#include "core/half.hpp"
#include "ir/quant_form.hpp"
#include "passes/pass.hpp"
#include "quant/calibrate.hpp"

namespace kiln {
namespace {

using testing::max_abs;
using testing::max_abs_diff;
using testing::random_tensor;
using testing::run_cpu;

Attrs conv_attrs(int stride, int pad, int groups = 1) {
  return {{"strides", std::vector<int64_t>{stride, stride}},
          {"pads", std::vector<int64_t>{pad, pad, pad, pad}},
          {"groups", int64_t{groups}}};
}

int add_bn(Graph& g, const std::string& name, int x, int64_t c, std::mt19937& rng) {
  int s = g.add_constant(name + ".weight", random_tensor({c}, rng, 0.5f, 1.5f));
  int b = g.add_constant(name + ".bias", random_tensor({c}, rng, -0.2f, 0.2f));
  int m = g.add_constant(name + ".running_mean", random_tensor({c}, rng, -0.2f, 0.2f));
  int v = g.add_constant(name + ".running_var", random_tensor({c}, rng, 0.5f, 1.5f));
  return g.add_node(Op::BatchNorm, name, {x, s, b, m, v}, {{"eps", 1e-5}});
}

int relu(Graph& g, const std::string& name, int x) {
  return g.add_node(Op::Activation, name, {x}, {{"activation", std::string("relu")}});
}

// A residual block with 13 channels (awkward on purpose): conv-bn-relu,
// conv-bn, shortcut conv-bn (stride 2), add, relu.
Graph residual_block(std::mt19937& rng, bool with_conv_bias) {
  Graph g;
  int x = g.add_input("x", DType::F32, {2, 6, 9, 9});
  int w1 = g.add_constant("c1.weight", random_tensor({13, 6, 3, 3}, rng));
  std::vector<int> c1_in = {x, w1};
  if (with_conv_bias) c1_in.push_back(g.add_constant("c1.bias", random_tensor({13}, rng)));
  int y = g.add_node(Op::Conv2d, "c1", c1_in, conv_attrs(2, 1));
  y = relu(g, "a1", add_bn(g, "bn1", y, 13, rng));
  int w2 = g.add_constant("c2.weight", random_tensor({13, 13, 3, 3}, rng));
  y = add_bn(g, "bn2", g.add_node(Op::Conv2d, "c2", {y, w2}, conv_attrs(1, 1)), 13, rng);
  int wd = g.add_constant("down.weight", random_tensor({13, 6, 1, 1}, rng));
  int skip = add_bn(g, "down_bn", g.add_node(Op::Conv2d, "down", {x, wd}, conv_attrs(2, 0)), 13, rng);
  y = relu(g, "a2", g.add_node(Op::Add, "add", {y, skip}));
  g.mark_output(y);
  return g;
}

std::vector<float> input_for(const Graph& g, std::mt19937& rng) {
  return random_tensor(g.values[g.inputs[0]].shape, rng).to_f32();
}

// RepVGG pairs (RT-DETR's CSPRep): BN(3x3 conv) + BN(1x1 conv) of one input,
// optionally strided and with an activation after the add, fold into one conv.
TEST(Passes, FoldParallelConvsMergesCentredKernels) {
  std::mt19937 rng(5);
  for (int stride : {1, 2}) {
    Graph g;
    const int x = g.add_input("x", DType::F32, {2, 6, 9, 9});
    const int a = add_bn(g, "bn3", g.add_node(Op::Conv2d, "c3", {x, g.add_constant("w3", random_tensor({13, 6, 3, 3}, rng))}, conv_attrs(stride, 1)), 13, rng);
    const int b = add_bn(g, "bn1", g.add_node(Op::Conv2d, "c1", {x, g.add_constant("w1", random_tensor({13, 6, 1, 1}, rng))}, conv_attrs(stride, 0)), 13, rng);
    g.mark_output(g.add_node(Op::Activation, "act", {g.add_node(Op::Add, "sum", {b, a})}, {{"activation", std::string("silu")}}));
    const std::vector<float> in = input_for(g, rng);
    const auto before = run_cpu(g, {in});
    fold_batchnorm(g);
    EXPECT_EQ(fold_parallel_convs(g), 1) << stride;
    eliminate_dead_nodes(g);
    verify_graph(g, "fold_parallel_convs");
    EXPECT_EQ(g.count_ops(Op::Conv2d), 1);
    EXPECT_EQ(g.count_ops(Op::Add), 0);
    ASSERT_NE(g.find_node("c3"), nullptr) << "the larger kernel's conv keeps its name";
    const auto after = run_cpu(g, {in});
    EXPECT_LT(max_abs_diff(after[0], before[0]), 1e-5f * std::max(1.f, max_abs(before[0])));
    EXPECT_EQ(fold_parallel_convs(g), 0) << "idempotent";
  }
  // Not folded: a window with another centre (same output shape), or another input.
  for (int which = 0; which < 2; ++which) {
    Graph g;
    const int x = g.add_input("x", DType::F32, {1, 4, 8, 8});
    const int x2 = g.add_node(Op::Activation, "x2", {x}, {{"activation", std::string("relu")}});
    Attrs off_centre = conv_attrs(1, 0);
    off_centre["pads"] = std::vector<int64_t>{0, 0, 2, 2};
    const int a = g.add_node(Op::Conv2d, "c3", {x, g.add_constant("w3", random_tensor({4, 4, 3, 3}, rng))},
                             which == 0 ? off_centre : conv_attrs(1, 1));
    const int b = g.add_node(Op::Conv2d, "c1", {which == 1 ? x2 : x, g.add_constant("w1", random_tensor({4, 4, 1, 1}, rng))},
                             conv_attrs(1, 0));
    ASSERT_EQ(g.values[a].shape, g.values[b].shape);
    g.mark_output(g.add_node(Op::Add, "sum", {a, b}));
    EXPECT_EQ(fold_parallel_convs(g), 0) << which;
  }
}

// merge_parallel_linears: q_proj and k_proj of one input, read by an
// attention, become one linear and two slices named as the linears, with the
// same numbers on the CPU; a linear with an activation or one read by
// anything but attention / ms_deform_attn stays; linears group by input.
TEST(Passes, MergeParallelLinearsJoinsProjectionsOfOneInput) {
  std::mt19937 rng(11);
  auto build = [&](int variant) {
    Graph g;
    const int x = g.add_input("x", DType::F32, {2, 5, 8});
    const int qk_in = g.add_node(Op::Add, "pos_add", {x, g.add_input("pos", DType::F32, {2, 5, 8})});
    auto linear = [&](const std::string& name, int in, Attrs a = {}) {
      return g.add_node(Op::Linear, name, {in, g.add_constant(name + ".weight", random_tensor({8, 8}, rng)),
                                           g.add_constant(name + ".bias", random_tensor({8}, rng))}, a);
    };
    const int q = linear("attn.q_proj", qk_in);
    Attrs act;
    if (variant == 1) act["activation"] = std::string("relu");
    const int k = linear("attn.k_proj", variant == 3 ? x : qk_in, act);
    const int v = linear("attn.v_proj", x);
    const int att = g.add_node(Op::Attention, "attn.attention", {q, k, v}, {{"heads", int64_t{2}}, {"scale", 0.5}});
    g.mark_output(att);
    if (variant == 2) g.mark_output(g.add_node(Op::Activation, "k.relu", {k}, {{"activation", std::string("relu")}}));
    return g;
  };
  Graph g = build(0);
  const std::vector<float> x = input_for(g, rng), pos = x;
  const auto before = run_cpu(g, {x, pos});
  EXPECT_EQ(merge_parallel_linears(g), 2);
  verify_graph(g, "merge_parallel_linears");
  EXPECT_EQ(g.count_ops(Op::Linear), 2);  // {q_proj,k_proj} and v_proj
  EXPECT_EQ(g.count_ops(Op::Slice), 2);
  const Node* merged = g.find_node("attn.{q_proj,k_proj}");
  ASSERT_NE(merged, nullptr);
  EXPECT_EQ(g.values[merged->inputs[1]].shape, (Shape{16, 8}));
  for (const char* name : {"attn.q_proj", "attn.k_proj"}) {
    const Node* s = g.find_node(name);
    ASSERT_NE(s, nullptr) << name;
    EXPECT_EQ(s->op, Op::Slice) << name;
    EXPECT_EQ(s->inputs[0], merged->outputs[0]) << name;
  }
  const auto after = run_cpu(g, {x, pos});
  EXPECT_LT(max_abs_diff(after[0], before[0]), 1e-6f * std::max(1.f, max_abs(before[0])));
  EXPECT_EQ(merge_parallel_linears(g), 0) << "idempotent";
  for (int variant : {1, 2}) {  // k with an activation; k also read by a relu
    Graph h = build(variant);
    EXPECT_EQ(merge_parallel_linears(h), 0) << variant;
  }
  Graph h = build(3);  // k of x: k and v merge, q stays
  EXPECT_EQ(merge_parallel_linears(h), 2);
  EXPECT_NE(h.find_node("attn.{k_proj,v_proj}"), nullptr);
  EXPECT_EQ(h.find_node("attn.q_proj")->op, Op::Linear);
}

TEST(Passes, FoldBatchNormKeepsNumbersAndRemovesBn) {
  for (bool bias : {false, true}) {
    std::mt19937 rng(1);
    Graph g = residual_block(rng, bias);
    auto x = input_for(g, rng);
    auto before = run_cpu(g, {x})[0];
    EXPECT_EQ(fold_batchnorm(g), 3);
    g.canonicalize();
    verify_graph(g, "fold_batchnorm");
    EXPECT_EQ(g.count_ops(Op::BatchNorm), 0);
    EXPECT_EQ(g.count_ops(Op::Conv2d), 3);
    auto after = run_cpu(g, {x})[0];
    EXPECT_LE(max_abs_diff(before, after), 1e-5f * std::max(1.f, max_abs(before)));
  }
}

TEST(Passes, FoldBatchNormSkipsSharedConvOutput) {
  std::mt19937 rng(2);
  Graph g;
  int x = g.add_input("x", DType::F32, {1, 3, 5, 5});
  int c = g.add_node(Op::Conv2d, "c", {x, g.add_constant("w", random_tensor({4, 3, 1, 1}, rng))}, conv_attrs(1, 0));
  int bn = add_bn(g, "bn", c, 4, rng);
  g.mark_output(bn);
  g.mark_output(c);  // the raw conv output is read elsewhere: folding would change it
  EXPECT_EQ(fold_batchnorm(g), 0);
  EXPECT_EQ(g.count_ops(Op::BatchNorm), 1);
}

TEST(Passes, FuseActivationAndResidualGiveOneConvPerLayer) {
  std::mt19937 rng(3);
  Graph g = residual_block(rng, false);
  auto x = input_for(g, rng);
  auto before = run_cpu(g, {x})[0];
  fold_batchnorm(g);
  EXPECT_EQ(fuse_activation(g), 2);  // a1 into c1, a2 into add
  g.canonicalize();
  verify_graph(g, "fuse_activation");
  EXPECT_EQ(g.count_ops(Op::Activation), 0);
  auto mid = run_cpu(g, {x})[0];
  EXPECT_LE(max_abs_diff(before, mid), 1e-5f * std::max(1.f, max_abs(before)));
  EXPECT_EQ(fuse_residual_add(g), 1);
  g.canonicalize();
  verify_graph(g, "fuse_residual_add");
  EXPECT_EQ(g.count_ops(Op::Add), 0);
  ASSERT_EQ(g.nodes.size(), 3u);
  const Node* c2 = g.find_node("c2");
  ASSERT_NE(c2, nullptr);
  EXPECT_EQ(c2->inputs.size(), 4u);  // x, w, bias, residual
  EXPECT_EQ(c2->activation(), Activation::Relu);
  auto after = run_cpu(g, {x})[0];
  EXPECT_LE(max_abs_diff(before, after), 1e-5f * std::max(1.f, max_abs(before)));
}

TEST(Passes, ResidualNotFusedIntoConvWithActivation) {
  // add(relu(conv(x)), x) must keep the add: relu(conv)+x != relu-free fusion.
  std::mt19937 rng(4);
  Graph g;
  int x = g.add_input("x", DType::F32, {1, 4, 6, 6});
  int c = g.add_node(Op::Conv2d, "c", {x, g.add_constant("w", random_tensor({4, 4, 3, 3}, rng))}, conv_attrs(1, 1));
  int r = relu(g, "r", c);
  g.mark_output(g.add_node(Op::Add, "add", {r, x}));
  auto in = input_for(g, rng);
  auto before = run_cpu(g, {in})[0];
  fuse_activation(g);
  EXPECT_EQ(fuse_residual_add(g), 0);
  EXPECT_EQ(g.count_ops(Op::Add), 1);
  EXPECT_LE(max_abs_diff(before, run_cpu(g, {in})[0]), 1e-6f);
}

// A Res2Net block after BN folding: 1x1 conv (4 chunks of 6 channels, ReLU),
// slices, 3x3 convs chained by adds (or, for a first block, independent with
// stride 2 and a pooled pass-through chunk), concat, 1x1 conv.
Graph res2net_like_block(std::mt19937& rng, bool first, const std::string& root_act = "relu") {
  const int64_t w = 6, scale = 4, cin = 5, cout = 16, stride = first ? 2 : 1;
  Graph g;
  int x = g.add_input("x", DType::F32, {2, cin, 9, 9});
  auto conv = [&](const std::string& name, int in, int64_t k, int64_t c, int64_t r, int64_t st, const std::string& act) {
    Attrs a = conv_attrs(int(st), int(r / 2));
    if (!act.empty()) a["activation"] = act;
    return g.add_node(Op::Conv2d, name,
                      {in, g.add_constant(name + ".weight", random_tensor({k, c, r, r}, rng)),
                       g.add_constant(name + ".bias", random_tensor({k}, rng))},
                      a);
  };
  int y1 = conv("conv1", x, w * scale, cin, 1, 1, root_act);
  std::vector<int> spx, spo;
  for (int64_t k = 0; k < scale; ++k)
    spx.push_back(g.add_node(Op::Slice, cat("split.", k), {y1}, {{"axis", int64_t{1}}, {"start", k * w}, {"end", (k + 1) * w}}));
  int sp = -1;
  for (int64_t i = 0; i < scale - 1; ++i) {
    sp = (i == 0 || first) ? spx[i] : g.add_node(Op::Add, cat("chain.", i), {sp, spx[i]});
    sp = conv(cat("convs.", i), sp, w, w, 3, stride, "relu");
    spo.push_back(sp);
  }
  int last = spx.back();
  if (first)
    last = g.add_node(Op::AvgPool2d, "pool", {last},
                      {{"kernel", std::vector<int64_t>{3, 3}}, {"strides", std::vector<int64_t>{2, 2}},
                       {"pads", std::vector<int64_t>{1, 1, 1, 1}}, {"ceil_mode", int64_t{0}}, {"count_include_pad", int64_t{1}}});
  spo.push_back(last);
  int c = g.add_node(Op::Concat, "cat", spo, {{"axis", int64_t{1}}});
  g.mark_output(conv("conv3", c, cout, w * scale, 1, 1, "relu"));
  return g;
}

TEST(Passes, PadChannelsWidensRes2NetChunksExactly) {
  for (bool first : {false, true}) {
    std::mt19937 rng(first ? 21 : 22);
    Graph g = res2net_like_block(rng, first);
    auto x = input_for(g, rng);
    auto before = run_cpu(g, {x})[0];
    EXPECT_EQ(pad_channels(g, 8), 1);
    g.canonicalize();
    verify_graph(g, "pad_channels");
    // Chunks of 6 are stored in 8 channels; the block's output is unchanged.
    EXPECT_EQ(g.values[g.find_node("conv1")->inputs[1]].shape, (Shape{32, 5, 1, 1}));
    EXPECT_EQ(g.find_node("split.2")->attr_int("start"), 16);
    EXPECT_EQ(g.find_node("split.2")->attr_int("end"), 24);
    EXPECT_EQ(g.values[g.find_node("convs.1")->inputs[1]].shape, (Shape{8, 8, 3, 3}));
    EXPECT_EQ(g.values[g.find_node("conv3")->inputs[1]].shape, (Shape{16, 32, 1, 1}));
    EXPECT_EQ(g.values[g.find_node("cat")->outputs[0]].shape[1], 32);
    EXPECT_EQ(g.values[g.outputs[0]].shape[1], 16);
    auto after = run_cpu(g, {x})[0];
    EXPECT_LE(max_abs_diff(before, after), 1e-5f * std::max(1.f, max_abs(before)));
    EXPECT_EQ(pad_channels(g, 8), 0);  // already aligned: nothing left to do
  }
}

TEST(Passes, PadChannelsLeavesUnsafeOrAlignedGraphsAlone) {
  {
    std::mt19937 rng(23);
    Graph g = res2net_like_block(rng, false, "sigmoid");  // sigmoid(0) != 0: padded channels would not be zero
    EXPECT_EQ(pad_channels(g, 8), 0);
  }
  {
    std::mt19937 rng(24);
    Graph g = res2net_like_block(rng, false);
    g.mark_output(g.find_node("split.3")->outputs[0]);  // a chunk is read outside: its width must stay
    EXPECT_EQ(pad_channels(g, 8), 0);
    EXPECT_EQ(g.values[g.find_node("conv1")->inputs[1]].shape[0], 24);
  }
  {
    std::mt19937 rng(25);
    Graph g = res2net_like_block(rng, true);
    EXPECT_EQ(pad_channels(g, 2), 0);  // 6 is a multiple of 2
    EXPECT_EQ(pad_channels(g, 1), 0);
  }
}

// A quantized conv (8-bit input, 8-bit weights with per-output-channel
// scales) is neither padded nor read through padded channels: its weight and
// output scales are per real channel. The block around it stays as it is.
// An 8-bit conv anywhere in the block (the root conv1, a chunk conv behind
// its per-tensor quantize, conv3 behind the concat's quantize) pads like a
// wide one: zero codes in the padded rows and columns, weight scale 1 for a
// padded output channel. The CPU backend gives the same outputs before and
// after (within the f32 layers' summation order).
TEST(Passes, PadChannelsPadsQuantizedConvs) {
  for (DType code : {DType::F8E4M3, DType::I8})
  for (const char* layer : {"conv1", "convs.1", "conv3"}) {
    SCOPED_TRACE(std::string(layer) + " " + dtype_name(code));
    std::mt19937 rng(26);
    Graph g = res2net_like_block(rng, false);
    quant::ActivationScales scales;
    scales.precision = code;
    const int x = g.find_node(layer)->inputs[0];
    scales.amax[g.values[x].name] = 4.f;
    const int ni = static_cast<int>(g.find_node(layer) - g.nodes.data());
    ASSERT_GT(quantize_layers(g, {ni}, scales), 0);
    ASSERT_TRUE(is_quantized_layer(g, *g.find_node(layer)));
    const auto in = input_for(g, rng);
    const auto before = run_cpu(g, {in})[0];
    const Value w_before = g.values[g.find_node(layer)->inputs[1]];
    EXPECT_EQ(pad_channels(g, 8), 1);
    verify_graph(g, "pad_channels");
    EXPECT_EQ(g.find_node("split.2")->attr_int("start"), 16) << "the chunks (6 -> 8 channels) were not padded";
    const Value& w = g.values[g.find_node(layer)->inputs[1]];
    EXPECT_EQ(w.dtype, w_before.dtype);
    ASSERT_TRUE(w.quant);
    EXPECT_EQ(w.quant->axis, 0);
    EXPECT_EQ(static_cast<int64_t>(w.quant->scales.size()), w.shape[0]);
    EXPECT_NE(w.shape, w_before.shape);
    // The 8-bit layer's sum is exact either way; the f32 convs around it sum in another order.
    EXPECT_LE(max_abs_diff(before, run_cpu(g, {in})[0]), 1e-5f * std::max(1.f, max_abs(before)));
  }
}

// Quantizes every conv of g, max calibration on `in` (8-bit residuals, the recipe default).
void quantize_convs(Graph& g, DType code, const std::vector<float>& in) {
  std::vector<int> convs;
  for (size_t i = 0; i < g.nodes.size(); ++i)
    if (g.nodes[i].op == Op::Conv2d) convs.push_back(static_cast<int>(i));
  testing::quantize_calibrated_on(g, convs, code, in);
}

// The quantize pass folds a quantize into the 16-bit producer it follows
// (passes/quantize.cpp fold_into_producers): in a Res2Net block with every
// conv 8-bit, the chunk slices, the chain adds and the concat write codes,
// only the graph input keeps a quantize; the CPU backend and
// the plain reference give the same bits on the folded graph, and it stays
// close to the float block. Not folded: a producer with a second reader, an
// add with an activation other than ReLU, an avg pool.
TEST(Passes, QuantizeFoldsIntoCodeWritingProducers) {
  for (DType code : {DType::F8E4M3, DType::I8})
    for (bool first : {false, true}) {
      SCOPED_TRACE(std::string(dtype_name(code)) + (first ? " first block" : " chain block"));
      std::mt19937 rng(first ? 31 : 32);
      Graph g = res2net_like_block(rng, first);
      const auto in = input_for(g, rng);
      const auto wide = run_cpu(g, {in})[0];
      quantize_convs(g, code, in);
      verify_graph(g, "quantize");
      const auto writes = [&](const char* name) {
        const Node* n = g.find_node(name);
        return n && writes_codes(g, *n) && g.values[n->outputs[0]].dtype == code;
      };
      EXPECT_TRUE(writes("cat"));
      EXPECT_TRUE(writes("split.0"));
      EXPECT_EQ(writes("split.1"), first);  // a chain block's chunk 1 is read by its chain add (wide)
      if (!first) EXPECT_TRUE(writes("chain.1") && writes("chain.2"));
      std::vector<std::string> quantized_values;
      for (const Node& n : g.nodes)
        if (n.op == Op::Quantize) quantized_values.push_back(g.values[n.inputs[0]].name);
      EXPECT_EQ(quantized_values, std::vector<std::string>{"x"});
      const auto cpu = run_cpu(g, {in})[0];
      const auto ref = ref::run_reference_graph(g, {in})[0];
      ASSERT_EQ(cpu.size(), ref.size());
      size_t apart = 0;
      for (size_t i = 0; i < cpu.size(); ++i) apart += cpu[i] != ref[i];
      EXPECT_EQ(apart, 0u) << "the CPU backend and the reference disagree on the folded graph";
      EXPECT_LE(max_abs_diff(wide, cpu), 0.2f * max_abs(wide));
    }
  // Not folded: maxpool also a graph output; add with SiLU; avg pool.
  std::mt19937 rng(33);
  Graph g;
  const int x = g.add_input("x", DType::F32, {1, 8, 8, 8});
  const int pool = g.add_node(Op::MaxPool2d, "maxpool", {x}, {{"kernel", std::vector<int64_t>{2, 2}}, {"strides", std::vector<int64_t>{2, 2}}});
  const int avg = g.add_node(Op::AvgPool2d, "avgpool", {x}, {{"kernel", std::vector<int64_t>{2, 2}}, {"strides", std::vector<int64_t>{2, 2}}});
  const int sum = g.add_node(Op::Add, "sum", {pool, avg}, {{"activation", std::string("silu")}});
  const auto conv1x1 = [&](const std::string& name, int in) {
    return g.add_node(Op::Conv2d, name, {in, g.add_constant(name + ".weight", random_tensor({8, 8, 1, 1}, rng))}, conv_attrs(1, 0));
  };
  g.mark_output(pool);
  g.mark_output(conv1x1("a", pool));
  g.mark_output(conv1x1("b", avg));
  g.mark_output(conv1x1("c", sum));
  std::vector<int> convs;
  for (const char* n : {"a", "b", "c"}) convs.push_back(static_cast<int>(g.find_node(n) - g.nodes.data()));
  quant::ActivationScales scales;
  for (const char* v : {"maxpool", "avgpool", "sum", "a", "b", "c"}) scales.amax[v] = 2.f;
  quantize_layers(g, convs, scales);
  verify_graph(g, "quantize");
  EXPECT_EQ(g.count_ops(Op::Quantize), 3);
  for (const Node& n : g.nodes) EXPECT_FALSE(writes_codes(g, n)) << n.name;
}

// 8-bit residual chains (EfficientNet's 24-wide stage in small): stage.0's
// project conv writes 24 channels of codes, stage.1 reads them as x and adds
// them as its project conv's residual, the next stage's expand conv reads
// that. pad_channels(g, 8, 16) widens both 24-channel values to 32 (zero
// rows, weight scale 1, zero columns in every reader), the outputs stay the
// same bits; with align_8bit off, or a 16-bit graph, nothing changes.
TEST(Passes, PadChannelsWidensEightBitResidualChains) {
  for (DType code : {DType::F8E4M3, DType::I8}) {
    SCOPED_TRACE(dtype_name(code));
    std::mt19937 rng(41);
    Graph g;
    const int x = g.add_input("x", DType::F32, {2, 16, 5, 6});
    auto conv = [&](const std::string& name, int in, int64_t k, int64_t c, int residual, const char* act) {
      std::vector<int> ins{in, g.add_constant(name + ".weight", random_tensor({k, c, 1, 1}, rng, -0.3f, 0.3f)),
                           g.add_constant(name + ".bias", random_tensor({k}, rng, -0.2f, 0.2f))};
      if (residual >= 0) ins.push_back(residual);
      Attrs a = conv_attrs(1, 0);
      if (act) a["activation"] = std::string(act);
      return g.add_node(Op::Conv2d, name, ins, a);
    };
    const int a = conv("stage.0.pwl", x, 24, 16, -1, nullptr);
    const int b = conv("stage.1.pw", a, 48, 24, -1, "relu");
    const int c = conv("stage.1.pwl", b, 24, 48, a, nullptr);
    g.mark_output(conv("next.pw", c, 40, 24, -1, "relu"));
    const auto in = input_for(g, rng);
    const Graph wide = g;
    quantize_convs(g, code, in);
    ASSERT_EQ(g.values[g.find_node("stage.0.pwl")->outputs[0]].dtype, code) << "the chain's first value is not codes";
    const auto before = run_cpu(g, {in})[0];
    Graph unpadded = g;
    EXPECT_EQ(pad_channels(unpadded, 8), 0) << "align_8bit off: 24 is a multiple of 8";
    Graph w16 = wide;
    EXPECT_EQ(pad_channels(w16, 8, 16), 0) << "a 16-bit graph roots no 8-bit chain";
    EXPECT_EQ(pad_channels(g, 8, 16), 1);
    verify_graph(g, "pad_channels");
    for (const char* n : {"stage.0.pwl", "stage.1.pwl"}) EXPECT_EQ(g.values[g.find_node(n)->outputs[0]].shape[1], 32) << n;
    EXPECT_EQ(g.values[g.find_node("stage.1.pw")->inputs[1]].shape[1], 32);
    EXPECT_EQ(g.values[g.find_node("next.pw")->inputs[1]].shape[1], 32);
    EXPECT_EQ(g.values[g.outputs[0]].shape[1], 40);
    const auto after = run_cpu(g, {in})[0];
    ASSERT_EQ(before.size(), after.size());
    EXPECT_EQ(max_abs_diff(before, after), 0.f) << "padding changed the 8-bit sums";
  }
}

TEST(Passes, EliminateDeadNodes) {
  std::mt19937 rng(5);
  Graph g;
  int x = g.add_input("x", DType::F32, {1, 4, 6, 6});
  int c = g.add_node(Op::Conv2d, "c", {x, g.add_constant("w", random_tensor({4, 4, 3, 3}, rng))}, conv_attrs(1, 1));
  int dead1 = relu(g, "dead1", c);
  relu(g, "dead2", dead1);
  g.mark_output(relu(g, "live", c));
  auto in = input_for(g, rng);
  auto before = run_cpu(g, {in})[0];
  EXPECT_EQ(eliminate_dead_nodes(g), 2);
  verify_graph(g, "eliminate_dead_nodes");
  EXPECT_EQ(g.nodes.size(), 2u);
  EXPECT_EQ(g.find_node("dead1"), nullptr);
  EXPECT_LE(max_abs_diff(before, run_cpu(g, {in})[0]), 0.f);
}

TEST(Passes, FullPipelineFp16MatchesWithinHalfPrecision) {
  std::mt19937 rng(6);
  Graph g = residual_block(rng, true);
  auto x = input_for(g, rng);
  auto ref = run_cpu(g, {x})[0];
  PipelineOptions o;
  o.precision = DType::F16;
  o.verify = true;
  run_pipeline(g, o);
  EXPECT_EQ(g.count_ops(Op::Cast), 2);
  EXPECT_EQ(g.values[g.inputs[0]].dtype, DType::F32);
  EXPECT_EQ(g.values[g.outputs[0]].dtype, DType::F32);
  for (const auto& v : g.values)
    if (v.constant) {
      EXPECT_EQ(v.dtype, DType::F16) << v.name;
    }
  auto out = run_cpu(g, {x})[0];
  EXPECT_GE(testing::cosine(ref, out), 0.999);
  EXPECT_LE(max_abs_diff(ref, out), 1e-2f * std::max(1.f, max_abs(ref)));
  // fp16 storage is really emulated: every output value is representable in fp16.
  for (float v : out) EXPECT_EQ(v, round_f16(v));
}

// f32 islands (precision = "f32" on a node): outputs and island-only
// constants stay f32, a constant shared with 16-bit nodes is copied, Casts
// sit exactly where values cross, and fusions do not join across the border.
TEST(Passes, Fp16KeepsF32IslandsAndCastsAtTheirBorders) {
  const auto build = [](bool islands) {
    std::mt19937 rng(8);
    Graph g;
    const int x = g.add_input("x", DType::F32, {2, 8});
    const int w = g.add_constant("w", random_tensor({8, 8}, rng, -0.5f, 0.5f));
    const int big = g.add_constant("big", HostTensor::from_f32({2, 8}, std::vector<float>(16, 70000.f)));  // > fp16 max
    const Attrs f32{{"precision", std::string("f32")}};
    const int a = g.add_node(Op::Linear, "a", {x, w});
    const int k = g.add_node(Op::Linear, "k", {x, w}, islands ? f32 : Attrs{});
    const int s = g.add_node(Op::Add, "s", {k, big}, islands ? f32 : Attrs{});
    const int d = g.add_node(Op::Add, "d", {s, a}, islands ? f32 : Attrs{});
    const int t = g.add_node(Op::Add, "t", {k, k}, islands ? f32 : Attrs{});
    const int r = relu(g, "r", t);
    g.values[d].name = "wide";
    g.values[r].name = "narrow";
    g.mark_output(d);
    g.mark_output(r);
    return g;
  };
  std::mt19937 rng(9);
  const std::vector<float> x = random_tensor({2, 8}, rng, -1.f, 1.f).to_f32();
  Graph g = build(true);
  const auto ref = run_cpu(g, {x});
  PipelineOptions o;
  o.precision = DType::F16;
  o.verify = true;
  run_pipeline(g, o);
  const auto out = run_cpu(g, {x});
  const auto dtype_of = [&](const std::string& node) { return g.values[g.find_node(node)->outputs[0]].dtype; };
  EXPECT_EQ(dtype_of("a"), DType::F16);
  for (const char* n : {"k", "s", "d", "t"}) EXPECT_EQ(dtype_of(n), DType::F32) << n;
  ASSERT_NE(g.find_node("r"), nullptr);  // relu is 16-bit: not fused into the f32 add t
  EXPECT_EQ(dtype_of("r"), DType::F16);
  // The shared weight: f16 for a, an f32 copy for k; the island-only constant stays f32.
  const auto input_of = [&](const std::string& node, size_t i) -> const Value& {
    return g.values[g.find_node(node)->inputs.at(i)];
  };
  EXPECT_EQ(input_of("a", 1).dtype, DType::F16);
  EXPECT_EQ(input_of("k", 1).dtype, DType::F32);
  EXPECT_EQ(input_of("k", 1).name, "w.f32");
  EXPECT_EQ(input_of("s", 1).dtype, DType::F32);
  EXPECT_EQ(input_of("k", 0).name, "x");  // the island reads the f32 input itself
  // Casts: x for a, a into d, t into r, r's output back to f32; d leaves as f32.
  EXPECT_EQ(g.count_ops(Op::Cast), 4);
  ASSERT_EQ(out.size(), 2u);
  for (size_t i = 0; i < ref[0].size(); ++i) {
    ASSERT_TRUE(std::isfinite(out[0][i])) << i;
    EXPECT_NEAR(out[0][i], ref[0][i], 2e-2f) << i;  // a's fp16 rounding, then f32 rounding near 7e4 (ulp 0.0078)
  }
  EXPECT_LE(max_abs_diff(ref[1], out[1]), 1e-2f);
  // Without the islands the same graph overflows fp16 (the test can fail).
  Graph plain = build(false);
  run_pipeline(plain, o);
  EXPECT_EQ(plain.count_ops(Op::Cast), 3);
  EXPECT_TRUE(std::isinf(run_cpu(plain, {x})[0][0]));
}

TEST(Passes, NodeNamesSurvive) {
  std::mt19937 rng(7);
  Graph g = residual_block(rng, false);
  run_pipeline(g, {});
  for (const char* name : {"c1", "c2", "down"}) EXPECT_NE(g.find_node(name), nullptr) << name;
}

}  // namespace
}  // namespace kiln
