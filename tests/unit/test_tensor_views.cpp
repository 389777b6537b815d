// Typed tensor views into caller buffers (ExecutionContext::run with views,
// kiln_context_run_n) on a two-input, two-output engine built in code, and
// the backend registry. CPU suite; tests/gpu/test_cuda_views.cpp covers
// device pointers on a caller stream.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>

#include "backends/backend.hpp"
#include "core/error.hpp"
#include "core/half.hpp"
#include "engine_test_util.hpp"
#include "kiln/kiln.h"
#include "kiln/kiln.hpp"
#include "temp_dir.hpp"

extern "C" int kiln_c_run_n(const char* bundle, const float* a, const float* b, int64_t n, float* sum, size_t sum_capacity,
                            float* logits, size_t logits_capacity);

namespace kiln {
namespace {

using testing::error_of;
using testing::kViewC;
using testing::kViewClasses;
using testing::kViewHW;
using testing::random_values;

constexpr int64_t kBatch = 3;
const Shape kIn = {kBatch, kViewC, kViewHW, kViewHW};
const Shape kLogits = {kBatch, kViewClasses};
constexpr size_t kInValues = kBatch * kViewC * kViewHW * kViewHW;
constexpr size_t kLogitValues = kBatch * kViewClasses;

std::shared_ptr<const Engine> cpu_engine() {
  static const std::vector<uint8_t> bytes = testing::bundle_bytes(testing::two_by_two_graph().graph, "cpu");
  return Engine::load_from_memory(bytes.data(), bytes.size(), {}, "two_by_two.bundle");
}


// Caller buffers, filled with a canary so a write shows.
constexpr float kCanary = -12345.f;
struct Outputs {
  std::vector<float> sum = std::vector<float>(kInValues, kCanary), logits = std::vector<float>(kLogitValues, kCanary);
  std::vector<MutableTensorView> views() {
    return {{"logits", DType::F32, kLogits, logits.data(), MemoryKind::Host, logits.size() * 4},
            {"sum", DType::F32, kIn, sum.data(), MemoryKind::Host, sum.size() * 4}};
  }
  bool untouched() const {
    auto all = [](const std::vector<float>& v) { return std::all_of(v.begin(), v.end(), [](float x) { return x == kCanary; }); };
    return all(sum) && all(logits);
  }
};

struct Inputs {
  std::vector<float> a = random_values(kInValues, 1), b = random_values(kInValues, 2);
  std::vector<TensorView> views() const {
    return {{"b", DType::F32, kIn, b.data(), MemoryKind::Host, b.size() * 4},
            {"a", DType::F32, kIn, a.data(), MemoryKind::Host, a.size() * 4}};
  }
  std::vector<Tensor> tensors() const { return {{"a", kIn, a}, {"b", kIn, b}}; }
};

TEST(TensorViews, ViewsMatchConvenientRunAndPlainComputation) {
  auto engine = cpu_engine();
  ASSERT_EQ(engine->inputs().size(), 2u);
  ASSERT_EQ(engine->outputs().size(), 2u);
  const auto at3 = engine->outputs(kBatch);
  EXPECT_EQ(at3[0].name, "sum");
  EXPECT_EQ(at3[0].shape, kIn);
  EXPECT_EQ(at3[1].shape, kLogits);
  auto ctx = engine->create_context();
  const Inputs in;
  const std::vector<Tensor> convenient = ctx->run(in.tensors());
  ASSERT_EQ(convenient.size(), 2u);
  Outputs out;
  int not_a_stream = 0;  // the CPU backend ignores the stream and runs synchronously
  ctx->run(in.views(), out.views(), &not_a_stream);
  EXPECT_EQ(out.sum, convenient[0].data);  // bit for bit: the same engine call
  EXPECT_EQ(out.logits, convenient[1].data);
  const auto ref = testing::two_by_two_reference(testing::two_by_two_graph(), in.a, in.b, kBatch);
  EXPECT_EQ(out.sum, ref[0]);  // relu(a + b) in f32 is exact
  EXPECT_LE(testing::max_abs_diff(out.logits, ref[1]), 1e-5f * testing::max_abs(ref[1]));  // max abs error / max |ref|
}

TEST(TensorViews, HalfInputsAreConvertedOnTheHost) {
  auto ctx = cpu_engine()->create_context();
  const Inputs in;
  for (DType dt : {DType::F16, DType::BF16}) {
    std::vector<uint16_t> a16(kInValues);
    std::vector<float> widened(kInValues);
    for (size_t i = 0; i < kInValues; ++i) {
      a16[i] = dt == DType::F16 ? f32_to_f16(in.a[i]) : f32_to_bf16(in.a[i]);
      widened[i] = dt == DType::F16 ? f16_to_f32(a16[i]) : bf16_to_f32(a16[i]);
    }
    Outputs out;
    std::vector<TensorView> views = in.views();
    views[1] = {"a", dt, kIn, a16.data(), MemoryKind::Host, a16.size() * 2};
    ctx->run(views, out.views());
    const auto want = ctx->run({{"a", kIn, widened}, {"b", kIn, in.b}});
    EXPECT_EQ(out.sum, want[0].data) << dtype_name(dt);
    EXPECT_EQ(out.logits, want[1].data) << dtype_name(dt);
  }
}

TEST(TensorViews, BadViewsAreRefusedByNameAndWriteNothing) {
  auto ctx = cpu_engine()->create_context();
  const Inputs in;
  std::vector<float> small(kInValues - 1);
  int on_device = 0;  // never dereferenced: the CPU backend refuses device views before reading any
  struct Case {
    const char* what;
    std::function<void(std::vector<TensorView>&, std::vector<MutableTensorView>&)> edit;
    ErrorKind kind;
    std::string needle;
  };
  const Case cases[] = {
      {"input name", [](auto& i, auto&) { i[0].name = "c"; }, ErrorKind::Input, "input 'c' is not an input of this engine"},
      {"input twice", [](auto& i, auto&) { i[0].name = "a"; }, ErrorKind::Input, "input 'a' given twice"},
      {"input missing", [](auto& i, auto&) { i.pop_back(); }, ErrorKind::Input, "input 'a' is missing"},
      {"input dtype", [](auto& i, auto&) { i[1].dtype = DType::I32; }, ErrorKind::Input, "input 'a' is i32: inputs are f32"},
      {"f16 on the device", [](auto& i, auto&) { i[1].dtype = DType::F16, i[1].where = MemoryKind::Device; },
       ErrorKind::Input, "input 'a' is f16 device memory"},
      {"input shape", [](auto& i, auto&) { i[0].shape = {kBatch, kViewC, kViewHW, kViewHW + 1}; }, ErrorKind::Input,
       "input 'b' has shape [3,24,3,4], expected [N,24,3,3]"},
      {"batches differ", [](auto& i, auto&) { i[0].shape[0] = 2; }, ErrorKind::Input, "inputs disagree on the batch size"},
      {"batch above max", [](auto& i, auto&) { i[0].shape[0] = i[1].shape[0] = 5; }, ErrorKind::Input,
       "above this engine's largest batch 4"},
      {"input bytes", [&](auto& i, auto&) { i[1].data = small.data(), i[1].bytes = small.size() * 4; }, ErrorKind::Usage,
       "input 'a' has 2588 bytes, its shape [3,24,3,3] of f32 needs 2592"},
      {"input NULL", [](auto& i, auto&) { i[0].data = nullptr; }, ErrorKind::Usage, "input 'b': data is NULL"},
      {"input on the device", [&](auto& i, auto&) { i[1].data = &on_device, i[1].where = MemoryKind::Device; },
       ErrorKind::Input, "input 'a' is device memory (MemoryKind::Device): the CPU backend reads and writes host memory only"},
      {"output name", [](auto&, auto& o) { o[0].name = "scores"; }, ErrorKind::Input,
       "output 'scores' is not an output of this engine"},
      {"output twice", [](auto&, auto& o) { o[0] = o[1]; }, ErrorKind::Input, "output 'sum' given twice"},
      {"output missing", [](auto&, auto& o) { o.erase(o.begin()); }, ErrorKind::Input, "output 'logits' is missing"},
      {"output dtype", [](auto&, auto& o) { o[1].dtype = DType::F16; }, ErrorKind::Input,
       "output 'sum' is f16: outputs are written as f32"},
      {"output shape", [](auto&, auto& o) { o[0].shape = {kBatch, kViewClasses + 1}; }, ErrorKind::Input,
       "output 'logits' has shape [3,11], expected [3,10] at batch 3"},
      {"output capacity", [](auto&, auto& o) { o[0].capacity -= 1; }, ErrorKind::Usage,
       "output 'logits' needs 120 bytes, capacity is 119"},
      {"output NULL", [](auto&, auto& o) { o[1].data = nullptr; }, ErrorKind::Usage, "output 'sum': data is NULL"},
      {"output on the device", [](auto&, auto& o) { o[1].where = MemoryKind::Device; }, ErrorKind::Input,
       "output 'sum' is device memory (MemoryKind::Device)"},
  };
  for (const Case& c : cases) {
    Outputs out;
    std::vector<TensorView> iv = in.views();
    std::vector<MutableTensorView> ov = out.views();
    c.edit(iv, ov);
    const Error e = error_of([&] { ctx->run(iv, ov); });
    EXPECT_EQ(e.kind(), c.kind) << c.what << ": " << e.what();
    EXPECT_NE(std::string(e.what()).find(c.needle), std::string::npos) << c.what << ": " << e.what();
    EXPECT_TRUE(out.untouched()) << c.what;
  }
  // The context still works, with the same numbers as a fresh one.
  Outputs out;
  ctx->run(in.views(), out.views());
  EXPECT_EQ(out.sum, cpu_engine()->create_context()->run(in.tensors())[0].data);
}

// ---------------------------------------------------------------- C ABI

class CViews : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::vector<uint8_t> bytes = testing::bundle_bytes(testing::two_by_two_graph().graph, "cpu");
    dir_ = new testing::TempDir();
    std::ofstream(path(), std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  }
  static void TearDownTestSuite() { delete dir_; }
  static std::string path() { return (dir_->path() / "two_by_two.bundle").string(); }
  static testing::TempDir* dir_;
};
testing::TempDir* CViews::dir_ = nullptr;

TEST_F(CViews, RunNFromCMatchesCpp) {
  const Inputs in;
  std::vector<float> sum(kInValues), logits(kLogitValues);
  ASSERT_EQ(kiln_c_run_n(path().c_str(), in.a.data(), in.b.data(), kBatch, sum.data(), sum.size() * 4, logits.data(),
                         logits.size() * 4),
            0)
      << kiln_last_error();
  const auto want = Engine::load(path())->create_context()->run(in.tensors());
  EXPECT_EQ(sum, want[0].data);
  EXPECT_EQ(logits, want[1].data);
}

TEST_F(CViews, RunNRefusesBadTensorsAndWritesNothing) {
  kiln_engine* e = nullptr;
  ASSERT_EQ(kiln_engine_load(path().c_str(), nullptr, &e), KILN_OK) << kiln_last_error();
  kiln_context* c = nullptr;
  ASSERT_EQ(kiln_context_create(e, &c), KILN_OK);
  const Inputs in;
  const int64_t shape[4] = {kBatch, kViewC, kViewHW, kViewHW}, logits_shape[2] = {kBatch, kViewClasses};
  auto good_inputs = [&] {
    return std::vector<kiln_tensor>{
        {"a", KILN_DTYPE_F32, 4, shape, const_cast<float*>(in.a.data()), kInValues * 4, KILN_MEMORY_HOST},
        {"b", KILN_DTYPE_F32, 4, shape, const_cast<float*>(in.b.data()), kInValues * 4, KILN_MEMORY_HOST}};
  };
  struct Case {
    const char* what;
    std::function<void(std::vector<kiln_tensor>&, std::vector<kiln_tensor>&)> edit;
    kiln_status status;
    std::string needle;
  };
  const Case cases[] = {
      {"NULL name", [](auto& i, auto&) { i[1].name = nullptr; }, KILN_ERROR_USAGE, "input 1 has a NULL name"},
      {"rank 0", [](auto& i, auto&) { i[0].rank = 0; }, KILN_ERROR_USAGE, "input 'a' has rank 0, outside 1..8"},
      {"rank 9", [](auto&, auto& o) { o[0].rank = 9; }, KILN_ERROR_USAGE, "output 'sum' has rank 9, outside 1..8"},
      {"NULL shape", [](auto& i, auto&) { i[0].shape = nullptr; }, KILN_ERROR_USAGE, "input 'a' has a NULL shape"},
      {"dtype code", [](auto& i, auto&) { i[0].dtype = static_cast<kiln_dtype>(42); }, KILN_ERROR_USAGE,
       "input 'a' has an unknown dtype code 42"},
      {"memory code", [](auto&, auto& o) { o[1].memory = static_cast<kiln_memory>(7); }, KILN_ERROR_USAGE,
       "output 'logits' has an unknown memory kind 7"},
      {"capacity 0", [](auto& i, auto&) { i[1].capacity = 0; }, KILN_ERROR_USAGE, "input 'b' has capacity 0 bytes"},
      {"input capacity", [](auto& i, auto&) { i[1].capacity -= 4; }, KILN_ERROR_USAGE, "input 'b' has 2588 bytes"},
      {"NULL data", [](auto&, auto& o) { o[0].data = nullptr; }, KILN_ERROR_USAGE, "output 'sum': data is NULL"},
      {"wrong name", [](auto& i, auto&) { i[0].name = "x"; }, KILN_ERROR_INPUT, "input 'x' is not an input"},
      {"wrong dtype", [](auto&, auto& o) { o[1].dtype = KILN_DTYPE_I64; }, KILN_ERROR_INPUT, "output 'logits' is i64"},
      {"wrong shape", [&](auto&, auto& o) { o[1].shape = shape, o[1].rank = 4; }, KILN_ERROR_INPUT,
       "output 'logits' has shape [3,24,3,3], expected [3,10]"},
      {"too small", [](auto&, auto& o) { o[1].capacity = kLogitValues * 4 - 1; }, KILN_ERROR_USAGE,
       "output 'logits' needs 120 bytes, capacity is 119"},
      {"device memory", [](auto& i, auto&) { i[0].memory = KILN_MEMORY_DEVICE; }, KILN_ERROR_INPUT,
       "input 'a' is device memory"},
      {"missing output", [](auto&, auto& o) { o.pop_back(); }, KILN_ERROR_INPUT, "output 'logits' is missing"},
  };
  for (const Case& k : cases) {
    Outputs out;
    std::vector<kiln_tensor> iv = good_inputs();
    std::vector<kiln_tensor> ov = {{"sum", KILN_DTYPE_F32, 4, shape, out.sum.data(), kInValues * 4, KILN_MEMORY_HOST},
                                   {"logits", KILN_DTYPE_F32, 2, logits_shape, out.logits.data(), kLogitValues * 4, KILN_MEMORY_HOST}};
    k.edit(iv, ov);
    EXPECT_EQ(kiln_context_run_n(c, iv.data(), iv.size(), ov.data(), ov.size(), nullptr), k.status) << k.what;
    EXPECT_NE(std::string(kiln_last_error()).find(k.needle), std::string::npos) << k.what << ": " << kiln_last_error();
    EXPECT_TRUE(out.untouched()) << k.what;
  }
  Outputs out;
  std::vector<kiln_tensor> iv = good_inputs();
  EXPECT_EQ(kiln_context_run_n(nullptr, iv.data(), 2, nullptr, 0, nullptr), KILN_ERROR_USAGE);
  EXPECT_EQ(kiln_context_run_n(c, nullptr, 2, nullptr, 0, nullptr), KILN_ERROR_USAGE);
  EXPECT_EQ(kiln_context_run_n(c, iv.data(), 2, nullptr, 2, nullptr), KILN_ERROR_USAGE);
  EXPECT_EQ(kiln_context_run_n(c, iv.data(), 2, nullptr, 0, nullptr), KILN_ERROR_INPUT);  // no outputs: 'sum' is missing
  EXPECT_NE(std::string(kiln_last_error()).find("output 'sum' is missing"), std::string::npos) << kiln_last_error();
  kiln_dtype dt;
  int64_t dims[8];
  int rank = 0;
  EXPECT_EQ(kiln_engine_input_dtype(e, 2, &dt), KILN_ERROR_USAGE);
  EXPECT_EQ(kiln_engine_output_dtype(nullptr, 0, &dt), KILN_ERROR_USAGE);
  EXPECT_EQ(kiln_engine_output_shape(e, 0, 0, dims, &rank), KILN_ERROR_INPUT);
  EXPECT_NE(std::string(kiln_last_error()).find("batch 0 is outside this engine's 1..4"), std::string::npos) << kiln_last_error();
  EXPECT_EQ(kiln_engine_output_shape(e, 2, 1, dims, &rank), KILN_ERROR_USAGE);
  EXPECT_EQ(kiln_engine_max_batch(nullptr), 0);
  kiln_context_free(c);
  kiln_engine_free(e);
}

// ---------------------------------------------------------------- backends

TEST(Backends, RegistryNamesBackendsAndRefusesUnknownOnes) {
  const BackendRegistry& r = backend_registry();
  const auto names = r.names();
  ASSERT_FALSE(names.empty());
  EXPECT_EQ(names[0], "cpu");
  EXPECT_EQ(&r.get("cpu"), r.find("cpu"));
  Error e = error_of([&] { r.get("tpu"); });
  EXPECT_EQ(e.kind(), ErrorKind::Usage);
  EXPECT_EQ(std::string(e.what()).rfind("unknown backend 'tpu' (available: cpu", 0), 0u) << e.what();
  if (!r.find("cuda")) {  // a CPU-only build says why CUDA is absent
    e = error_of([&] { r.get("cuda"); });
    EXPECT_NE(std::string(e.what()).find("backend 'cuda' is not built into this kiln"), std::string::npos) << e.what();
  }
  // Through the public door: loading onto a backend that does not exist.
  const std::vector<uint8_t> bytes = testing::bundle_bytes(testing::two_by_two_graph().graph, "cpu");
  e = error_of([&] { Engine::load_from_memory(bytes.data(), bytes.size(), LoadOptions{"tpu", nullptr}); });
  EXPECT_EQ(e.kind(), ErrorKind::Usage);
  EXPECT_NE(std::string(e.what()).find("unknown backend 'tpu' (available: cpu"), std::string::npos) << e.what();
}

TEST(Backends, SupportsGivesTheReasonAndLoadRefusesWithIt) {
  Graph g;
  const int ids = g.add_input("ids", DType::I64, {2, 4});
  g.mark_output(g.add_node(Op::Flatten, "flat", {ids}));
  const Backend& cpu = backend_registry().get("cpu");
  EXPECT_EQ(cpu.supports(g), "layer 'flat' is not supported by the CPU backend");
  EXPECT_EQ(cpu.supports(testing::two_by_two_graph().graph), "");
  if (const Backend* cuda = backend_registry().find("cuda")) {
    Graph t;
    const int x = t.add_input("x", DType::F32, {2, 9});
    t.add_node_multi(Op::TopK, "pick", {x}, {{"k", int64_t{3}}});
    t.mark_output(t.nodes.back().outputs[0]);
    // top_k is lowered on CUDA since issue 12 (every op of ops.def is; lower.cpp's
    // KILN_CUDA_NOT_LOWERED list, the only source of refusals here, is empty).
    EXPECT_EQ(cuda->supports(t), "");
    EXPECT_EQ(cuda->supports(testing::two_by_two_graph().graph), "");
    EXPECT_EQ(cuda->channel_align_bytes(), 16);
  }
  const std::vector<uint8_t> bytes = testing::bundle_bytes(g, "cpu");
  const Error e = error_of([&] { Engine::load_from_memory(bytes.data(), bytes.size(), {}, "ids.bundle"); });
  EXPECT_EQ(e.kind(), ErrorKind::Input);
  EXPECT_EQ(std::string(e.what()), "ids.bundle: layer 'flat' is not supported by the CPU backend");
}

TEST(Backends, CompiledCpuEngineRunsThroughTheInterface) {
  const testing::TwoByTwo t = testing::two_by_two_graph(kBatch);
  CompileOptions o;
  o.tune = true;  // as kiln build compiles: the CPU backend has nothing to time or record
  auto compiled = backend_registry().get("cpu").compile(t.graph, o);
  EXPECT_TRUE(compiled->record().empty());
  EXPECT_EQ(compiled->timed_layers(), 0);
  auto ctx = compiled->create_context();
  const Inputs in;
  Outputs out;
  std::vector<TensorView> iv = in.views();
  std::swap(iv[0], iv[1]);  // graph order: a, b
  std::vector<MutableTensorView> ov = out.views();
  std::swap(ov[0], ov[1]);  // graph order: sum, logits
  ctx->run(iv, ov, kBatch, nullptr);
  const auto ref = testing::two_by_two_reference(t, in.a, in.b, kBatch);
  EXPECT_EQ(out.sum, ref[0]);
  EXPECT_LE(testing::max_abs_diff(out.logits, ref[1]), 1e-5f * testing::max_abs(ref[1]));
  EXPECT_EQ(ctx->kernels_per_call(kBatch), t.graph.nodes.size());
}

}  // namespace
}  // namespace kiln
