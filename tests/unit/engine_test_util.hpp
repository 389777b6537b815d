// A two-input, two-output engine built in code (no checkpoint, no family),
// as bundle bytes for Engine::load_from_memory, and the plain computation it
// must match. Shared by the CPU suite (test_tensor_views.cpp) and the GPU one.
//
//   a, b: [N, 24, 3, 3]
//   sum    = relu(a + b)                                          [N, 24, 3, 3]
//   logits = fc(global_avg_pool(a)) = W * mean_hw(a) + bias      [N, 10]
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bundle/bundle.hpp"
#include "core/error.hpp"
#include "graph_test_util.hpp"
#include "ir/graph.hpp"
#include "ir/serialize.hpp"

namespace kiln::testing {

constexpr int64_t kViewC = 24, kViewHW = 3, kViewClasses = 10;

struct TwoByTwo {
  Graph graph;
  std::vector<float> w, bias;  // fc weights [10, 24] and bias [10]
};

inline TwoByTwo two_by_two_graph(int64_t batch = 2) {
  std::mt19937 rng(7);
  TwoByTwo t;
  Graph& g = t.graph;
  const int a = g.add_input("a", DType::F32, {batch, kViewC, kViewHW, kViewHW});
  const int b = g.add_input("b", DType::F32, {batch, kViewC, kViewHW, kViewHW});
  g.mark_output(g.add_node(Op::Add, "sum", {a, b}, {{"activation", std::string("relu")}}));
  const HostTensor w = random_tensor({kViewClasses, kViewC}, rng, -0.3f, 0.3f), bias = random_tensor({kViewClasses}, rng);
  t.w = w.to_f32();
  t.bias = bias.to_f32();
  int y = g.add_node(Op::GlobalAvgPool, "pool", {a});
  y = g.add_node(Op::Flatten, "flatten", {y});
  g.mark_output(g.add_node(Op::Linear, "logits", {y, g.add_constant("fc.weight", w), g.add_constant("fc.bias", bias)}));
  return t;
}

// The graph as a bundle for `backend` (max batch 4).
inline std::vector<uint8_t> bundle_bytes(const Graph& g, const std::string& backend) {
  SerializedGraph sg = serialize_graph(g);
  BundleWriter w(BundleInfo{kBundleFormat, KILN_VERSION, "test", "classification", backend});
  w.add_section("graph.json", sg.graph_json);
  w.add_section("weights.bin", std::move(sg.weights));
  const nlohmann::json runtime = {
      {"task", "classification"}, {"input", "a"}, {"output", "logits"}, {"num_classes", kViewClasses},
      {"preprocess", {{"kind", "timm_eval"}, {"height", kViewHW}, {"width", kViewHW}, {"crop_pct", 1.0},
                      {"crop_mode", "center"}, {"interpolation", "bilinear"}, {"mean", {0.5, 0.5, 0.5}},
                      {"std", {0.5, 0.5, 0.5}}}}};
  w.add_section("runtime.json", runtime.dump());
  w.add_section("labels.json", std::string("[]"));
  w.add_section("provenance.json", nlohmann::json{{"build", {{"backend", backend}, {"max_batch", 4}}}}.dump());
  return w.to_bytes();
}

// n values uniform in [-2, 2).
inline std::vector<float> random_values(size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-2.f, 2.f);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// Runs `call` and returns the Error it throws (or fails the test).
template <typename F>
Error error_of(F&& call) {
  try {
    call();
  } catch (const Error& e) {
    return e;
  }
  ADD_FAILURE() << "no error";
  return Error(ErrorKind::Runtime, "");
}

// sum and logits computed plainly from a and b (NCHW, batch n).
inline std::vector<std::vector<float>> two_by_two_reference(const TwoByTwo& t, const std::vector<float>& a,
                                                            const std::vector<float>& b, int64_t n) {
  std::vector<float> sum(a.size()), logits(static_cast<size_t>(n * kViewClasses));
  for (size_t i = 0; i < a.size(); ++i) sum[i] = std::max(0.f, a[i] + b[i]);
  const int64_t hw = kViewHW * kViewHW;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t k = 0; k < kViewClasses; ++k) {
      double acc = t.bias[k];
      for (int64_t c = 0; c < kViewC; ++c) {
        double mean = 0;
        for (int64_t p = 0; p < hw; ++p) mean += a[(i * kViewC + c) * hw + p];
        acc += t.w[k * kViewC + c] * (mean / hw);
      }
      logits[i * kViewClasses + k] = static_cast<float>(acc);
    }
  return {sum, logits};
}

}  // namespace kiln::testing
