// Use-lists, multi-output nodes, dtypes/ranks and quantization parameters in
// the IR (issue 10): the machinery below the op table, tested directly.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>

#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "graph_test_util.hpp"
#include "ir/printer.hpp"
#include "ir/serialize.hpp"
#include "ir/verifier.hpp"

namespace kiln {
namespace {

using testing::error_of;
using testing::random_tensor;

Graph two_readers(std::mt19937& rng) {
  Graph g;
  int x = g.add_input("x", DType::F32, {1, 2, 3, 3});
  int a = g.add_node(Op::Activation, "a", {x}, {{"activation", std::string("relu")}});
  g.add_node(Op::Add, "b", {a, a});  // reads `a` twice: listed once
  int c = g.add_node(Op::Conv2d, "c", {a, g.add_constant("w", random_tensor({2, 2, 1, 1}, rng))});
  g.mark_output(c);
  return g;
}

TEST(UseList, ConsumersFollowEdits) {
  std::mt19937 rng(1);
  Graph g = two_readers(rng);
  const int a = g.nodes[0].outputs[0], x = g.inputs[0];
  EXPECT_EQ(g.consumers(a), (std::vector<int>{1, 2}));
  EXPECT_EQ(g.consumers(x), (std::vector<int>{0}));
  g.set_node_inputs(1, {x, x});  // node b now reads x
  EXPECT_EQ(g.consumers(a), (std::vector<int>{2}));
  EXPECT_EQ(g.consumers(x), (std::vector<int>{0, 1}));
  int n = g.add_node(Op::Activation, "d", {a}, {{"activation", std::string("relu")}});
  EXPECT_EQ(g.consumers(a), (std::vector<int>{2, 3}));
  EXPECT_TRUE(g.consumers(n).empty());
  EXPECT_TRUE(g.uses_are_current());
  verify_graph(g, "edits");
}

TEST(UseList, HandOverDetachesAndCanonicalizeDropsIt) {
  std::mt19937 rng(2);
  Graph g = two_readers(rng);
  const int a = g.nodes[0].outputs[0], b_out = g.nodes[1].outputs[0];
  g.hand_over_outputs(1, 0);  // nonsense semantically; checks the bookkeeping only
  EXPECT_TRUE(g.nodes[1].inputs.empty());
  EXPECT_EQ(g.values[b_out].producer, 0);
  EXPECT_EQ(g.consumers(a), (std::vector<int>{2}));  // b's reads of `a` are gone
  g.canonicalize();
  EXPECT_EQ(g.nodes.size(), 2u);
  EXPECT_EQ(g.find_node("b"), nullptr);
}

TEST(UseList, VerifierCatchesDirectEditWithoutInvalidate) {
  std::mt19937 rng(3);
  Graph g = two_readers(rng);
  (void)g.consumers(0);  // build the cache
  g.nodes[2].inputs[0] = g.inputs[0];  // edited behind the cache's back
  EXPECT_FALSE(g.uses_are_current());
  try {
    verify_graph(g, "test");
    ADD_FAILURE() << "stale use-list accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("stale use-list"), std::string::npos) << e.what();
  }
  g.invalidate_uses();
  EXPECT_TRUE(g.uses_are_current());
  EXPECT_EQ(g.consumers(g.inputs[0]), (std::vector<int>{0, 2}));
}

TEST(IrDtypes, Int8IsADtype) {
  EXPECT_EQ(dtype_from_name("i8"), DType::I8);
  EXPECT_EQ(dtype_from_safetensors("I8"), DType::I8);
  EXPECT_EQ(dtype_size(DType::I8), 1u);
  EXPECT_FALSE(dtype_is_float(DType::I8));
  const std::vector<uint8_t> bytes = {0x80, 0xff, 0x07};
  HostTensor t{DType::I8, {3}, Blob::from_vector(bytes)};
  EXPECT_EQ(t.to_f32(), (std::vector<float>{-128.f, -1.f, 7.f}));
  const std::vector<int32_t> idx = {-5, 0, 1 << 20};
  std::vector<uint8_t> raw(idx.size() * 4);
  std::memcpy(raw.data(), idx.data(), raw.size());
  HostTensor ti{DType::I32, {3}, Blob::from_vector(raw)};
  EXPECT_EQ(ti.to_f32(), (std::vector<float>{-5.f, 0.f, 1048576.f}));
}

TEST(IrDtypes, AnyDtypeAndRankRoundTrips) {
  Graph g;
  for (size_t rank = 0; rank <= kMaxRank; ++rank) {
    const DType t = rank % 2 ? DType::I64 : DType::F8E4M3;
    // Graph inputs carry a batch axis (rank >= 1, the verifier checks it); the
    // rank-0 value is a constant (one f8e4m3 byte).
    int v = rank == 0 ? g.add_constant("in0", HostTensor{t, {}, Blob::from_vector({0x38})})
                      : g.add_input("in" + std::to_string(rank), t, Shape(rank, 2));
    g.mark_output(g.add_node(Op::Activation, "act" + std::to_string(rank), {v}));
  }
  const std::vector<int64_t> codes = {1, -2, 3};
  std::vector<uint8_t> raw(24);
  std::memcpy(raw.data(), codes.data(), 24);
  int c = g.add_constant("indices", HostTensor{DType::I64, {3}, Blob::from_vector(raw)});
  g.mark_output(g.add_node(Op::Slice, "pick", {c}, {{"axis", int64_t{0}}, {"start", int64_t{1}}, {"end", int64_t{3}}}));
  verify_graph(g, "test");
  EXPECT_EQ(g.values[g.outputs[5]].dtype, DType::I64);
  EXPECT_EQ(g.values[g.outputs[5]].shape, Shape(5, 2));
  SerializedGraph s = serialize_graph(g);
  Graph back = deserialize_graph(s.graph_json, Blob::from_vector(s.weights), "graph.json");
  EXPECT_EQ(print_graph(back), print_graph(g));
  EXPECT_EQ(back.values[back.find_node("pick")->inputs[0]].constant->to_f32(), (std::vector<float>{1.f, -2.f, 3.f}));
  EXPECT_NE(print_graph(back).find("f8e4m3[]"), std::string::npos);  // rank 0 prints as []

  auto j = nlohmann::json::parse(s.graph_json);
  for (auto& v : j["values"])
    if (v["name"] == "in1") v["shape"] = std::vector<int64_t>(kMaxRank + 1, 1);
  EXPECT_NE(error_of([&] { deserialize_graph(j.dump(), Blob::from_vector(s.weights), "graph.json"); }).find("in1"),
            std::string::npos);
}

TEST(IrDtypes, ShapeRulesCheckDtypesAndRank) {
  Graph g;
  int a = g.add_input("a", DType::F32, {2, 3});
  int b = g.add_input("b", DType::I32, {2, 3});
  int s = g.add_input("s", DType::F32, {});
  std::string e = error_of([&] { g.add_node(Op::Add, "sum", {a, b}); });
  EXPECT_NE(e.find("sum"), std::string::npos) << e;
  EXPECT_NE(e.find("'b' is i32"), std::string::npos) << e;
  e = error_of([&] { g.add_node(Op::Concat, "cat", {a, b}, {{"axis", int64_t{0}}}); });
  EXPECT_NE(e.find("cat"), std::string::npos) << e;
  e = error_of([&] { g.add_node(Op::Flatten, "flat", {s}); });
  EXPECT_NE(e.find("flat: flatten of rank-0 input 's'"), std::string::npos) << e;
  EXPECT_EQ(g.values[g.add_node(Op::Flatten, "flat1", {g.add_input("v", DType::I64, {4})})].shape, (Shape{4, 1}));
}

Graph quantized_conv(std::mt19937& rng) {
  Graph g;
  int x = g.add_input("x", DType::F32, {1, 2, 3, 3});
  int w = g.add_constant("w", random_tensor({3, 2, 1, 1}, rng));
  g.values[w].quant = QuantParams{{0.5f, 0.25f, 2.f}, 0, DType::F8E4M3};
  g.values[x].quant = QuantParams{{0.125f}, -1, DType::I8};
  g.mark_output(g.add_node(Op::Conv2d, "conv", {x, w}));
  return g;
}

TEST(IrQuant, RoundTripsAndPrints) {
  std::mt19937 rng(4);
  Graph g = quantized_conv(rng);
  verify_graph(g, "test");
  const std::string text = print_graph(g);
  EXPECT_NE(text.find("\"x\" : f32[1,2,3,3] quant(i8, scale 0.125)"), std::string::npos) << text;
  EXPECT_NE(text.find("const @w : f32[3,2,1,1] quant(f8e4m3, axis 0, 3 scales)"), std::string::npos) << text;
  SerializedGraph s = serialize_graph(g);
  Graph back = deserialize_graph(s.graph_json, Blob::from_vector(s.weights), "graph.json");
  ASSERT_TRUE(back.values[back.find_node("conv")->inputs[1]].quant.has_value());
  EXPECT_EQ(*back.values[back.find_node("conv")->inputs[1]].quant, *g.values[g.find_node("conv")->inputs[1]].quant);
  EXPECT_EQ(print_graph(back), text);
}

// graph.json writes each scale as the shortest text that reads back as its
// f32 (core/float_text.hpp): 0.1f as 0.1, not 0.10000000149011612; every
// scale, from the largest f32 to a subnormal, comes back with the same bits.
TEST(IrQuant, ScalesAreWrittenShortAndReadBackExactly) {
  std::mt19937 rng(6);
  Graph g = quantized_conv(rng);
  const std::vector<float> odd = {0.1f, 1.f / 3.f, 3.4028235e38f, 1.4e-45f};
  for (float f : odd) {
    g.values[g.inputs[0]].quant->scales = {f};
    const SerializedGraph s = serialize_graph(g);
    const Graph back = deserialize_graph(s.graph_json, Blob::from_vector(s.weights), "graph.json");
    const float got = back.values[back.inputs[0]].quant->scales.at(0);
    uint32_t a = 0, b = 0;
    std::memcpy(&a, &f, 4), std::memcpy(&b, &got, 4);
    EXPECT_EQ(a, b) << f << " came back as " << got;
  }
  g.values[g.inputs[0]].quant->scales = {0.1f};
  const std::string text = serialize_graph(g).graph_json;
  EXPECT_NE(text.find("[0.1]"), std::string::npos) << text.substr(0, 400);
  EXPECT_EQ(text.find("0.10000000149"), std::string::npos);
}

TEST(IrQuant, StrictReaderAndVerifierNameTheValue) {
  std::mt19937 rng(5);
  Graph g = quantized_conv(rng);
  SerializedGraph s = serialize_graph(g);
  const Blob weights = Blob::from_vector(s.weights);
  auto j = nlohmann::json::parse(s.graph_json);
  int wi = -1;
  for (size_t i = 0; i < j["values"].size(); ++i)
    if (j["values"][i]["name"] == "w") wi = static_cast<int>(i);
  ASSERT_GE(wi, 0);
  auto load_error = [&](const nlohmann::json& bad) {
    return error_of([&] { deserialize_graph(bad.dump(), weights, "graph.json"); });
  };
  auto two = j;
  two["values"][wi]["quant"]["scales"] = {0.5, 0.25};
  EXPECT_NE(load_error(two).find("value 'w': has 2 scales for axis 0 of extent 3"), std::string::npos) << load_error(two);
  auto neg = j;
  neg["values"][wi]["quant"]["scales"][1] = -1.0;
  EXPECT_NE(load_error(neg).find("value 'w': has quantization scale -1"), std::string::npos) << load_error(neg);
  auto axis = j;
  axis["values"][wi]["quant"]["axis"] = 4;
  EXPECT_NE(load_error(axis).find("value 'w': has quantization axis 4"), std::string::npos) << load_error(axis);
  auto dt = j;
  dt["values"][wi]["quant"]["dtype"] = "f7";
  EXPECT_NE(load_error(dt).find("value 'w': unknown quant dtype"), std::string::npos) << load_error(dt);
  auto missing = j;
  missing["values"][wi]["quant"].erase("axis");
  EXPECT_NE(load_error(missing).find("missing key 'axis'"), std::string::npos) << load_error(missing);

  g.values[g.inputs[0]].quant->scales = {0.1f, 0.2f};  // per-tensor takes one
  std::string e = error_of([&] { verify_graph(g, "test"); });
  EXPECT_NE(e.find("value 'x' has 2 per-tensor scales"), std::string::npos) << e;
  g.values[g.inputs[0]].quant->scales = {std::nanf("")};
  e = error_of([&] { verify_graph(g, "test"); });
  EXPECT_NE(e.find("value 'x' has quantization scale nan"), std::string::npos) << e;
}

}  // namespace
}  // namespace kiln
