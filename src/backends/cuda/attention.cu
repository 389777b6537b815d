// attention (ops.def; attention.cpp lowers it, ref/attention.cpp says what it
// computes): multi-head scaled dot-product attention in one kernel, for the
// short token sequences of detection transformers (RT-DETR: 400 encoder
// tokens, 300 decoder queries, head width 32). One block per (image, head,
// 16 queries): the head's k (transposed) and v go to shared memory in f32
// once; each warp then takes a query at a time: lanes compute the scores of
// keys lane, lane+32, ... (f32), the warp reduces max and sum of the
// exponentials, and each lane sums probability x v for its output channels.
// The heads are read and written in place in the [N, L, H*D] token layout,
// so the split/transposes and the merge of the unfused form disappear too.
// Our own kernel, not cuDNN's SDPA graph: that one wants its own layouts
// and runtime-compiles per shape, and at these sizes the whole attention of a
// head fits one block's shared memory. When k and v do not fit, the same
// kernel reads them from global memory (L2) instead.
#include <cfloat>
#include <cstdint>

#include "backends/cuda/device_common.cuh"
#include "backends/cuda/kernels.hpp"

namespace kiln::cuda {
namespace {

using dev::from_f32;
using dev::to_f32;

constexpr int kWarps = 8, kQueriesPerBlock = 16;

__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

template <typename T, bool kShared>
__global__ void __launch_bounds__(kWarps * 32) attention_kernel(const T* __restrict__ q, const T* __restrict__ k,
                                                                const T* __restrict__ v, T* __restrict__ y, AttentionShape s) {
  dev::enter_grid();
  extern __shared__ float smem[];
  const int h = blockIdx.y, lk = s.lk, d = s.d, dv = s.dv;
  const int64_t n = blockIdx.z, cq = int64_t(s.heads) * d, cv = int64_t(s.heads) * dv;
  const T* kh = k + n * lk * cq + int64_t(h) * d;  // row j, channel c: kh[j * cq + c]
  const T* vh = v + n * lk * cv + int64_t(h) * dv;
  // k transposed with an odd row stride: the lanes' reads kt[c * ldk + j]
  // (j = lane + 32t) and the loader's writes (one c per thread) hit 32 banks.
  const int ldk = lk | 1;
  float* kt = smem;                           // kShared: [d][ldk]
  float* vs = kt + (kShared ? d * ldk : 0);   // kShared: [lk][dv]
  float* pw = vs + (kShared ? lk * dv : 0);   // [kWarps][lk]: each warp's scores, then exponentials
  float* qw = pw + kWarps * lk;               // [kWarps][d]: each warp's query
  if (kShared) {
    // 16-byte loads when rows allow (s.vec, checked by the launcher): the
    // block's load of k and v is latency-bound, and 8 halves per load cut its
    // round trips 8-fold.
    constexpr int V = 16 / int(sizeof(T));
    if (s.vec) {
      const int dq = d / V, dvq = dv / V;
      for (int i = threadIdx.x; i < lk * dq; i += blockDim.x) {
        const int j = i / dq, c0 = (i % dq) * V;
        float f[V];
        dev::load_vec<T, V>(kh + int64_t(j) * cq + c0, f);
#pragma unroll
        for (int e = 0; e < V; ++e) kt[(c0 + e) * ldk + j] = f[e];
      }
      for (int i = threadIdx.x; i < lk * dvq; i += blockDim.x) {
        const int j = i / dvq, c0 = (i % dvq) * V;
        float f[V];
        dev::load_vec<T, V>(vh + int64_t(j) * cv + c0, f);
#pragma unroll
        for (int e = 0; e < V; ++e) vs[j * dv + c0 + e] = f[e];
      }
    } else {
      for (int i = threadIdx.x; i < lk * d; i += blockDim.x) kt[(i % d) * ldk + i / d] = to_f32(kh[int64_t(i / d) * cq + i % d]);
      for (int i = threadIdx.x; i < lk * dv; i += blockDim.x) vs[i] = to_f32(vh[int64_t(i / dv) * cv + i % dv]);
    }
    __syncthreads();
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float* p = pw + warp * lk;
  float* qq = qw + warp * d;
  const int first = blockIdx.x * kQueriesPerBlock, last = min(s.lq, first + kQueriesPerBlock);
  for (int i = first + warp; i < last; i += kWarps) {
    const T* qi = q + (n * s.lq + i) * cq + int64_t(h) * d;
    for (int c = lane; c < d; c += 32) qq[c] = to_f32(qi[c]);
    __syncwarp();
    float mx = -FLT_MAX;
    for (int j = lane; j < lk; j += 32) {
      float acc = 0.f;
      if (kShared)
        for (int c = 0; c < d; ++c) acc += qq[c] * kt[c * ldk + j];
      else
        for (int c = 0; c < d; ++c) acc += qq[c] * to_f32(kh[int64_t(j) * cq + c]);
      acc *= s.scale;
      p[j] = acc;
      mx = fmaxf(mx, acc);
    }
    mx = warp_max(mx);
    float sum = 0.f;
    for (int j = lane; j < lk; j += 32) {
      const float e = expf(p[j] - mx);
      p[j] = e;
      sum += e;
    }
    sum = warp_sum(sum);
    __syncwarp();  // every lane's exponentials are in p
    const float inv = 1.f / sum;
    T* yi = y + (n * s.lq + i) * cv + int64_t(h) * dv;
    for (int c = lane; c < dv; c += 32) {
      float acc = 0.f;
      if (kShared)
        for (int j = 0; j < lk; ++j) acc += p[j] * vs[j * dv + c];
      else
        for (int j = 0; j < lk; ++j) acc += p[j] * to_f32(vh[int64_t(j) * cv + c]);
      yi[c] = from_f32<T>(acc * inv);
    }
    __syncwarp();  // p and qq are free for the warp's next query
  }
}

size_t smem_bytes(const AttentionShape& s, bool shared_kv) {
  return sizeof(float) * ((shared_kv ? size_t(s.lk | 1) * s.d + size_t(s.lk) * s.dv : 0) + size_t(kWarps) * (s.lk + s.d));
}

}  // namespace

bool attention_kv_in_shared(const AttentionShape& s) { return smem_bytes(s, true) <= kMaxAttentionSmem; }
bool attention_fits(const AttentionShape& s) { return smem_bytes(s, false) <= kMaxAttentionSmem; }

void attention(const void* q, const void* k, const void* v_, void* y, DType dt, const AttentionShape& s, cudaStream_t stream) {
  if (s.n <= 0) return;
  if (s.n > 65535 || s.heads > 65535 || s.lq < 1 || s.lk < 1 || s.d < 1 || s.dv < 1 || !attention_fits(s))
    fail_runtime("cuda attention: unsupported shape (n ", s.n, ", heads ", s.heads, ", lq ", s.lq, ", lk ", s.lk, ", d ", s.d,
                 ", dv ", s.dv, ")");
  const bool shared_kv = attention_kv_in_shared(s);
  const size_t smem = smem_bytes(s, shared_kv);
  AttentionShape a = s;
  const dim3 grid((s.lq + kQueriesPerBlock - 1) / kQueriesPerBlock, s.heads, unsigned(s.n));
  detail::dispatch_float(dt, "attention", [&](auto t) {
    using T = decltype(t);
    const int per16 = 16 / int(sizeof(T));
    auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
    a.vec = s.d % per16 == 0 && s.dv % per16 == 0 && aligned(k) && aligned(v_);
    auto kernel = shared_kv ? attention_kernel<T, true> : attention_kernel<T, false>;
    KILN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    detail::launch("attention", kernel, grid, kWarps * 32, smem, stream, static_cast<const T*>(q), static_cast<const T*>(k),
                   static_cast<const T*>(v_), static_cast<T*>(y), a);
  });
}

}  // namespace kiln::cuda
