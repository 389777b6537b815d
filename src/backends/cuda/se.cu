// Squeeze-excitation MLP: s = gate(W2 · act(W1 · g + b1) + b2) for each image,
// where g is the globally pooled [n, c] tensor. cuDNN would run this as two
// 1x1 convolutions on 1x1 images, each a GEMM far too small for its tiles;
// here two small kernels spread the dot products over the whole GPU:
//   reduce: one block per (hidden unit, image), the block's threads split the
//           c-long dot product (coalesced rows of W1), hidden -> workspace;
//   expand: one thread per (output channel, image), the cr-long dot product
//           from the hidden vector in shared memory.
// (A first version ran everything in one block per image: at batch 1 the
// weight loads of one SM were latency-bound, 0.1 ms for c = 1152.)
// Each hidden/output value is rounded to the engine's storage type exactly
// where the unfused graph stores it, so the numbers equal the two-conv path.
#include <algorithm>

#include "backends/cuda/device_common.cuh"
#include "backends/cuda/kernels.hpp"

namespace kiln::cuda {

namespace {

constexpr int kReduceThreads = 128;
constexpr int kExpandThreads = 128;

template <typename T, Activation A1>
__global__ void se_reduce_kernel(const T* __restrict__ g, const T* __restrict__ w1, const T* __restrict__ b1,
                                 float* __restrict__ hidden, int c, int cr) {
  dev::enter_grid();
  __shared__ float part[kReduceThreads / 32];
  const int r = blockIdx.x, n = blockIdx.y;
  const T* gr = g + int64_t(n) * c;
  const T* wr = w1 + int64_t(r) * c;
  // Four independent accumulators keep several loads in flight per thread.
  float a0 = 0.f, a1 = 0.f, a2 = 0.f, a3 = 0.f;
  int i = threadIdx.x;
  constexpr int B = kReduceThreads;
  for (; i + 3 * B < c; i += 4 * B) {
    a0 += dev::to_f32(wr[i]) * dev::to_f32(gr[i]);
    a1 += dev::to_f32(wr[i + B]) * dev::to_f32(gr[i + B]);
    a2 += dev::to_f32(wr[i + 2 * B]) * dev::to_f32(gr[i + 2 * B]);
    a3 += dev::to_f32(wr[i + 3 * B]) * dev::to_f32(gr[i + 3 * B]);
  }
  for (; i < c; i += B) a0 += dev::to_f32(wr[i]) * dev::to_f32(gr[i]);
  float acc = (a0 + a1) + (a2 + a3);
  for (int o = 16; o > 0; o /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    float sum = 0.f;
#pragma unroll
    for (int k = 0; k < B / 32; ++k) sum += part[k];
    hidden[int64_t(n) * cr + r] = dev::to_f32(dev::from_f32<T>(dev::act<A1, dev::kFastMath<T>>(sum + dev::to_f32(b1[r]))));
  }
}

// s[n, r] as the unfused graph stores it (rounded to T), from the hidden
// vector in shared memory; shared by both expand kernels so they agree bit for bit.
template <typename T, Activation A2>
__device__ __forceinline__ float se_gate(const float* hs, const T* __restrict__ w2, const T* __restrict__ b2, int r, int cr) {
  const T* wr = w2 + int64_t(r) * cr;
  float a0 = 0.f, a1 = 0.f, a2 = 0.f, a3 = 0.f;
  int i = 0;
  for (; i + 3 < cr; i += 4) {
    a0 += dev::to_f32(wr[i]) * hs[i];
    a1 += dev::to_f32(wr[i + 1]) * hs[i + 1];
    a2 += dev::to_f32(wr[i + 2]) * hs[i + 2];
    a3 += dev::to_f32(wr[i + 3]) * hs[i + 3];
  }
  for (; i < cr; ++i) a0 += dev::to_f32(wr[i]) * hs[i];
  const float acc = (a0 + a1) + (a2 + a3);
  return dev::to_f32(dev::from_f32<T>(dev::act<A2, dev::kFastMath<T>>(acc + dev::to_f32(b2[r]))));
}

// Image n's hidden vector into shared memory (every thread of the block waits).
__device__ __forceinline__ void load_hidden(float* hs, const float* __restrict__ hidden, int n, int cr) {
  for (int i = threadIdx.x; i < cr; i += blockDim.x) hs[i] = hidden[int64_t(n) * cr + i];
  __syncthreads();
}

template <typename T, Activation A2>
__global__ void se_expand_kernel(const float* __restrict__ hidden, const T* __restrict__ w2, const T* __restrict__ b2,
                                 T* __restrict__ s, int c, int cr) {
  dev::enter_grid();
  extern __shared__ float hs[];  // [cr]
  const int n = blockIdx.y;
  load_hidden(hs, hidden, n, cr);
  const int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= c) return;
  s[int64_t(n) * c + r] = dev::from_f32<T>(se_gate<T, A2>(hs, w2, b2, r, cr));
}

// The gate applied at once: y[n, p, r] = x[n, p, r] * s[n, r] for the pixels
// [blockIdx.y * ppb, +ppb) of image blockIdx.z, s never stored (it would be
// written and read back by a separate mul launch). Each block recomputes its
// 128 gates (cr multiply-adds each, from L2), then streams its pixels.
template <typename T, Activation A2>
__global__ void se_expand_scale_kernel(const float* __restrict__ hidden, const T* __restrict__ w2,
                                       const T* __restrict__ b2, const T* x, T* y, int c,
                                       int cr, int hw, int ppb) {
  dev::enter_grid();
  extern __shared__ float hs[];  // [cr]
  const int n = blockIdx.z;
  load_hidden(hs, hidden, n, cr);
  const int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= c) return;
  const float sv = se_gate<T, A2>(hs, w2, b2, r, cr);
  const int p0 = blockIdx.y * ppb, p1 = min(hw, p0 + ppb);
  const int64_t base = int64_t(n) * hw * c + r;
  int p = p0;
  for (; p + 3 < p1; p += 4) {  // four loads in flight
    const float f0 = dev::to_f32(x[base + int64_t(p) * c]), f1 = dev::to_f32(x[base + int64_t(p + 1) * c]);
    const float f2 = dev::to_f32(x[base + int64_t(p + 2) * c]), f3 = dev::to_f32(x[base + int64_t(p + 3) * c]);
    y[base + int64_t(p) * c] = dev::from_f32<T>(f0 * sv);
    y[base + int64_t(p + 1) * c] = dev::from_f32<T>(f1 * sv);
    y[base + int64_t(p + 2) * c] = dev::from_f32<T>(f2 * sv);
    y[base + int64_t(p + 3) * c] = dev::from_f32<T>(f3 * sv);
  }
  for (; p < p1; ++p) y[base + int64_t(p) * c] = dev::from_f32<T>(dev::to_f32(x[base + int64_t(p) * c]) * sv);
}

}  // namespace

