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
#include "backends/cuda/device_common.cuh"
#include "backends/cuda/kernels.hpp"

namespace kiln::cuda {

namespace {

constexpr int kReduceThreads = 128;
constexpr int kExpandThreads = 128;

template <typename T, Activation A1>
__global__ void se_reduce_kernel(const T* __restrict__ g, const T* __restrict__ w1, const T* __restrict__ b1,
                                 float* __restrict__ hidden, int c, int cr) {
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

template <typename T, Activation A2>
__global__ void se_expand_kernel(const float* __restrict__ hidden, const T* __restrict__ w2, const T* __restrict__ b2,
                                 T* __restrict__ s, int c, int cr) {
  extern __shared__ float hs[];  // [cr]
  const int n = blockIdx.y;
  for (int i = threadIdx.x; i < cr; i += blockDim.x) hs[i] = hidden[int64_t(n) * cr + i];
  __syncthreads();
  const int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= c) return;
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
  s[int64_t(n) * c + r] = dev::from_f32<T>(dev::act<A2, dev::kFastMath<T>>(acc + dev::to_f32(b2[r])));
}

}  // namespace

size_t se_mlp_workspace_bytes(int n, int cr) { return size_t(std::max(n, 0)) * size_t(std::max(cr, 0)) * sizeof(float); }

void se_mlp(const void* g, const void* w1, const void* b1, const void* w2, const void* b2, void* s, DType dt, int n, int c,
            int cr, Activation act1, Activation act2, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  if (n <= 0 || c <= 0 || cr <= 0) return;
  if (workspace_bytes < se_mlp_workspace_bytes(n, cr))
    fail_runtime("cuda se_mlp: workspace of ", workspace_bytes, " bytes is below the ", se_mlp_workspace_bytes(n, cr),
                 " it needs");
  if (n > 65535 || cr > 65535) fail_runtime("cuda se_mlp: batch ", n, " or ", cr, " hidden units exceed the grid limit");
  const size_t smem = size_t(cr) * sizeof(float);
  if (smem > 48 * 1024) fail_runtime("cuda se_mlp: ", cr, " hidden units exceed the shared-memory budget");
  float* hidden = static_cast<float*>(workspace);
  detail::dispatch_float(dt, "se_mlp", [&](auto t) {
    using T = decltype(t);
    detail::dispatch_act(act1, [&](auto a1) {
      se_reduce_kernel<T, decltype(a1)::value><<<dim3(cr, n), kReduceThreads, 0, stream>>>(
          static_cast<const T*>(g), static_cast<const T*>(w1), static_cast<const T*>(b1), hidden, c, cr);
    });
    detail::check_launch("se_mlp reduce");
    detail::dispatch_act(act2, [&](auto a2) {
      se_expand_kernel<T, decltype(a2)::value><<<dim3((c + kExpandThreads - 1) / kExpandThreads, n), kExpandThreads, smem,
                                                  stream>>>(hidden, static_cast<const T*>(w2), static_cast<const T*>(b2),
                                                            static_cast<T*>(s), c, cr);
    });
  });
  detail::check_launch("se_mlp expand");
}

}  // namespace kiln::cuda
