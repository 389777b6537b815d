// The harness machinery: graph building, inputs, error measures and the CPU
// backend runner. The case table lives in cases_*.cpp.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <set>

#include "backends/cpu/cpu_backend.hpp"
#include "backends/cpu/thread_pool.hpp"
#include "core/error.hpp"
#include "core/half.hpp"
#include "op_harness.hpp"
#include "runtime/engine_impl.hpp"

namespace kiln::ops {

uint32_t name_seed(const std::string& s) {
  uint32_t h = 2166136261u;  // FNV-1a: stable across runs and platforms, unlike std::hash
  for (unsigned char c : s) h = (h ^ c) * 16777619u;
  return h;
}

std::vector<float> uniform(size_t count, uint32_t seed, float lo, float hi) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(count);
  for (float& x : v) x = d(rng);
  return v;
}

const char* measure_name(Measure m) {
  switch (m) {
    case Measure::Exact: return "exact";
    case Measure::MaxRel: return "max|d|/max|ref|";
    case Measure::ElemRel: return "max |d|/max(1,|ref|)";
    default: fail_runtime("unknown measure ", static_cast<int>(m));
  }
}

HarnessOptions& options() {
  static HarnessOptions o;
  return o;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

CaseBuilder::CaseBuilder(const std::string& seed_name, DType dt) : dt_(dt), seed_(name_seed(seed_name)) {}

int CaseBuilder::input(const std::string& name, const Shape& shape) { return g_.add_input(name, dt_, shape); }
int CaseBuilder::input_as(const std::string& name, DType dt, const Shape& shape) { return g_.add_input(name, dt, shape); }

int CaseBuilder::weight(const std::string& name, const Shape& shape, float lo, float hi) {
  return weight_as(name, dt_, shape, lo, hi);
}

int CaseBuilder::weight_as(const std::string& name, DType dt, const Shape& shape, float lo, float hi) {
  auto v = uniform(static_cast<size_t>(shape_numel(shape)), seed_ + 7919u * static_cast<uint32_t>(++constants_), lo, hi);
  return g_.add_constant(name, HostTensor::from_f32_as(dt, shape, v));
}

int CaseBuilder::index_constant(const std::string& name, DType dt, const Shape& shape, int64_t lo, int64_t hi) {
  if (dt != DType::I64 && dt != DType::I32) fail_runtime("op harness: index constants are i64 or i32");
  std::mt19937 rng(seed_ + 7919u * static_cast<uint32_t>(++constants_));
  std::uniform_int_distribution<int64_t> d(lo, hi - 1);
  HostTensor t;
  t.dtype = dt;
  t.shape = shape;
  std::vector<uint8_t> bytes(t.nbytes());
  for (int64_t i = 0; i < t.numel(); ++i) {
    const int64_t v = d(rng);
    if (dt == DType::I64) std::memcpy(bytes.data() + 8 * i, &v, 8);
    else {
      const int32_t v32 = static_cast<int32_t>(v);
      std::memcpy(bytes.data() + 4 * i, &v32, 4);
    }
  }
  t.blob = Blob::from_vector(std::move(bytes));
  return g_.add_constant(name, std::move(t));
}

int CaseBuilder::node(Op op, const std::string& name, const std::vector<int>& ins, Attrs attrs) {
  return g_.add_node(op, name, ins, std::move(attrs));
}

std::vector<int> CaseBuilder::node_multi(Op op, const std::string& name, const std::vector<int>& ins, Attrs attrs) {
  return g_.add_node_multi(op, name, ins, std::move(attrs));
}

Graph CaseBuilder::finish(int output) { return finish(std::vector<int>{output}); }
Graph CaseBuilder::finish(const std::vector<int>& outputs) {
  for (int o : outputs) g_.mark_output(o);
  return std::move(g_);
}

std::string shape_tag(const Shape& s) {
  std::string t = "r" + std::to_string(s.size());
  for (int64_t d : s) t += "_" + std::to_string(d);
  return t;
}

OpCase one_node_case(const std::string& op, const std::string& tag, DType dt, Limit limit) {
  OpCase c;
  c.name = op + "_" + tag + "_" + dtype_name(dt);
  c.group = op;
  c.dtype = dt;
  c.limit = limit;
  return c;
}

Limit limit_for(Measure m, DType dt, double f32, double f16, double bf16) {
  switch (dt) {
    case DType::F32: return {m, f32};
    case DType::F16: return {m, f16};
    case DType::BF16: return {m, bf16};
    default: fail_runtime("op harness: no limit for dtype ", dtype_name(dt));
  }
}

std::vector<ref::Buffer> case_inputs(const OpCase& c) {
  const uint32_t seed = name_seed(c.name);
  std::vector<ref::Buffer> in;
  for (size_t k = 0; k < c.graph.inputs.size(); ++k) {
    const Value& v = c.graph.values[c.graph.inputs[k]];
    const auto range = c.input_range.count(v.name) ? c.input_range.at(v.name) : std::make_pair(c.input_lo, c.input_hi);
    auto x = uniform(static_cast<size_t>(shape_numel(v.shape)), seed + 104729u * static_cast<uint32_t>(k + 1), range.first,
                     range.second);
    if (v.dtype == DType::F8E4M3) {  // e4m3 code values (the range in code units)
      for (float& e : x) e = e4m3_to_f32(f32_to_e4m3(e));
    } else if (dtype_is_float(v.dtype)) {
      for (float& e : x) e = round_to_storage(v.dtype, e);
    } else {  // integers in [lo, hi), held as floats as the engines take them
      for (float& e : x) e = std::min(std::floor(e), std::ceil(range.second) - 1);
    }
    in.push_back(std::move(x));
  }
  return in;
}

double case_error(Measure m, const std::vector<ref::Buffer>& got, const std::vector<ref::Buffer>& ref) {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  if (got.size() != ref.size()) return kInf;
  double worst = 0;
  for (size_t k = 0; k < ref.size(); ++k) {
    if (got[k].size() != ref[k].size()) return kInf;
    double max_ref = 0;
    for (float r : ref[k]) max_ref = std::max(max_ref, std::fabs(double(r)));
    for (size_t i = 0; i < ref[k].size(); ++i) {
      const double g = got[k][i], r = ref[k][i];
      if (g == r) continue;  // equal infinities too
      if (!std::isfinite(g) || !std::isfinite(r)) return kInf;
      const double d = std::fabs(g - r);
      switch (m) {
        case Measure::Exact: return kInf;
        case Measure::MaxRel: worst = std::max(worst, max_ref > 0 ? d / max_ref : kInf); break;
        case Measure::ElemRel: worst = std::max(worst, d / std::max(1.0, std::fabs(r))); break;
        default: fail_runtime("unknown measure ", static_cast<int>(m));
      }
    }
  }
  return worst;
}

std::vector<ref::Buffer> run_cpu_backend(const Graph& g, const std::vector<ref::Buffer>& inputs, int perf_runs,
                                         double* median_ms) {
  for (const Node& n : g.nodes)  // Engine::load's check
    if (!cpu::supports(g, n)) fail_input("layer '", n.name, "' is not supported by the CPU backend");
  const int64_t batch = g.values[g.inputs.at(0)].shape.at(0);
  for (int v : g.inputs)  // ExecutionContext::run's check: one batch size for all inputs
    if (g.values[v].shape.at(0) != batch) fail_input("inputs disagree on the batch size");
  const cpu::CpuProgram prog(g);
  const ShapedPlan plan = plan_for_batch(g, batch);
  // NaN poison: an output the backend never writes cannot pass.
  std::vector<float> arena(plan.memory.arena_bytes / sizeof(float) + 1, std::numeric_limits<float>::quiet_NaN());
  auto at = [&](int v) { return arena.data() + plan.memory.offsets[v] / static_cast<int64_t>(sizeof(float)); };
  for (size_t k = 0; k < inputs.size(); ++k)
    std::memcpy(at(plan.graph.inputs[k]), inputs[k].data(), inputs[k].size() * sizeof(float));
  prog.run(plan.graph, plan.memory, arena.data(), cpu::default_pool(), plan.layout());
  std::vector<ref::Buffer> out;
  for (int v : plan.graph.outputs) {  // read back as ExecutionContext::run does
    const float* p = at(v);
    out.emplace_back(p, p + shape_numel(plan.graph.values[v].shape));
  }
  if (perf_runs > 0 && median_ms) {
    std::vector<double> ms;
    for (int r = 0; r < perf_runs; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      prog.run(plan.graph, plan.memory, arena.data(), cpu::default_pool(), plan.layout());
      ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    *median_ms = median(ms);
  }
  return out;
}

const std::vector<OpCase>& all_cases() {
  static const std::vector<OpCase> cases = [] {
    std::vector<OpCase> v;
    add_conv_cases(v);
    add_pool_cases(v);
    add_elementwise_cases(v);
    add_shape_cases(v);
    add_group_cases(v);
    add_top_k_cases(v);
    add_norm_cases(v);
    add_matmul_cases(v);
    add_layout_cases(v);
    add_deform_cases(v);
    add_attention_cases(v);
    add_quant_cases(v);
    std::set<std::string> names;
    for (const OpCase& c : v)
      if (!names.insert(c.name).second) fail_runtime("op harness: case name '", c.name, "' is used twice");
    return v;
  }();
  return cases;
}

}  // namespace kiln::ops
