// ExecutionContext::run with device pointers on a caller's stream (CUDA
// backend): the same bits as host runs, no wait on the caller's stream, calls
// on two streams ordered, memory kinds checked by name. Skips without a GPU.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "../unit/engine_test_util.hpp"
#include "core/error.hpp"
#include "kiln/kiln.h"
#include "kiln/kiln.hpp"

namespace kiln {
namespace {

using testing::kViewC;
using testing::kViewClasses;
using testing::kViewHW;
using testing::random_values;

bool have_gpu() {
  int n = 0;
  if (cudaGetDeviceCount(&n) == cudaSuccess && n > 0) return true;
  cudaGetLastError();
  return false;
}
#define REQUIRE_GPU() \
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device"
#define CK(expr) ASSERT_EQ((expr), cudaSuccess) << #expr

constexpr int64_t kBatch = 3;
const Shape kIn = {kBatch, kViewC, kViewHW, kViewHW};
const Shape kLogits = {kBatch, kViewClasses};
constexpr size_t kInValues = kBatch * kViewC * kViewHW * kViewHW, kLogitValues = kBatch * kViewClasses;

const std::vector<uint8_t>& cuda_bundle() {
  static const std::vector<uint8_t> bytes = testing::bundle_bytes(testing::two_by_two_graph().graph, "cuda");
  return bytes;
}
std::shared_ptr<const Engine> load(const std::string& backend = "") {
  return Engine::load_from_memory(cuda_bundle().data(), cuda_bundle().size(), LoadOptions{backend, nullptr}, "views.bundle");
}


// Device copies of one call's inputs and room for its outputs.
struct DeviceCall {
  float *a = nullptr, *b = nullptr, *sum = nullptr, *logits = nullptr;
  static float* device_floats(size_t n) {
    void* p = nullptr;
    if (cudaMalloc(&p, n * sizeof(float)) != cudaSuccess) throw std::runtime_error("cudaMalloc failed");
    return static_cast<float*>(p);
  }
  DeviceCall(const std::vector<float>& ha, const std::vector<float>& hb)
      : a(device_floats(kInValues)), b(device_floats(kInValues)), sum(device_floats(kInValues)),
        logits(device_floats(kLogitValues)) {
    cudaMemcpy(a, ha.data(), kInValues * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(b, hb.data(), kInValues * 4, cudaMemcpyHostToDevice);
    cudaMemset(sum, 0xff, kInValues * 4);  // NaN canary
    cudaMemset(logits, 0xff, kLogitValues * 4);
  }
  ~DeviceCall() {
    cudaFree(a), cudaFree(b), cudaFree(sum), cudaFree(logits);
  }
  std::vector<TensorView> inputs() const {
    return {{"a", DType::F32, kIn, a, MemoryKind::Device}, {"b", DType::F32, kIn, b, MemoryKind::Device}};
  }
  std::vector<MutableTensorView> outputs() const {
    return {{"sum", DType::F32, kIn, sum, MemoryKind::Device, kInValues * 4},
            {"logits", DType::F32, kLogits, logits, MemoryKind::Device, kLogitValues * 4}};
  }
  std::vector<std::vector<float>> read() const {
    std::vector<float> s(kInValues), l(kLogitValues);
    cudaMemcpy(s.data(), sum, s.size() * 4, cudaMemcpyDeviceToHost);
    cudaMemcpy(l.data(), logits, l.size() * 4, cudaMemcpyDeviceToHost);
    return {s, l};
  }
};

struct StreamHolder {
  cudaStream_t s = nullptr;
  StreamHolder() { cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking); }
  ~StreamHolder() { cudaStreamDestroy(s); }
};

void expect_same(const std::vector<std::vector<float>>& got, const std::vector<Tensor>& want, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t k = 0; k < got.size(); ++k)
    EXPECT_EQ(std::memcmp(got[k].data(), want[k].data.data(), got[k].size() * 4), 0) << what << ": output " << want[k].name;
}

TEST(CudaViews, DevicePointersOnACallerStreamGiveTheHostRunsBits) {
  REQUIRE_GPU();
  auto engine = load();
  const auto a = random_values(kInValues, 1), b = random_values(kInValues, 2);
  StreamHolder stream;
  // First call of the context on the caller's stream (the capture happens on the context's own stream).
  auto ctx = engine->create_context();
  DeviceCall d(a, b);
  ctx->run(d.inputs(), d.outputs(), stream.s);
  CK(cudaStreamSynchronize(stream.s));
  const std::vector<Tensor> host = ctx->run({{"a", kIn, a}, {"b", kIn, b}});
  expect_same(d.read(), host, "device views after capture");
  // A fresh context whose first call is the host one (eager warm-up computes it).
  const std::vector<Tensor> fresh = engine->create_context()->run({{"a", kIn, a}, {"b", kIn, b}});
  expect_same(d.read(), fresh, "device views vs a fresh context");
  // Host inputs, device outputs, caller stream; host outputs, device inputs.
  DeviceCall mixed(a, b);
  ctx->run({{"a", DType::F32, kIn, a.data()}, {"b", DType::F32, kIn, b.data()}}, mixed.outputs(), stream.s);
  expect_same(mixed.read(), host, "host inputs, device outputs");
  std::vector<float> hs(kInValues), hl(kLogitValues);
  ctx->run(d.inputs(),
           {{"sum", DType::F32, kIn, hs.data(), MemoryKind::Host, hs.size() * 4},
            {"logits", DType::F32, kLogits, hl.data(), MemoryKind::Host, hl.size() * 4}},
           stream.s);
  expect_same({hs, hl}, host, "device inputs, host outputs");  // host outputs: written when run returns
  // Against the CPU backend (same bundle), numerically.
  const auto cpu = load("cpu")->create_context()->run({{"a", kIn, a}, {"b", kIn, b}});
  EXPECT_EQ(host[0].data, cpu[0].data);  // relu(a + b) is exact in f32
  EXPECT_LE(testing::max_abs_diff(host[1].data, cpu[1].data), 1e-5f * testing::max_abs(cpu[1].data));
}

TEST(CudaViews, DeviceOnlyCallDoesNotWaitAndCallsOnTwoStreamsAreOrdered) {
  REQUIRE_GPU();
  auto engine = load();
  auto ctx = engine->create_context();
  const auto a1 = random_values(kInValues, 3), b1 = random_values(kInValues, 4);
  const auto a2 = random_values(kInValues, 5), b2 = random_values(kInValues, 6);
  StreamHolder s1, s2;
  DeviceCall first(a1, b1), second(a2, b2);
  ctx->run(first.inputs(), first.outputs(), s1.s);  // capture outside the timed part
  CK(cudaStreamSynchronize(s1.s));
  // Hold s1 behind a host function until released: a call that waited for
  // s1 would not return before the release.
  struct Gate {
    std::atomic<bool> release{false}, passed{false};
  } gate;
  CK(cudaLaunchHostFunc(
      s1.s,
      [](void* p) {
        auto* g = static_cast<Gate*>(p);
        const auto t0 = std::chrono::steady_clock::now();
        while (!g->release && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(20))
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        g->passed = true;
      },
      &gate));
  ctx->run(first.inputs(), first.outputs(), s1.s);
  // The next call on another stream reuses the context's buffers: it must wait for the first (on the GPU, not here).
  ctx->run(second.inputs(), second.outputs(), s2.s);
  EXPECT_FALSE(gate.passed) << "run waited for the caller's stream";
  gate.release = true;
  CK(cudaStreamSynchronize(s1.s));
  CK(cudaStreamSynchronize(s2.s));
  expect_same(first.read(), ctx->run({{"a", kIn, a1}, {"b", kIn, b1}}), "first call");
  expect_same(second.read(), ctx->run({{"a", kIn, a2}, {"b", kIn, b2}}), "second call, other stream");
}

TEST(CudaViews, MemoryKindsAreCheckedByNameBeforeAnythingRuns) {
  REQUIRE_GPU();
  auto ctx = load()->create_context();
  const auto a = random_values(kInValues, 1), b = random_values(kInValues, 2);
  DeviceCall d(a, b);
  auto error_of = [&](const std::vector<TensorView>& in, const std::vector<MutableTensorView>& out) {
    try {
      ctx->run(in, out, nullptr);
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::Input) << e.what();
      return std::string(e.what());
    }
    ADD_FAILURE() << "accepted";
    return std::string();
  };
  auto in = d.inputs();
  in[1] = {"b", DType::F32, kIn, b.data(), MemoryKind::Device};
  EXPECT_NE(error_of(in, d.outputs()).find("input 'b' is not device memory"), std::string::npos);
  auto out = d.outputs();
  out[0].where = MemoryKind::Host;
  EXPECT_NE(error_of(d.inputs(), out).find("output 'sum' is device memory, given as MemoryKind::Host"), std::string::npos);
  in = d.inputs();
  in[0].dtype = DType::F16;
  EXPECT_NE(error_of(in, d.outputs()).find("input 'a' is f16 device memory"), std::string::npos);
  for (const auto& o : d.read())
    for (float x : o) ASSERT_TRUE(std::isnan(x)) << "an output was written";
}

