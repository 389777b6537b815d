// The op harness (in the spirit of ggml's test-backend-ops): a table of
// cases, each a one-node graph (or one fused group) built in code with its
// shapes, attributes, dtype and the error measure and limit it is judged by.
// Every case runs through the plain reference (src/backends/cpu/ref/), the
// optimized CPU backend and, in CUDA builds, the CUDA backend, each through
// the lowering the runtime uses. A backend that cannot take a case says so
// in the case (Expect::Refuses / Expect::WrongResult with the reason); the
// harness fails when a backend refuses an undeclared case, or takes a
// declared one, so every limitation is visible.
#pragma once
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "backends/cpu/ref/ref.hpp"
#include "ir/graph.hpp"

namespace kiln::ops {

enum class Measure {
  Exact,    // bit-equal values: ops that only move or round values
  MaxRel,   // max|got - ref| / max|ref|: reductions, where small outputs carry the absolute error of big terms
  ElemRel,  // max over elements of |got - ref| / max(1, |ref|): elementwise ops
};
const char* measure_name(Measure m);

struct Limit {
  Measure measure = Measure::Exact;
  double limit = 0;
};

// What a backend does with a case.
enum class Expect {
  Match,        // runs and agrees with the reference within the limit
  Refuses,      // building or running throws kiln::Error
  WrongResult,  // runs but is known to disagree (a recorded backend bug, never silent)
  NotLowered,   // the backend has no lowering for the op at all yet (CUDA only; see kNotLoweredOnCuda)
};
struct Declared {
  Expect expect = Expect::Match;
  std::string why;   // the limitation, where it lives (with `limit`: why this backend's limit differs)
  std::string says;  // Refuses, NotLowered: a part of the backend's error message, so the refusal is for this reason
  // Match: this backend's own limit where it differs from the case's (the
  // CUDA FP8 layers, whose engines accumulate in another order and precision
  // than the CPU's exact sum); unset: the case's limit.
  std::optional<Limit> limit;
};

// Ops of ops.def the CUDA backend does not lower yet. Their cases declare
// cuda_not_lowered(op); OpCuda skips each such case with a printed
// "[not lowered on CUDA yet]" message (never silently), OpCudaNotLowered.*
// (GPU) fails as soon as the CUDA backend takes the op, and
// OpHarness.NotLoweredOnCudaListIsCurrent (CPU) fails as soon as
// src/backends/cuda/lower.cpp stops declaring it KILN_CUDA_NOT_LOWERED: adding the lowering means
// removing the op here, and its cases then run against the reference.
// Since issues 12 and 13 every op of ops.def is lowered on CUDA (quantize
// and dequantize FP8 only). An op added to ops.def before its CUDA lowering
// goes here (and in lower.cpp).
inline const std::vector<Op> kNotLoweredOnCuda = {};

// The limitations declared today, one place each.
inline Declared cuda_refuses_batch_norm_rank() {
  return {Expect::Refuses, "CUDA batch_norm takes NHWC maps and [N, C] rows, channels innermost (elementwise.cpp)",
          "CUDA batch_norm takes 2-D or 4-D values"};
}
inline Declared cuda_refuses_non_channel_axis() {
  return {Expect::Refuses,
          "CUDA concat and slice of 4-D maps (stored NHWC) take the channel axis (layout.cpp; other ranks: any axis)",
          "supports the channel axis of 4-D tensors"};
}
// The message is the CUDA program builder's default (cuda_program.cpp:
// "<node>: the CUDA backend has no lowering for op <op>"), which is also what
// `kiln build --backend cuda` reports for such a node.
inline Declared cuda_not_lowered(Op op) {
  return {Expect::NotLowered, std::string(op_name(op)) + " is not lowered on CUDA yet (kNotLoweredOnCuda, op_harness.hpp)",
          std::string("has no lowering for op ") + op_name(op)};
}

struct OpCase {
  std::string name;   // unique, [A-Za-z0-9_] (a gtest name)
  std::string group;  // op name for one-node cases, "group:<what>" for fused groups
  DType dtype = DType::F32;
  Graph graph;
  Limit limit;
  float input_lo = -1.f, input_hi = 1.f;  // graph inputs are uniform in this range, rounded to their dtype
  // Per graph input (by value name), a range that replaces [input_lo, input_hi).
  // Integer inputs (gather's index) take integers in [lo, hi).
  std::map<std::string, std::pair<float, float>> input_range;
  Declared cpu, cuda;
  bool single_op() const { return group.rfind("group:", 0) != 0; }
};

// Every case, built once (all dtypes).
const std::vector<OpCase>& all_cases();
// Parts of the table, one function per op family (cases_*.cpp).
void add_conv_cases(std::vector<OpCase>& out);
void add_pool_cases(std::vector<OpCase>& out);
void add_elementwise_cases(std::vector<OpCase>& out);
void add_shape_cases(std::vector<OpCase>& out);
void add_group_cases(std::vector<OpCase>& out);
void add_top_k_cases(std::vector<OpCase>& out);
void add_norm_cases(std::vector<OpCase>& out);    // layer_norm, softmax (cases_norm.cpp)
void add_matmul_cases(std::vector<OpCase>& out);  // matmul (cases_matmul.cpp)
void add_layout_cases(std::vector<OpCase>& out);  // transpose, reshape, upsample_nearest, gather (cases_layout.cpp)
void add_deform_cases(std::vector<OpCase>& out);  // ms_deform_attn (cases_deform.cpp)
void add_attention_cases(std::vector<OpCase>& out);  // attention (cases_attention.cpp)
void add_quant_cases(std::vector<OpCase>& out);   // quantize, dequantize, quantized conv2d/linear (cases_quant.cpp)

inline const DType kCaseTypes[] = {DType::F32, DType::F16, DType::BF16};

// Builds a graph in a dtype: inputs and constants in that storage type,
// constants random (seeded by the case name) and rounded once (RNE).
class CaseBuilder {
 public:
  CaseBuilder(const std::string& seed_name, DType dt);
  int input(const std::string& name, const Shape& shape);
  int input_as(const std::string& name, DType dt, const Shape& shape);
  int weight(const std::string& name, const Shape& shape, float lo, float hi);
  // A weight stored as `dt` (an f32 island's constants in a 16-bit case).
  int weight_as(const std::string& name, DType dt, const Shape& shape, float lo, float hi);
  // An integer constant (i64 or i32) of values in [lo, hi), seeded like weights.
  int index_constant(const std::string& name, DType dt, const Shape& shape, int64_t lo, int64_t hi);
  int node(Op op, const std::string& name, const std::vector<int>& ins, Attrs attrs = {});
  std::vector<int> node_multi(Op op, const std::string& name, const std::vector<int>& ins, Attrs attrs = {});
  Graph finish(int output);
  Graph finish(const std::vector<int>& outputs);
  DType dtype() const { return dt_; }

