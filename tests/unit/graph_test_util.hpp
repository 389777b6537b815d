// Helpers for tests that build small graphs in code and run them on the CPU
// reference backend.
#pragma once
#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/cpu_backend.hpp"
#include "backends/cpu/cpu_engine.hpp"
#include "core/error.hpp"
#include "ir/graph.hpp"
#include "passes/pass.hpp"
#include "quant/calibrate.hpp"
#include "runtime/memory_planner.hpp"

namespace kiln::testing {

inline HostTensor random_tensor(const Shape& shape, std::mt19937& rng, float lo = -1.f, float hi = 1.f) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(static_cast<size_t>(shape_numel(shape)));
  for (auto& x : v) x = d(rng);
  return HostTensor::from_f32(shape, v);
}

// Copies `inputs` into the arena at the plan's offsets, calls `run`, and
// returns every graph output as f32.
inline std::vector<std::vector<float>> run_in_arena(const Graph& g, const MemoryPlan& plan, std::vector<float>& arena,
                                                    const std::vector<std::vector<float>>& inputs,
                                                    const std::function<void()>& run) {
  for (size_t i = 0; i < g.inputs.size(); ++i) std::copy(inputs[i].begin(), inputs[i].end(), arena.data() + plan.offsets[g.inputs[i]] / 4);
  run();
  std::vector<std::vector<float>> out;
  for (int o : g.outputs) {
    const float* p = arena.data() + plan.offsets[o] / 4;
    out.emplace_back(p, p + shape_numel(g.values[o].shape));
  }
  return out;
}

// Runs the graph on the CPU backend; returns every graph output as f32.
inline std::vector<std::vector<float>> run_cpu(const Graph& g, const std::vector<std::vector<float>>& inputs) {
  cpu::CpuProgram prog(g);
  MemoryPlan plan = plan_memory(g, cpu::activation_bytes);
  std::vector<float> arena(plan.arena_bytes / sizeof(float) + 1);
  return run_in_arena(g, plan, arena, inputs, [&] { prog.run(g, plan, arena.data(), cpu::default_pool()); });
}

// Quantizes layers `nodes` of g (quantize_layers, 8-bit residuals) with max
// calibration on the one input `in`: what a build does with one image.
inline int quantize_calibrated_on(Graph& g, const std::vector<int>& nodes, DType code, const std::vector<float>& in) {
  quant::CalibrationData data;
  data.batches = 1;
  data.batch = [&](int64_t) { return std::vector<std::vector<float>>{in}; };
  return quantize_layers(g, nodes, quant::calibrate(g, nodes, code, quant::CalibSettings{}, data));
}

// Runs the graph as an engine context does: plan_for_batch's memory plan with
// the channel views of the graph's marks and its fused adds. The arena starts
// as NaN, so an output nothing writes cannot pass. `plan` receives the plan.
inline std::vector<std::vector<float>> run_cpu_planned(const Graph& g, const std::vector<std::vector<float>>& inputs,
                                                       ShapedPlan* plan = nullptr) {
  ShapedPlan p = plan_for_batch(g, g.values[g.inputs.at(0)].shape.at(0));
  cpu::CpuProgram prog(p.graph);
  std::vector<float> arena(p.memory.arena_bytes / sizeof(float) + 1, NAN);
  auto out = run_in_arena(p.graph, p.memory, arena, inputs,
                          [&] { prog.run(p.graph, p.memory, arena.data(), cpu::default_pool(), p.layout()); });
  if (plan) *plan = std::move(p);
  return out;
}

// The message of the kiln::Error f throws, "(no error)" when it throws none.
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// NaN when any difference is NaN (std::max would drop it), so a value never
// written (a NaN-filled arena) cannot pass a tolerance check.
inline float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  float m = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const float d = std::fabs(a[i] - b[i]);
    if (!(d <= m)) m = d;
  }
  return a.size() == b.size() ? m : INFINITY;
}

inline float max_abs(const std::vector<float>& a) {
  float m = 0;
  for (float x : a) m = std::max(m, std::fabs(x));
  return m;
}

inline double cosine(const std::vector<float>& a, const std::vector<float>& b) {
  double ab = 0, aa = 0, bb = 0;
  for (size_t i = 0; i < a.size(); ++i) ab += double(a[i]) * b[i], aa += double(a[i]) * a[i], bb += double(b[i]) * b[i];
  return ab / std::sqrt(aa * bb + 1e-30);
}

}  // namespace kiln::testing