size_t se_mlp_workspace_bytes(int n, int cr) { return size_t(std::max(n, 0)) * size_t(std::max(cr, 0)) * sizeof(float); }

namespace {

// Checks shared by both entry points; launches the reduce kernel (hidden -> workspace).
template <typename F>
void se_launch(const void* g, const void* w1, const void* b1, DType dt, int n, int c, int cr, Activation act1,
               void* workspace, size_t workspace_bytes, cudaStream_t stream, const char* name, F&& expand) {
  if (workspace_bytes < se_mlp_workspace_bytes(n, cr))
    fail_runtime("cuda ", name, ": workspace of ", workspace_bytes, " bytes is below the ", se_mlp_workspace_bytes(n, cr),
                 " it needs");
  if (n > 65535 || cr > 65535) fail_runtime("cuda ", name, ": batch ", n, " or ", cr, " hidden units exceed the grid limit");
  if (size_t(cr) * sizeof(float) > 48 * 1024) fail_runtime("cuda ", name, ": ", cr, " hidden units exceed the shared-memory budget");
  float* hidden = static_cast<float*>(workspace);
  detail::dispatch_float(dt, name, [&](auto t) {
    using T = decltype(t);
    detail::dispatch_act(act1, [&](auto a1) {
      detail::launch(name, se_reduce_kernel<T, decltype(a1)::value>, dim3(cr, n), kReduceThreads, 0, stream,
          static_cast<const T*>(g), static_cast<const T*>(w1), static_cast<const T*>(b1), hidden, c, cr);
    });
    expand(t, hidden);
  });
}

}  // namespace

void se_mlp(const void* g, const void* w1, const void* b1, const void* w2, const void* b2, void* s, DType dt, int n, int c,
            int cr, Activation act1, Activation act2, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  if (n <= 0 || c <= 0 || cr <= 0) return;
  se_launch(g, w1, b1, dt, n, c, cr, act1, workspace, workspace_bytes, stream, "se_mlp", [&](auto t, float* hidden) {
    using T = decltype(t);
    detail::dispatch_act(act2, [&](auto a2) {
      detail::launch("se_mlp", se_expand_kernel<T, decltype(a2)::value>,
          dim3((c + kExpandThreads - 1) / kExpandThreads, n), kExpandThreads, size_t(cr) * sizeof(float), stream,
          hidden, static_cast<const T*>(w2), static_cast<const T*>(b2), static_cast<T*>(s), c, cr);
    });
  });
}

void se_mlp_scale(const void* g, const void* w1, const void* b1, const void* w2, const void* b2, const void* x, void* y,
                  DType dt, int n, int hw, int c, int cr, Activation act1, Activation act2, void* workspace,
                  size_t workspace_bytes, cudaStream_t stream) {
  if (n <= 0 || c <= 0 || cr <= 0 || hw <= 0) return;
  // About four blocks per SM over (channel blocks x pixel chunks x images).
  const int cblocks = (c + kExpandThreads - 1) / kExpandThreads;
  const int64_t want = (4 * int64_t(detail::sm_count()) + int64_t(cblocks) * n - 1) / (int64_t(cblocks) * n);
  const int chunks0 = int(std::max<int64_t>(1, std::min<int64_t>({want, int64_t(hw), 65535})));
  const int ppb = (hw + chunks0 - 1) / chunks0;
  const int chunks = (hw + ppb - 1) / ppb;
  se_launch(g, w1, b1, dt, n, c, cr, act1, workspace, workspace_bytes, stream, "se_mlp_scale", [&](auto t, float* hidden) {
    using T = decltype(t);
    detail::dispatch_act(act2, [&](auto a2) {
      detail::launch("se_mlp_scale", se_expand_scale_kernel<T, decltype(a2)::value>, dim3(cblocks, chunks, n),
          kExpandThreads, size_t(cr) * sizeof(float), stream, hidden, static_cast<const T*>(w2),
          static_cast<const T*>(b2), static_cast<const T*>(x), static_cast<T*>(y), c, cr, hw, ppb);
    });
  });
}

}  // namespace kiln::cuda
