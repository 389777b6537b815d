// One row of layer_norm_rows' register path (norm.cu's layer_norm_vec_kernel;
// small_gemm.cu's small_gemm_norm runs it on rows in shared memory), so both
// give the same bits: lane `lane` of a warp holds the 16-byte vectors lane,
// lane + 32, ... of the row (at most N; lanes past c / V vectors hold none),
// the mean and then the squared deviations are summed from registers (f32,
// warp_sum's butterfly), y rounded once to T. Pointers are the row's own
// (x2, pos, y_pos, y_f32 null: not read / written; x2: the row is x + x2 as
// an add step stores it; y_pos: y + pos as an add step; y_f32: y widened).
// Every pointer 16-byte aligned, c a multiple of V = 16 / sizeof(T).
#pragma once
#include "backends/cuda/device_common.cuh"

namespace kiln::cuda::dev {

template <typename T, int N>
__device__ __forceinline__ void layer_norm_row_vec(const T* x, const T* x2, const T* weight, const T* bias, T* y, const T* pos,
                                                   T* y_pos, float* y_f32, int c, float eps, int lane) {
  constexpr int V = kVec16<T>;
  const int vecs = c / V;
  // weight, bias and pos of a vector: loaded with the row when a lane holds at
  // most two vectors (no second round trip after the reductions), else just
  // before use (registers).
  constexpr bool kEarly = N <= 2;
  float v[N][V], w[N][V], b[N][V], p[N][V];
  auto load_rest = [&](int j, int e) {
    if (weight) load_vec<T, V>(weight + e, w[j]);
    if (bias) load_vec<T, V>(bias + e, b[j]);
    if (y_pos) load_vec<T, V>(pos + e, p[j]);
  };
  float s = 0.f;
#pragma unroll
  for (int j = 0; j < N; ++j) {
    const int e = (lane + 32 * j) * V;
    if (lane + 32 * j < vecs) {
      load_vec<T, V>(x + e, v[j]);
      if constexpr (kEarly) load_rest(j, e);
      if (x2) {
        float a[V];
        load_vec<T, V>(x2 + e, a);
#pragma unroll
        for (int k = 0; k < V; ++k) v[j][k] = to_f32(from_f32<T>(v[j][k] + a[k]));
      }
#pragma unroll
      for (int k = 0; k < V; ++k) s += v[j][k];
    }
  }
  const float mean = warp_sum(s) / float(c);
  float q = 0.f;
#pragma unroll
  for (int j = 0; j < N; ++j)
    if (lane + 32 * j < vecs) {
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const float d = v[j][k] - mean;
        q += d * d;
      }
    }
  const float inv = 1.f / sqrtf(warp_sum(q) / float(c) + eps);  // biased variance
#pragma unroll
  for (int j = 0; j < N; ++j) {
    const int e = (lane + 32 * j) * V;
    if (lane + 32 * j >= vecs) continue;
    if constexpr (!kEarly) load_rest(j, e);
    float o[V];
#pragma unroll
    for (int k = 0; k < V; ++k) o[k] = (v[j][k] - mean) * inv;
    if (weight) {
#pragma unroll
      for (int k = 0; k < V; ++k) o[k] *= w[j][k];
    }
    if (bias) {
#pragma unroll
      for (int k = 0; k < V; ++k) o[k] += b[j][k];
    }
#pragma unroll
    for (int k = 0; k < V; ++k) o[k] = to_f32(from_f32<T>(o[k]));  // the stored value (exact in T)
    store_vec<T, V>(y + e, o);
    if (y_pos) {
#pragma unroll
      for (int k = 0; k < V; ++k) p[j][k] += o[k];  // pos + the stored y, rounded again by the store
      store_vec<T, V>(y_pos + e, p[j]);
    }
    if (y_f32) store_vec<float, V>(y_f32 + e, o);
  }
}

}  // namespace kiln::cuda::dev