TEST(CudaViews, CAbiRunsDevicePointersOnAStream) {
  REQUIRE_GPU();
  const std::filesystem::path path =
      std::filesystem::temp_directory_path() / ("kiln_gpu_views_" + std::to_string(::getpid()) + ".bundle");
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(cuda_bundle().data()), cuda_bundle().size());
  kiln_engine* e = nullptr;
  ASSERT_EQ(kiln_engine_load(path.c_str(), nullptr, &e), KILN_OK) << kiln_last_error();
  kiln_context* c = nullptr;
  ASSERT_EQ(kiln_context_create(e, &c), KILN_OK) << kiln_last_error();
  const auto a = random_values(kInValues, 8), b = random_values(kInValues, 9);
  DeviceCall d(a, b);
  const int64_t in_shape[4] = {kBatch, kViewC, kViewHW, kViewHW}, logits_shape[2] = {kBatch, kViewClasses};
  const kiln_tensor in[2] = {{"b", KILN_DTYPE_F32, 4, in_shape, d.b, kInValues * 4, KILN_MEMORY_DEVICE},
                             {"a", KILN_DTYPE_F32, 4, in_shape, d.a, kInValues * 4, KILN_MEMORY_DEVICE}};
  const kiln_tensor out[2] = {{"logits", KILN_DTYPE_F32, 2, logits_shape, d.logits, kLogitValues * 4, KILN_MEMORY_DEVICE},
                              {"sum", KILN_DTYPE_F32, 4, in_shape, d.sum, kInValues * 4, KILN_MEMORY_DEVICE}};
  StreamHolder stream;
  ASSERT_EQ(kiln_context_run_n(c, in, 2, out, 2, stream.s), KILN_OK) << kiln_last_error();
  CK(cudaStreamSynchronize(stream.s));
  expect_same(d.read(), load()->create_context()->run({{"a", kIn, a}, {"b", kIn, b}}), "C ABI, device pointers");
  kiln_context_free(c);
  kiln_engine_free(e);
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace kiln
