// softmax_top_k (classify_post.hpp). One block per image: a block reduction
// of the max, one of the double sum of exponentials, then k rounds of a block
// argmax, each over the elements strictly after the previous pick in the
// order (logit descending, class id ascending), so no pick list is searched.
// Our own kernel: a softmax plus a top-5 over 1000 floats is one small block's
// work, and cub's block sort would sort all of them.
#include <cfloat>

#include "backends/cuda/classify_post.hpp"
#include "backends/cuda/device_common.cuh"
#include "core/error.hpp"

namespace kiln::cuda {
namespace {

constexpr int kThreads = 256, kWarps = kThreads / 32;

// (value, id) ranks before (w, j): larger value, or equal value and lower id.
__device__ __forceinline__ bool before(float v, int i, float w, int j) { return v > w || (v == w && i < j); }

__global__ void __launch_bounds__(kThreads) softmax_top_k_kernel(const float* __restrict__ logits, int classes, int k,
                                                                  int* __restrict__ ids, float* __restrict__ probs) {
  dev::enter_grid();
  __shared__ float red_f[kWarps];
  __shared__ int red_i[kWarps];
  __shared__ double red_d[kWarps];
  __shared__ float max_s;
  __shared__ double sum_s;
  const float* l = logits + static_cast<long long>(blockIdx.x) * classes;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;

  float mx = -FLT_MAX;
  for (int i = threadIdx.x; i < classes; i += kThreads) mx = fmaxf(mx, l[i]);
  for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  if (lane == 0) red_f[warp] = mx;
  __syncthreads();
  if (threadIdx.x == 0) {
    float m = red_f[0];
    for (int w = 1; w < kWarps; ++w) m = fmaxf(m, red_f[w]);
    max_s = m;
  }
  __syncthreads();
  const double m = max_s;
  double sum = 0;
  for (int i = threadIdx.x; i < classes; i += kThreads) sum += exp(static_cast<double>(l[i]) - m);
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  if (lane == 0) red_d[warp] = sum;
  __syncthreads();
  if (threadIdx.x == 0) {
    double s = 0;
    for (int w = 0; w < kWarps; ++w) s += red_d[w];
    sum_s = s;
  }
  __syncthreads();

  // The previous pick (none yet: every element is after +inf with id -1).
  float prev_v = __int_as_float(0x7f800000);  // +inf
  int prev_i = -1;
  for (int r = 0; r < k; ++r) {
    float bv = -__int_as_float(0x7f800000);
    int bi = -1;
    for (int i = threadIdx.x; i < classes; i += kThreads) {
      const float v = l[i];
      if (before(prev_v, prev_i, v, i) && (bi < 0 || before(v, i, bv, bi))) bv = v, bi = i;
    }
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
      const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
      if (oi >= 0 && (bi < 0 || before(ov, oi, bv, bi))) bv = ov, bi = oi;
    }
    if (lane == 0) red_f[warp] = bv, red_i[warp] = bi;
    __syncthreads();
    bv = red_f[0], bi = red_i[0];
    for (int w = 1; w < kWarps; ++w)
      if (red_i[w] >= 0 && (bi < 0 || before(red_f[w], red_i[w], bv, bi))) bv = red_f[w], bi = red_i[w];
    __syncthreads();  // every thread has read red_* before the next round writes them
    if (threadIdx.x == 0) {
      ids[blockIdx.x * k + r] = bi;
      probs[blockIdx.x * k + r] = static_cast<float>(exp(static_cast<double>(bv) - m) / sum_s);
    }
    prev_v = bv, prev_i = bi;
  }
}

}  // namespace

void softmax_top_k(const float* logits, int rows, int classes, int k, int* ids, float* probs, cudaStream_t stream) {
  if (rows <= 0) return;
  if (k < 1 || k > kMaxDeviceTopK || k > classes)
    fail_runtime("softmax_top_k: k ", k, " for ", classes, " classes (1..", kMaxDeviceTopK, " and at most the classes)");
  detail::launch("softmax_top_k", softmax_top_k_kernel, dim3(rows), dim3(kThreads), 0, stream, logits, classes, k, ids, probs);
}

}  // namespace kiln::cuda
