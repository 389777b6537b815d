// Helpers shared by the CUDA op harness: device buffers holding engine-typed
// data, host NCHW<->NHWC conversion, storage rounding and the tolerance check.
#pragma once
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.hpp"
#include "core/half.hpp"

namespace kiln::cuda::test {

#define KILN_REQUIRE_GPU()                                                  \
  do {                                                                      \
    int kiln_ndev_ = 0;                                                     \
    if (cudaGetDeviceCount(&kiln_ndev_) != cudaSuccess || kiln_ndev_ == 0) { \
      cudaGetLastError();                                                   \
      GTEST_SKIP() << "no CUDA device";                                     \
    }                                                                       \
  } while (0)

#define CK(expr) ASSERT_EQ((expr), cudaSuccess) << #expr

inline const DType kFloatTypes[] = {DType::F32, DType::F16, DType::BF16};

// The element-wise error measure: max |got - ref| / max(1, |ref|), with the
// reference computed in f32 from inputs already rounded to the storage type.
// f32: only op-order differences; f16/bf16: half an ulp of the stored
// result (2^-11, 2^-8) plus headroom.
inline double elementwise_tol(DType dt) {
  return dt == DType::F32 ? 1e-5 : dt == DType::F16 ? 2e-3 : 1.6e-2;
}

inline float round_to(float v, DType dt) {
  return round_to_storage(dt, v);
}
inline std::vector<float> round_all(std::vector<float> v, DType dt) {
  for (float& f : v) f = round_to(f, dt);
  return v;
}

inline std::vector<float> random_values(size_t count, uint32_t seed, float lo = -3.f, float hi = 3.f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(count);
  for (float& f : v) f = dist(gen);
  return v;
}

inline std::vector<uint8_t> encode(const std::vector<float>& v, DType dt) {
  std::vector<uint8_t> out(v.size() * dtype_size(dt));
  for (size_t i = 0; i < v.size(); ++i) {
    if (dt == DType::F32) {
      std::memcpy(&out[i * 4], &v[i], 4);
    } else {
      const uint16_t h = dt == DType::F16 ? f32_to_f16(v[i]) : f32_to_bf16(v[i]);
      std::memcpy(&out[i * 2], &h, 2);
    }
  }
  return out;
}

inline std::vector<float> decode(const std::vector<uint8_t>& b, DType dt) {
  const size_t es = dtype_size(dt);
  std::vector<float> out(b.size() / es);
  for (size_t i = 0; i < out.size(); ++i) {
    if (dt == DType::F32) {
      std::memcpy(&out[i], &b[i * 4], 4);
    } else {
      uint16_t h;
      std::memcpy(&h, &b[i * 2], 2);
      out[i] = dt == DType::F16 ? f16_to_f32(h) : bf16_to_f32(h);
    }
  }
  return out;
}

// A device allocation; `offset_bytes` shifts the pointer handed to kernels
// so tests can exercise the unaligned (scalar) paths.
class DevBuf {
 public:
  explicit DevBuf(size_t bytes, size_t offset_bytes = 0) : off_(offset_bytes) {
    if (cudaMalloc(&base_, bytes + offset_bytes + 16) != cudaSuccess) base_ = nullptr;
  }
  ~DevBuf() { cudaFree(base_); }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  void* ptr() const { return static_cast<char*>(base_) + off_; }
  template <typename T>
  T* as() const { return static_cast<T*>(ptr()); }

 private:
  void* base_ = nullptr;
  size_t off_;
};

// Mean microseconds per launch over 100 launches after 5 warm-ups, timed by
// events on st (the probes print it; no test asserts a time).
inline double mean_launch_us(cudaStream_t st, const std::function<void()>& launch) {
  for (int i = 0; i < 5; ++i) launch();
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  cudaEventRecord(e0, st);
  for (int i = 0; i < 100; ++i) launch();
  cudaEventRecord(e1, st);
  cudaEventSynchronize(e1);
  float ms = 0;
  cudaEventElapsedTime(&ms, e0, e1);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return ms * 1000.0 / 100.0;
}

// The same, with one call of `launch` captured into a CUDA graph and the graph
// replayed: what a launch costs inside an engine's graph (PDL edges kept).
inline double mean_graph_us(cudaStream_t st, const std::function<void()>& launch) {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal);
  launch();
  cudaStreamEndCapture(st, &graph);
  if (cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess) {
    ADD_FAILURE() << "mean_graph_us: the captured launches did not instantiate";
    cudaGraphDestroy(graph);
    return 0;
  }
  const double us = mean_launch_us(st, [&] { cudaGraphLaunch(exec, st); });
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  return us;
}