 private:
  Graph g_;
  DType dt_;
  uint32_t seed_;
  int constants_ = 0;
};

// A seed from a case name (FNV-1a: stable across runs and platforms) and
// `count` floats uniform in [lo, hi) from it (std::mt19937).
uint32_t name_seed(const std::string& s);
std::vector<float> uniform(size_t count, uint32_t seed, float lo, float hi);

// "r3_1_13_24": a shape as a part of a case name.
std::string shape_tag(const Shape& s);
// A one-node case of op `op` named "<op>_<tag>_<dtype>", judged by `limit`.
OpCase one_node_case(const std::string& op, const std::string& tag, DType dt, Limit limit);

// The limit of a case by dtype: one value per float type, in kCaseTypes order.
Limit limit_for(Measure m, DType dt, double f32, double f16, double bf16);

// Inputs of a case: uniform in [input_lo, input_hi], seeded by the case name,
// rounded to each input's storage type (what the engine stores).
std::vector<ref::Buffer> case_inputs(const OpCase& c);

// The error of `got` against `ref` under measure m (infinite for a size
// mismatch or a non-finite value where the reference is finite).
double case_error(Measure m, const std::vector<ref::Buffer>& got, const std::vector<ref::Buffer>& ref);

// Runs on the optimized CPU backend as the runtime does (CpuProgram with
// plan_for_batch's memory plan, channel views and fused adds). With
// perf_runs > 0 also times perf_runs runs and stores the median (ms).
std::vector<ref::Buffer> run_cpu_backend(const Graph& g, const std::vector<ref::Buffer>& inputs, int perf_runs = 0,
                                         double* median_ms = nullptr);
// Runs through CudaEngine + CudaContext (Engine::load's path) at `opt_level`.
// fp8_fusion: CudaOptions::fp8_fusion (0 auto, 1 fused, -1 unfused, 2 CUTLASS only), the test
// hook forcing the fused FP8 conv candidates on or off. With `tactics` the
// chosen tactic per node is stored there ("node: tactic; ...").
std::vector<ref::Buffer> run_cuda_backend(const Graph& g, const std::vector<ref::Buffer>& inputs, int opt_level,
                                          int perf_runs = 0, double* median_ms = nullptr, int fp8_fusion = 0,
                                          std::string* tactics = nullptr);
bool cuda_available();
// Whether kiln's CUTLASS FP8 GEMM runs here (built with CUTLASS, an sm_90 device).
bool cutlass_fp8_available();

// Command-line options of kiln_ops_tests (main.cpp).
struct HarnessOptions {
  bool perf = false;
  int perf_runs = 20;
  int cuda_opt_level = 3;
  int fp8_fusion = 0;  // --fp8-fusion=auto|on|off|cutlass: CudaOptions::fp8_fusion for every CUDA case
};
HarnessOptions& options();

double median(std::vector<double> v);

}  // namespace kiln::ops
