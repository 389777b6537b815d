// Squeeze-excitation MLP in one launch: s = gate(W2 · act(W1 · g + b1) + b2)
// for each image, where g is the globally pooled [n, c] tensor. cuDNN would
// run this as two 1x1 convolutions on 1x1 images (two launches that are all
// overhead at batch 1); here one block per image keeps g and the hidden
// vector in shared memory. Each hidden/output value is rounded to the
// engine's storage type exactly where the unfused graph stores it, so the
// numbers equal the two-conv path.
#include "backends/cuda/device_common.cuh"
#include "backends/cuda/kernels.hpp"

namespace kiln::cuda {

namespace {

template <typename T, Activation A1, Activation A2>
__global__ void se_mlp_kernel(const T* __restrict__ g, const T* __restrict__ w1, const T* __restrict__ b1,
                              const T* __restrict__ w2, const T* __restrict__ b2, T* __restrict__ s, int c, int cr) {
  extern __shared__ float smem[];
  float* gs = smem;       // [c]
  float* hs = smem + c;   // [cr]
  const int n = blockIdx.x;
  for (int i = threadIdx.x; i < c; i += blockDim.x) gs[i] = dev::to_f32(g[int64_t(n) * c + i]);
  __syncthreads();
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  // One warp per output row: coalesced weight reads, shuffle reduction.
  for (int r = warp; r < cr; r += warps) {
    float acc = 0.f;
    for (int i = lane; i < c; i += 32) acc += dev::to_f32(w1[int64_t(r) * c + i]) * gs[i];
    for (int o = 16; o > 0; o /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if (lane == 0) hs[r] = dev::to_f32(dev::from_f32<T>(dev::act<A1, dev::kFastMath<T>>(acc + dev::to_f32(b1[r]))));
  }
  __syncthreads();
  for (int r = warp; r < c; r += warps) {
    float acc = 0.f;
    for (int i = lane; i < cr; i += 32) acc += dev::to_f32(w2[int64_t(r) * cr + i]) * hs[i];
    for (int o = 16; o > 0; o /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if (lane == 0) s[int64_t(n) * c + r] = dev::from_f32<T>(dev::act<A2, dev::kFastMath<T>>(acc + dev::to_f32(b2[r])));
  }
}

}  // namespace

void se_mlp(const void* g, const void* w1, const void* b1, const void* w2, const void* b2, void* s, DType dt, int n, int c,
            int cr, Activation act1, Activation act2, cudaStream_t stream) {
  if (n <= 0 || c <= 0 || cr <= 0) return;
  const size_t smem = size_t(c + cr) * sizeof(float);
  if (smem > 48 * 1024) fail_runtime("cuda se_mlp: ", c, "+", cr, " channels exceed the shared-memory budget");
  detail::dispatch_float(dt, "se_mlp", [&](auto t) {
    using T = decltype(t);
    detail::dispatch_act(act1, [&](auto a1) {
      detail::dispatch_act(act2, [&](auto a2) {
        se_mlp_kernel<T, decltype(a1)::value, decltype(a2)::value><<<n, 256, smem, stream>>>(
            static_cast<const T*>(g), static_cast<const T*>(w1), static_cast<const T*>(b1), static_cast<const T*>(w2),
            static_cast<const T*>(b2), static_cast<T*>(s), c, cr);
      });
    });
  });
  detail::check_launch("se_mlp");
}

}  // namespace kiln::cuda