inline std::unique_ptr<DevBuf> upload(const std::vector<float>& v, DType dt, size_t offset_elems = 0) {
  const auto bytes = encode(v, dt);
  auto d = std::make_unique<DevBuf>(bytes.size(), offset_elems * dtype_size(dt));
  cudaMemcpy(d->ptr(), bytes.data(), bytes.size(), cudaMemcpyHostToDevice);
  return d;
}
inline std::unique_ptr<DevBuf> alloc(size_t count, DType dt, size_t offset_elems = 0) {
  auto d = std::make_unique<DevBuf>(count * dtype_size(dt), offset_elems * dtype_size(dt));
  cudaMemset(d->ptr(), 0xff, count * dtype_size(dt));  // NaN poison: unwritten outputs fail the check
  return d;
}
// n bytes at device address p. Synchronises the device so launch and kernel
// faults show up here.
inline std::vector<uint8_t> download_bytes(const void* p, size_t n) {
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<uint8_t> b(n);
  EXPECT_EQ(cudaMemcpy(b.data(), p, n, cudaMemcpyDeviceToHost), cudaSuccess);
  return b;
}
inline std::vector<float> download(const void* p, size_t count, DType dt) {
  return decode(download_bytes(p, count * dtype_size(dt)), dt);
}

inline std::vector<float> nchw_to_nhwc(const std::vector<float>& x, int n, int c, int h, int w) {
  std::vector<float> y(x.size());
  for (int b = 0; b < n; ++b)
    for (int ch = 0; ch < c; ++ch)
      for (int p = 0; p < h * w; ++p) y[(size_t(b) * h * w + p) * c + ch] = x[(size_t(b) * c + ch) * h * w + p];
  return y;
}
inline std::vector<float> nhwc_to_nchw(const std::vector<float>& x, int n, int c, int h, int w) {
  std::vector<float> y(x.size());
  for (int b = 0; b < n; ++b)
    for (int ch = 0; ch < c; ++ch)
      for (int p = 0; p < h * w; ++p) y[(size_t(b) * c + ch) * h * w + p] = x[(size_t(b) * h * w + p) * c + ch];
  return y;
}

// Per-element error measure err_i = |got - ref| / scale_i (scale_i defaults to
// max(1, |ref|)); fails when the worst exceeds tol. Equal infinities pass.
inline void expect_close(const std::vector<float>& got, const std::vector<float>& ref, double tol,
                         const std::string& what, const std::vector<float>* scale = nullptr) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  double worst = 0;
  size_t at = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (std::isinf(ref[i]) && got[i] == ref[i]) continue;
    const double s = scale ? double((*scale)[i]) : std::max(1.0, std::fabs(double(ref[i])));
    double err = std::fabs(double(got[i]) - double(ref[i])) / s;
    if (std::isnan(err)) err = INFINITY;
    if (err > worst || (i == 0 && err == 0)) worst = err, at = i;
  }
  EXPECT_LE(worst, tol) << what << ": worst at " << at << " got " << got[at] << " ref " << ref[at];
}

// Mean microseconds per launch: 20 launches in one graph, 30 replays after 5 warm-ups.
inline double graph_us(cudaStream_t st, const std::function<void()>& launch) {
  constexpr int kPerGraph = 20, kReplays = 30;
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  EXPECT_EQ(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  for (int i = 0; i < kPerGraph; ++i) launch();
  EXPECT_EQ(cudaStreamEndCapture(st, &graph), cudaSuccess);
  EXPECT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (int i = 0; i < 5; ++i) cudaGraphLaunch(exec, st);
  cudaEvent_t a, b;
  cudaEventCreate(&a), cudaEventCreate(&b);
  cudaEventRecord(a, st);
  for (int i = 0; i < kReplays; ++i) cudaGraphLaunch(exec, st);
  cudaEventRecord(b, st);
  cudaEventSynchronize(b);
  float ms = 0;
  cudaEventElapsedTime(&ms, a, b);
  cudaEventDestroy(a), cudaEventDestroy(b);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  return 1000.0 * ms / (kPerGraph * kReplays);
}

}  // namespace kiln::cuda::test
