// The op harness tests: every case against the plain reference on the
// optimized CPU backend (OpCpu) and the CUDA backend (OpCuda, CUDA builds;
// skips without a GPU); the coverage checks (every op of ops.def and every
// activation kind has cases in every float dtype); a few hand-computed
// values that pin the reference itself.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <mutex>
#include <optional>

#include "core/error.hpp"
#include "core/half.hpp"
#include "ir/attrs.hpp"
#include "op_harness.hpp"

namespace kiln::ops {

std::map<std::string, std::pair<double, double>>& error_log();  // main.cpp

namespace {

std::string case_label(const ::testing::TestParamInfo<size_t>& info) { return all_cases()[info.param].name; }

using Runner = std::function<std::vector<ref::Buffer>(int perf_runs, double* ms)>;

// Runs one backend on a case and judges it against its declaration.
void check_backend(const OpCase& c, const char* backend, const Declared& d, const Runner& run,
                   const std::vector<ref::Buffer>& want, double* ms) {
  std::vector<ref::Buffer> got;
  std::string refusal;
  try {
    got = run(options().perf ? options().perf_runs : 0, ms);
  } catch (const Error& e) {
    refusal = e.what();
    if (refusal.empty()) refusal = "(kiln::Error without a message)";
  }
  if (d.expect == Expect::Refuses) {
    EXPECT_FALSE(refusal.empty()) << backend << " took " << c.name << ", declared refused (" << d.why
                                  << "): the limitation is gone, drop the declaration";
    EXPECT_NE(refusal.find(d.says), std::string::npos)
        << backend << " refused " << c.name << " for another reason than declared (" << d.why << "): " << refusal;
    return;
  }
  ASSERT_TRUE(refusal.empty()) << backend << " refused " << c.name << ", which declares no limitation: " << refusal;
  const Limit lim = d.limit ? *d.limit : c.limit;
  const double err = case_error(lim.measure, got, want);
  {
    static std::mutex mu;
    std::lock_guard<std::mutex> lock(mu);
    auto& e = error_log()[cat(backend, " ", c.group, " ", dtype_name(c.dtype))];
    e.first = std::max(e.first, err);
    e.second = std::max(e.second, lim.limit > 0 ? err / lim.limit : (err > 0 ? INFINITY : 0.0));
  }
  if (d.expect == Expect::WrongResult) {
    EXPECT_GT(err, lim.limit) << backend << " now agrees on " << c.name << ", declared wrong (" << d.why
                                  << "): the bug is fixed, drop the declaration";
    return;
  }
  EXPECT_LE(err, lim.limit) << backend << " " << c.name << ": error (" << measure_name(lim.measure) << ") " << err
                            << " over the limit " << lim.limit;
}

std::vector<ref::Buffer> reference_of(const OpCase& c, const std::vector<ref::Buffer>& in, double* ms) {
  const auto t0 = std::chrono::steady_clock::now();
  auto r = ref::run_reference_graph(c.graph, in);
  if (ms) *ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

class OpCpu : public ::testing::TestWithParam<size_t> {};

TEST_P(OpCpu, MatchesReference) {
  const OpCase& c = all_cases()[GetParam()];
  const auto in = case_inputs(c);
  double ref_ms = 0, cpu_ms = 0;
  std::vector<ref::Buffer> want;
  ASSERT_NO_THROW(want = reference_of(c, in, &ref_ms)) << "the reference must run every case";
  check_backend(c, "cpu", c.cpu, [&](int runs, double* ms) { return run_cpu_backend(c.graph, in, runs, ms); }, want, &cpu_ms);
  if (options().perf) std::printf("[perf] %-52s ref %9.4f ms  cpu %9.4f ms\n", c.name.c_str(), ref_ms, cpu_ms);
}

INSTANTIATE_TEST_SUITE_P(Cases, OpCpu, ::testing::Range(size_t(0), all_cases().size()), case_label);

#ifdef KILN_HAVE_CUDA
class OpCuda : public ::testing::TestWithParam<size_t> {};

TEST_P(OpCuda, MatchesReference) {
  const OpCase& c = all_cases()[GetParam()];
  // Listed and printed, never silent: OpCudaNotLowered.* fails once the op is lowered.
  if (c.cuda.expect == Expect::NotLowered) GTEST_SKIP() << "[not lowered on CUDA yet] " << c.name << ": " << c.cuda.why;
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const auto in = case_inputs(c);
  double cuda_ms = 0;
  std::vector<ref::Buffer> want;
  ASSERT_NO_THROW(want = reference_of(c, in, nullptr));
  check_backend(c, "cuda", c.cuda, [&](int runs, double* ms) {
    return run_cuda_backend(c.graph, in, options().cuda_opt_level, runs, ms, options().fp8_fusion);
  }, want, &cuda_ms);
  if (options().perf) std::printf("[perf] %-52s cuda %9.4f ms (graph replay)\n", c.name.c_str(), cuda_ms);
}

INSTANTIATE_TEST_SUITE_P(Cases, OpCuda, ::testing::Range(size_t(0), all_cases().size()), case_label);

// The fused FP8 conv (epilogue inside cuDNN's graph, ConvDesc::fp8_epi)
// against the two-kernel path (raw sum + quant_epilogue), both forced by the
// test hook (CudaOptions::fp8_fusion), on every FP8 quantized_layer case the
// CUDA backend runs: each within cuda_fp8_layer of the reference, and of each
// other. A conv whose output channels are multiples of 16 must take a fused
// tactic when forced (cuDNN's runtime fusion takes this pattern); linears and
// padded-k convs keep the two-kernel path and must say so in the tactic.
class OpCudaFp8Fusion : public ::testing::TestWithParam<size_t> {};

// One FP8 layer case run forced onto a path (`forced`: the test hook's value,
// 1 cuDNN's fused graph, 2 CUTLASS) and forced onto the two-kernel path (-1):
// both within the case's CUDA limit of the reference and of each other.
struct ForcedRuns {
  std::string forced_tactics, unfused_tactics;
};
bool fp8_layer_case(const OpCase& c) {
  return c.group == "group:quantized_layer" && c.cuda.expect == Expect::Match && c.cuda.limit &&
         c.graph.values[c.graph.nodes.back().inputs[0]].dtype == DType::F8E4M3;
}
// An FP8 or INT8 layer case the CUDA backend runs (the CUTLASS GEMM multiplies both).
bool eight_bit_layer_case(const OpCase& c) {
  return c.group == "group:quantized_layer" && c.cuda.expect == Expect::Match;
}
void run_forced(const OpCase& c, int forced, const char* what, ForcedRuns& r) {
  const auto in = case_inputs(c);
  std::vector<ref::Buffer> want, got, unfused;
  ASSERT_NO_THROW(want = reference_of(c, in, nullptr));
  ASSERT_NO_THROW(got = run_cuda_backend(c.graph, in, options().cuda_opt_level, 0, nullptr, forced, &r.forced_tactics));
  ASSERT_NO_THROW(unfused = run_cuda_backend(c.graph, in, options().cuda_opt_level, 0, nullptr, -1, &r.unfused_tactics));
  const Limit lim = c.cuda.limit.value_or(c.limit);
  EXPECT_LE(case_error(lim.measure, got, want), lim.limit) << c.name << " " << what << ": " << r.forced_tactics;
  EXPECT_LE(case_error(lim.measure, unfused, want), lim.limit) << c.name << " unfused: " << r.unfused_tactics;
  EXPECT_LE(case_error(lim.measure, got, unfused), lim.limit) << c.name << " " << what << " vs unfused";
}

TEST_P(OpCudaFp8Fusion, FusedMatchesUnfused) {
  const OpCase& c = all_cases()[GetParam()];
  if (!fp8_layer_case(c)) GTEST_SKIP() << "not a CUDA FP8 layer case";
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  ForcedRuns r;
  run_forced(c, 1, "fused", r);
  const std::string &fused_tactics = r.forced_tactics, &unfused_tactics = r.unfused_tactics;
  EXPECT_EQ(unfused_tactics.find("fused "), std::string::npos) << "forced off yet fused: " << unfused_tactics;
  const Value& w = c.graph.values[c.graph.nodes.back().inputs[1]];
  const bool fusable = c.graph.nodes.back().op == Op::Conv2d && w.shape[0] % 16 == 0;
  if (fusable) EXPECT_NE(fused_tactics.find("fused "), std::string::npos) << c.name << ": forced on, no fused tactic: " << fused_tactics;
  else EXPECT_EQ(fused_tactics.find("fused "), std::string::npos) << c.name << ": " << fused_tactics;
  std::printf("[fp8 fusion] %-48s fused: %s\n", c.name.c_str(), fused_tactics.c_str());
}

INSTANTIATE_TEST_SUITE_P(Cases, OpCudaFp8Fusion, ::testing::Range(size_t(0), all_cases().size()), case_label);

// kiln's CUTLASS 8-bit GEMM (fp8_gemm_sm90.hpp, the epilogue writing y) forced
// by the test hook on every FP8 and INT8 quantized_layer case the CUDA backend
// runs: within the case's CUDA limit of the reference (FP8 cuda_fp8_layer,
// INT8 Exact for none/ReLU: int32 sums) and of the two-kernel path. A 1x1
// unit-stride conv or a linear with output channels a multiple of 16, f16 or
// codes in and out and no activation or ReLU must take a CUTLASS tactic on an
// sm_90 device built with CUTLASS; any other case must not.
class OpCudaFp8Cutlass : public ::testing::TestWithParam<size_t> {};

TEST_P(OpCudaFp8Cutlass, CutlassMatchesUnfused) {
  const OpCase& c = all_cases()[GetParam()];
  if (!eight_bit_layer_case(c)) GTEST_SKIP() << "not a CUDA 8-bit layer case";
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  ForcedRuns r;
  run_forced(c, 2, "CUTLASS", r);
  const std::string &forced_tactics = r.forced_tactics, &unfused_tactics = r.unfused_tactics;
  EXPECT_EQ(unfused_tactics.find("cutlass"), std::string::npos) << "forced off yet CUTLASS: " << unfused_tactics;
  const Node& layer = c.graph.nodes.back();
  const Value& w = c.graph.values[layer.inputs[1]];
  const Value& y = c.graph.values[layer.outputs[0]];
  const DType code = c.graph.values[layer.inputs[0]].dtype;
  bool takes = w.shape[0] % 16 == 0 && (y.dtype == DType::F16 || y.dtype == code);
  if (layer.op == Op::Conv2d) {
    const ConvAttrs a = conv_attrs(layer);
    takes = takes && w.shape[2] == 1 && w.shape[3] == 1 && a.stride_h == 1 && a.stride_w == 1;
  }
  takes = takes && (layer.activation() == Activation::None || layer.activation() == Activation::Relu);
  if (layer.inputs.size() > 3) {
    const DType rdt = c.graph.values[layer.inputs[3]].dtype;
    takes = takes && (rdt == DType::F16 || rdt == code);
  }
  if (!cutlass_fp8_available()) GTEST_SKIP() << "no CUTLASS FP8 GEMM here (built without CUTLASS, or not sm_90): " << forced_tactics;
  if (takes) EXPECT_NE(forced_tactics.find("cutlass"), std::string::npos) << c.name << ": forced, no CUTLASS tactic: " << forced_tactics;
  else EXPECT_EQ(forced_tactics.find("cutlass"), std::string::npos) << c.name << ": " << forced_tactics;
  std::printf("[fp8 cutlass] %-48s %s\n", c.name.c_str(), forced_tactics.c_str());
}

INSTANTIATE_TEST_SUITE_P(Cases, OpCudaFp8Cutlass, ::testing::Range(size_t(0), all_cases().size()), case_label);

// Each op of kNotLoweredOnCuda, through the path `kiln build --backend cuda`
// takes (CudaEngine with tuning): it must be refused with the CUDA program
// builder's "no lowering" error naming the node. Once the backend takes the
// op this fails, so the skips above cannot outlive the lowering.
class OpCudaNotLowered : public ::testing::TestWithParam<Op> {};

TEST_P(OpCudaNotLowered, IsRefusedNamingTheNode) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const Op op = GetParam();
  const OpCase* probe = nullptr;  // the first case of the op whose inputs are 4-D (CUDA engine inputs must be)
  for (const OpCase& c : all_cases()) {
    bool four_d = c.single_op() && c.group == op_name(op);
    for (int v : c.graph.inputs) four_d = four_d && c.graph.values[v].shape.size() == 4;
    if (four_d && !probe) probe = &c;
  }
  ASSERT_NE(probe, nullptr) << op_name(op) << ": no harness case with 4-D inputs to probe the CUDA backend with";
  std::string refusal;
  try {
    run_cuda_backend(probe->graph, case_inputs(*probe), options().cuda_opt_level);
  } catch (const Error& e) {
    refusal = e.what();
  }
  ASSERT_FALSE(refusal.empty()) << "the CUDA backend runs " << op_name(op) << " now (" << probe->name
                                << "): remove it from kNotLoweredOnCuda (op_harness.hpp) and its cuda_not_lowered "
                                   "declarations, so its cases are checked against the reference";
  EXPECT_NE(refusal.find(probe->cuda.says), std::string::npos) << probe->name << " refused for another reason: " << refusal;
  EXPECT_NE(refusal.find(probe->graph.nodes.at(0).name + ": "), std::string::npos) << "the error must name the node: " << refusal;
}

GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(OpCudaNotLowered);  // kNotLoweredOnCuda may be empty
INSTANTIATE_TEST_SUITE_P(Ops, OpCudaNotLowered, ::testing::ValuesIn(kNotLoweredOnCuda),
                         [](const ::testing::TestParamInfo<Op>& info) { return std::string(op_name(info.param)); });
#endif

// ------------------------------------------------------------------ coverage

TEST(OpHarness, EveryOpHasOneNodeCasesInEveryDtype) {
  const Op ops[] = {
#define KILN_OP(e, name, min_in, max_in, min_out, max_out) Op::e,
#include "ir/ops.def"
#undef KILN_OP
  };
  std::string missing;
  for (Op op : ops)
    for (DType dt : kCaseTypes) {
      bool found = false;
      for (const OpCase& c : all_cases()) found |= c.single_op() && c.group == op_name(op) && c.dtype == dt;
      if (!found) missing += cat(" ", op_name(op), "/", dtype_name(dt));
    }
  EXPECT_TRUE(missing.empty()) << "ops of ops.def without a harness case:" << missing;
}

// The not-lowered list in one glance (printed on every run, CPU builds too),
// kept honest without a GPU: every case of a listed op declares it, no other
// case does, and the CUDA sources have no `case Op::<Enum>` for a listed op
// (that is what a lowering in cuda_program.cpp's dispatch looks like).
TEST(OpHarness, NotLoweredOnCudaListIsCurrent) {
  auto listed = [](Op op) { return std::find(std::begin(kNotLoweredOnCuda), std::end(kNotLoweredOnCuda), op) != std::end(kNotLoweredOnCuda); };
  for (Op op : kNotLoweredOnCuda) {
    int cases = 0;
    for (const OpCase& c : all_cases()) cases += c.single_op() && c.group == op_name(op);
    std::printf("[not lowered on CUDA yet] %s: %d cases skipped by OpCuda (kNotLoweredOnCuda, tests/ops/op_harness.hpp)\n",
                op_name(op), cases);
    EXPECT_GT(cases, 0) << op_name(op);
  }
  for (const OpCase& c : all_cases()) {
    const std::optional<Op> op = op_from_name(c.group);
    const bool not_lowered = c.cuda.expect == Expect::NotLowered;
    EXPECT_FALSE(c.cpu.expect == Expect::NotLowered) << c.name << ": only the CUDA side may be not lowered";
    if (!c.single_op()) {
      EXPECT_FALSE(not_lowered) << c.name << ": groups declare what fails in them (Refuses), not NotLowered";
      continue;
    }
    ASSERT_TRUE(op.has_value()) << c.name;
    EXPECT_EQ(not_lowered, listed(*op)) << c.name << ": declare cuda_not_lowered(op) exactly for the ops of kNotLoweredOnCuda";
  }
  const char* enum_names[] = {
#define KILN_OP(e, name, min_in, max_in, min_out, max_out) #e,
#include "ir/ops.def"
#undef KILN_OP
  };
  // The CUDA backend's lowerings are reached through a dispatch generated
  // from ops.def (src/backends/cuda/lower.cpp); ops it does not lower are
  // declared there with KILN_CUDA_NOT_LOWERED(Enum). Both lists must agree.
  const std::filesystem::path lower_cpp = std::filesystem::path(KILN_SOURCE_DIR) / "src" / "backends" / "cuda" / "lower.cpp";
  std::ifstream f(lower_cpp);
  ASSERT_TRUE(f.good()) << lower_cpp;
  const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  for (size_t i = 0; i < std::size(enum_names); ++i) {
    const std::string token = std::string("KILN_CUDA_NOT_LOWERED(") + enum_names[i] + ")";
    EXPECT_EQ(text.find(token) != std::string::npos, listed(static_cast<Op>(i)))
        << op_name(static_cast<Op>(i)) << ": lower.cpp and kNotLoweredOnCuda (op_harness.hpp) disagree on whether "
        << "CUDA lowers it; when it does, remove it from both and its cuda_not_lowered declarations";
  }
}

TEST(OpHarness, EveryActivationHasCasesInEveryDtype) {
  std::string missing;
  int kinds = 0;
  // Every kind activation_name knows (its default throws past the last one).
  for (int i = 0;; ++i) {
    const auto a = static_cast<Activation>(i);
    std::string name;
    try {
      name = activation_name(a);
    } catch (const Error&) {
      break;
    }
    ++kinds;
    for (DType dt : kCaseTypes) {
      bool found = false;
      for (const OpCase& c : all_cases())
        for (const Node& n : c.graph.nodes) found |= c.dtype == dt && n.activation() == a;
      if (!found) missing += " " + name + "/" + dtype_name(dt);
    }
  }
  EXPECT_GE(kinds, 5);
  EXPECT_TRUE(missing.empty()) << "activation kinds without a harness case:" << missing;
}

TEST(OpHarness, CaseNamesAreUniqueAndDeclarationsGiveReasons) {
  for (const OpCase& c : all_cases()) {
    for (char ch : c.name) ASSERT_TRUE(std::isalnum(static_cast<unsigned char>(ch)) || ch == '_') << c.name;
    for (const Declared* d : {&c.cpu, &c.cuda}) {
      if (d->expect != Expect::Match) EXPECT_FALSE(d->why.empty()) << c.name;
      if (d->expect == Expect::Refuses) EXPECT_FALSE(d->says.empty()) << c.name;
      if (d->limit) {  // a backend's own limit says why and is a real bound
        EXPECT_EQ(d->expect, Expect::Match) << c.name;
        EXPECT_FALSE(d->why.empty()) << c.name;
        EXPECT_TRUE(d->limit->measure == Measure::Exact ? d->limit->limit == 0 : d->limit->limit > 0) << c.name;
      }
    }
    EXPECT_TRUE(c.limit.measure == Measure::Exact ? c.limit.limit == 0 : c.limit.limit > 0) << c.name;
  }
}

// ------------------------------------------------------- the reference itself

Graph one_node(Op op, const Shape& x, const std::vector<std::pair<Shape, std::vector<float>>>& constants, Attrs attrs) {
  Graph g;
  std::vector<int> ins = {g.add_input("x", DType::F32, x)};
  for (size_t k = 0; k < constants.size(); ++k)
    ins.push_back(g.add_constant("c" + std::to_string(k), HostTensor::from_f32(constants[k].first, constants[k].second)));
  g.mark_output(g.add_node(op, "n", ins, std::move(attrs)));
  return g;
}

std::vector<float> iota(int n) {
  std::vector<float> v(n);
  for (int i = 0; i < n; ++i) v[i] = float(i);
  return v;
}

TEST(OpReference, ConvOfOnesSumsTheWindow) {
  // 3x3 ones over 0..8 with zero padding 1: the corner sees 0+1+3+4, the centre all nine.
  Graph g = one_node(Op::Conv2d, {1, 1, 3, 3}, {{{1, 1, 3, 3}, std::vector<float>(9, 1.f)}},
                     {{"pads", std::vector<int64_t>{1, 1, 1, 1}}});
  auto y = ref::run_reference_graph(g, {iota(9)}).at(0);
  EXPECT_EQ(y, (std::vector<float>{8, 15, 12, 21, 36, 27, 20, 33, 24}));
}

TEST(OpReference, DilatedConvReadsEveryOtherCell) {
  Graph g = one_node(Op::Conv2d, {1, 1, 5, 5}, {{{1, 1, 3, 3}, std::vector<float>(9, 1.f)}},
                     {{"dilations", std::vector<int64_t>{2, 2}}});
  EXPECT_EQ(ref::run_reference_graph(g, {iota(25)}).at(0), (std::vector<float>{0 + 2 + 4 + 10 + 12 + 14 + 20 + 22 + 24}));
}

TEST(OpReference, AvgPoolCeilModeMatchesPyTorch) {
  // torch.nn.functional.avg_pool2d(torch.arange(9.).view(1,1,3,3), 2, 2, ceil_mode=True)
  // -> [[2.0, 3.5], [6.5, 8.0]] with or without count_include_pad: the last
  // window is cut at the input's end, never counted beyond it.
  for (int64_t include : {0, 1}) {
    Graph g = one_node(Op::AvgPool2d, {1, 1, 3, 3}, {},
                       {{"kernel", std::vector<int64_t>{2, 2}}, {"ceil_mode", int64_t(1)}, {"count_include_pad", include}});
    EXPECT_EQ(ref::run_reference_graph(g, {iota(9)}).at(0), (std::vector<float>{2.f, 3.5f, 6.5f, 8.f}));
  }
  // With padding 1 and count_include_pad, the corner window counts its padded cells: (0+1+3+4)/9.
  Graph g = one_node(Op::AvgPool2d, {1, 1, 3, 3}, {},
                     {{"kernel", std::vector<int64_t>{3, 3}}, {"pads", std::vector<int64_t>{1, 1, 1, 1}}});
  EXPECT_FLOAT_EQ(ref::run_reference_graph(g, {iota(9)}).at(0)[0], 8.f / 9.f);
}

TEST(OpReference, RoundsToTheOutputStorageType) {
  Graph g;
  const int x = g.add_input("x", DType::F32, {1, 1, 1, 3});
  g.mark_output(g.add_node(Op::Cast, "cast", {x}, {{"dtype", std::string("bf16")}}));
  auto y = ref::run_reference_graph(g, {{1.f / 3.f, 1000.7f, -2.5e-3f}}).at(0);
  EXPECT_EQ(y, (std::vector<float>{round_bf16(1.f / 3.f), round_bf16(1000.7f), round_bf16(-2.5e-3f)}));
  EXPECT_NE(y[0], 1.f / 3.f);
}

TEST(OpReference, ConcatAndSliceOnAnyAxis) {
  Graph g;
  const int a = g.add_input("a", DType::F32, {2, 1, 2});
  const int b = g.add_input("b", DType::F32, {2, 1, 1});
  const int c = g.add_node(Op::Concat, "cat", {a, b}, {{"axis", int64_t(-1)}});
  g.mark_output(c);
  g.mark_output(g.add_node(Op::Slice, "slice", {c}, {{"axis", int64_t(2)}, {"start", int64_t(1)}, {"end", int64_t(3)}}));
  auto y = ref::run_reference_graph(g, {{0, 1, 2, 3}, {10, 20}});
  EXPECT_EQ(y.at(0), (std::vector<float>{0, 1, 10, 2, 3, 20}));
  EXPECT_EQ(y.at(1), (std::vector<float>{1, 10, 3, 20}));
}

TEST(OpReference, UnknownOpIsAnErrorNamingTheNode) {
  Graph g = one_node(Op::Activation, {1, 1, 1, 2}, {}, {});
  Node n = g.nodes[0];
  n.op = static_cast<Op>(kOpCount);
  try {
    ref::run_reference(g, n, {{1.f, 2.f}});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("n: ", 0), 0u) << e.what();  // the node's name first
  }
}

}  // namespace
}  // namespace kiln::ops
