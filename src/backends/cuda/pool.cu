// NHWC pooling. One thread owns one (output pixel, channel pack): the
// channel dimension is innermost, so a warp's window reads are contiguous
// 16-byte vectors and need no shared memory.
#include <cooperative_groups.h>

#include <algorithm>

#include "backends/cuda/device_common.cuh"
#include "backends/cuda/kernels.hpp"

namespace kiln::cuda {
namespace {

namespace cg = cooperative_groups;

using dev::load_vec;
using dev::store_vec;

// K > 0: a KxK window known at compile time; the loops unroll and every
// in-bounds load is issued before the first is used (the runtime-bounded loop
// keeps only one in flight). K == 0: any window, loops bounded at run time.
// To: T, or (max pool writing codes, CodeOut) a code type: the window's max
// times inv_scale, encoded.
template <typename T, typename To, int V, bool kMax, int K>
__global__ void pool_kernel(const T* __restrict__ x, To* __restrict__ y, PoolShape s, float inv_scale) {
  dev::enter_grid();
  dev::RowWalk w;
  if (!dev::row_walk(uint32_t(s.c / V), w)) return;
  const int ch = int(w.col) * V;
  const uint32_t outs = uint32_t(s.n) * s.out_h * s.out_w;  // < 2^31, checked by the launcher
  for (uint32_t r = uint32_t(w.row); r < outs; r += w.step) {
    const int ox = int(r % s.out_w);
    const uint32_t t = r / s.out_w;
    const int oy = int(t % s.out_h);
    const int b = int(t / s.out_h);
    const int hs = oy * s.stride_h - s.pad_t, ws = ox * s.stride_w - s.pad_l;
    const int h0 = max(hs, 0), h1 = min(hs + s.kh, s.h);
    const int w0 = max(ws, 0), w1 = min(ws + s.kw, s.w);
    float acc[V];
#pragma unroll
    for (int k = 0; k < V; ++k) acc[k] = kMax ? -INFINITY : 0.f;
    const T* img = x + int64_t(b) * s.h * s.w * s.x_stride + ch;
    const auto take = [&](int i, int j) {
      float f[V];
      load_vec<T, V>(img + (int64_t(i) * s.w + j) * s.x_stride, f);
#pragma unroll
      for (int k = 0; k < V; ++k) acc[k] = kMax ? fmaxf(acc[k], f[k]) : acc[k] + f[k];
    };
    if constexpr (K > 0) {
#pragma unroll
      for (int i = 0; i < K; ++i)
#pragma unroll
        for (int j = 0; j < K; ++j)
          if (hs + i >= h0 && hs + i < h1 && ws + j >= w0 && ws + j < w1) take(hs + i, ws + j);
    } else {
      for (int i = h0; i < h1; ++i)
        for (int j = w0; j < w1; ++j) take(i, j);
    }
    if constexpr (!kMax) {
      // PyTorch: the count_include_pad divisor is the window clipped to the
      // padded input (so ceil-mode overhang is never counted).
      const int he = min(hs + s.kh, s.h + s.pad_b), we = min(ws + s.kw, s.w + s.pad_r);
      const int divisor = s.count_include_pad ? (he - hs) * (we - ws) : (h1 - h0) * (w1 - w0);
      const float inv = 1.f / float(divisor);
#pragma unroll
      for (int k = 0; k < V; ++k) acc[k] *= inv;
    }
    dev::to_code_units<To, V>(acc, inv_scale);
    store_vec<To, V>(y + int64_t(r) * s.y_stride + ch, acc);
  }
}

template <bool kMax>
void launch_pool(const void* x, void* y, DType dt, PoolShape s, cudaStream_t stream, const char* name, const CodeOut& code) {
  if (s.n <= 0 || s.c <= 0 || s.out_h <= 0 || s.out_w <= 0) return;
  if (s.x_stride == 0) s.x_stride = s.c;
  if (s.y_stride == 0) s.y_stride = s.c;
  if (s.x_stride < s.c || s.y_stride < s.c)
    fail_runtime("cuda ", name, ": pixel strides ", s.x_stride, "/", s.y_stride, " below ", s.c, " channels");
  if (s.kh < 1 || s.kw < 1 || s.stride_h < 1 || s.stride_w < 1)
    fail_runtime("cuda ", name, ": invalid kernel ", s.kh, "x", s.kw, " stride ", s.stride_h, "x", s.stride_w);
  const int64_t outs = int64_t(s.n) * s.out_h * s.out_w;
  if (outs >= (int64_t(1) << 31)) fail_runtime("cuda ", name, ": output too large (", outs, " pixels)");
  if (code.on() && !kMax) fail_runtime("cuda ", name, ": only the max pool writes codes");
  detail::dispatch_float_out(dt, code, name, [&](auto t, auto o) {
    using T = decltype(t);
    using To = decltype(o);
    constexpr int kV = dev::kVec16Of<T, To>;
    const auto* tx = static_cast<const T*>(x);
    auto* ty = static_cast<To*>(y);
    const bool vec = s.c % kV == 0 && s.x_stride % kV == 0 && s.y_stride % kV == 0 && detail::aligned16(x) &&
                     detail::aligned16(y);
    const auto go = [&](auto v_c, auto k_c) {
      constexpr int V = decltype(v_c)::value, K = decltype(k_c)::value;
      if constexpr (kMax || std::is_same_v<T, To>)
        detail::launch(name, pool_kernel<T, To, V, kMax, K>, detail::grid_rows(outs, s.c / V), detail::kThreads, 0, stream,
            tx, ty, s, code.inv_scale);
    };
    using V1 = std::integral_constant<int, 1>;
    using VN = std::integral_constant<int, kV>;
    // 3x3 (ResNet stems, DenseNet/VGG-style pools) and 2x2 get unrolled kernels.
    const int k = s.kh == s.kw && (s.kh == 2 || s.kh == 3) ? s.kh : 0;
    if (k == 3) vec ? go(VN{}, std::integral_constant<int, 3>{}) : go(V1{}, std::integral_constant<int, 3>{});
    else if (k == 2) vec ? go(VN{}, std::integral_constant<int, 2>{}) : go(V1{}, std::integral_constant<int, 2>{});
    else vec ? go(VN{}, std::integral_constant<int, 0>{}) : go(V1{}, std::integral_constant<int, 0>{});
  });
}

// Block (bx, by): x over channel packs, y splits the hw reduction; partial
// sums meet in shared memory laid out [V][by][bx] so each reduction step of
// a warp touches consecutive words (no bank conflicts). When n * channel
// tiles gives too few blocks to fill the GPU (SE blocks at batch 1, large
// hw), the hw range is split over the gridDim.z blocks of one thread-block
// cluster, and rank 0 adds the others' partials through distributed shared
// memory: no workspace, no atomics, no second launch.
template <typename T, int V>
__global__ void global_avg_kernel(const T* __restrict__ x, T* __restrict__ y, int hw, int c) {
  dev::enter_grid();
  extern __shared__ float red[];
  const int cols = c / V;
  const int tx = threadIdx.x, ty = threadIdx.y, bx = blockDim.x, by = blockDim.y;
  const int col = blockIdx.x * bx + tx;
  const int b = blockIdx.y;
  const int splits = gridDim.z;
  const int per_split = (hw + splits - 1) / splits;
  const int p_begin = blockIdx.z * per_split, p_end = min(hw, p_begin + per_split);
  float acc[V];
#pragma unroll
  for (int k = 0; k < V; ++k) acc[k] = 0.f;
  if (col < cols) {
    const T* base = x + int64_t(b) * hw * c + int64_t(col) * V;
    int p = p_begin + ty;
    // Two loads in flight per iteration.
    for (; p + by < p_end; p += 2 * by) {
      float f0[V], f1[V];
      load_vec<T, V>(base + int64_t(p) * c, f0);
      load_vec<T, V>(base + int64_t(p + by) * c, f1);
#pragma unroll
      for (int k = 0; k < V; ++k) acc[k] += f0[k] + f1[k];
    }
    if (p < p_end) {
      float f[V];
      load_vec<T, V>(base + int64_t(p) * c, f);
#pragma unroll
      for (int k = 0; k < V; ++k) acc[k] += f[k];
    }
  }
#pragma unroll
  for (int k = 0; k < V; ++k) red[(k * by + ty) * bx + tx] = acc[k];
  __syncthreads();
  for (int half = by / 2; half > 0; half /= 2) {
    if (ty < half) {
#pragma unroll
      for (int k = 0; k < V; ++k) red[(k * by + ty) * bx + tx] += red[(k * by + ty + half) * bx + tx];
    }
    __syncthreads();
  }
  float out[V];
#pragma unroll
  for (int k = 0; k < V; ++k) out[k] = red[k * by * bx + tx];
  if (splits > 1) {
    cg::cluster_group cluster = cg::this_cluster();
    cluster.sync();  // every block's partial is in its shared memory
    if (cluster.block_rank() == 0 && ty == 0) {
      for (int r = 1; r < splits; ++r) {
        const float* other = cluster.map_shared_rank(red, r);
#pragma unroll
        for (int k = 0; k < V; ++k) out[k] += other[k * by * bx + tx];
      }
    }
    cluster.sync();  // keep the other blocks' shared memory alive until rank 0 has read it
    if (cluster.block_rank() != 0) return;
  }
  if (ty == 0 && col < cols) {
    const float inv = 1.f / float(hw);
#pragma unroll
    for (int k = 0; k < V; ++k) out[k] *= inv;
    store_vec<T, V>(y + int64_t(b) * c + int64_t(col) * V, out);
  }
}

template <typename T, int V>
void launch_global_avg(const T* x, T* y, int n, int hw, int c, cudaStream_t stream) {
  const int cols = c / V;
  int bx = 1;
  while (bx < cols && bx < 32) bx *= 2;  // narrow tensors give the threads to the hw reduction
  const int by = detail::kThreads / bx;
  const int tiles = (cols + bx - 1) / bx;
  // Aim for two blocks per SM; 8 is the portable cluster size limit, and a
  // split should still give each thread a couple of rows.
  const int64_t blocks = int64_t(tiles) * n;
  const int64_t want = (2 * int64_t(detail::sm_count()) + blocks - 1) / blocks;
  const int64_t by_rows = (hw + 2 * by - 1) / (2 * by);
  const int splits = int(std::max<int64_t>(1, std::min<int64_t>({want, by_rows, 8})));
  detail::launch_clustered("global_avg_pool_nhwc", unsigned(splits), global_avg_kernel<T, V>, dim3(tiles, n, splits),
                           dim3(bx, by), size_t(detail::kThreads) * V * sizeof(float), stream, x, y, hw, c);
}

}  // namespace

void max_pool_nhwc(const void* x, void* y, DType dt, const PoolShape& s, cudaStream_t stream, const CodeOut& code) {
  launch_pool<true>(x, y, dt, s, stream, "max_pool_nhwc", code);
}

void avg_pool_nhwc(const void* x, void* y, DType dt, const PoolShape& s, cudaStream_t stream) {
  launch_pool<false>(x, y, dt, s, stream, "avg_pool_nhwc", CodeOut{});
}

void global_avg_pool_nhwc(const void* x, void* y, DType dt, int n, int hw, int c, cudaStream_t stream) {
  if (n <= 0 || c <= 0) return;
  if (hw < 1) fail_runtime("cuda global_avg_pool_nhwc: empty spatial extent");
  if (n > 65535) fail_runtime("cuda global_avg_pool_nhwc: batch ", n, " exceeds the grid limit 65535");
  detail::dispatch_float(dt, "global_avg_pool_nhwc", [&](auto t) {
    using T = decltype(t);
    constexpr int kV = dev::kVec16<T>;
    const auto* tx = static_cast<const T*>(x);
    auto* ty = static_cast<T*>(y);
    if (c % kV == 0 && detail::aligned16(x) && detail::aligned16(y))
      launch_global_avg<T, kV>(tx, ty, n, hw, c, stream);
    else
      launch_global_avg<T, 1>(tx, ty, n, hw, c, stream);
  });
}

}  // namespace kiln::cuda
