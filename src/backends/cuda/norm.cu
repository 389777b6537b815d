// layer_norm and softmax (norm.cpp lowers them): one warp per row, f32
// statistics and exponentials for every storage type, one rounding of the
// result to storage.
// layer_norm: when c is a multiple of a 16-byte vector (8 f16/bf16, 4 f32),
// at most 8 vectors per lane (c <= 2048 16-bit, 1024 f32) and every pointer is
// 16-byte aligned, the warp reads its row once into registers with 16-byte
// loads (layer_norm_vec_kernel: RT-DETR's C = 256 is one vector per lane),
// takes the mean and then the squared deviations from registers and writes
// with 16-byte stores; otherwise the scalar kernel reads the row three times
// (mean, variance, output; repeated reads hit L1/L2). Softmax reads its row
// two or three times as the scalar layer norm.
// TODO(speed): a block per row for long rows.
#include "backends/cuda/device_common.cuh"
#include "backends/cuda/kernels.hpp"
#include "backends/cuda/norm_row.cuh"

namespace kiln::cuda {
namespace {

using dev::from_f32;
using dev::to_f32;

constexpr int kRowsPerBlock = 8;  // warps per block

using dev::warp_max;
using dev::warp_sum;

// x2 (null or rows x c): the row is x + x2 as the add step stores it (the sum
// in f32, rounded once to T), so a residual add fused in here (plan_norm_adds)
// gives the bits the add step and the layer norm would.
template <typename T>
__device__ __forceinline__ float row_at(const T* xr, const T* x2r, int i) {
  return x2r ? to_f32(from_f32<T>(to_f32(xr[i]) + to_f32(x2r[i]))) : to_f32(xr[i]);
}

// y_pos (null or rows x c): also y + pos as the add step stores it (y rounded
// to T, the sum in f32, rounded again): RT-DETR's query + position after a
// layer norm; y_f32: y widened (exact), as a cast step (plan_norm_adds).
template <typename T>
__global__ void layer_norm_kernel(const T* x, const T* x2, const T* weight, const T* bias, T* y, const T* pos, T* y_pos,
                                  float* y_f32, int64_t rows, int c, float eps) {
  dev::enter_grid();
  const int lane = threadIdx.x & 31;
  const int64_t row = int64_t(blockIdx.x) * kRowsPerBlock + (threadIdx.x >> 5);
  if (row >= rows) return;
  const T* xr = x + row * c;
  const T* x2r = x2 ? x2 + row * c : nullptr;
  float s = 0.f;
  for (int i = lane; i < c; i += 32) s += row_at(xr, x2r, i);
  const float mean = warp_sum(s) / float(c);
  float q = 0.f;
  for (int i = lane; i < c; i += 32) {
    const float d = row_at(xr, x2r, i) - mean;
    q += d * d;
  }
  const float inv = 1.f / sqrtf(warp_sum(q) / float(c) + eps);  // biased variance
  T* yr = y + row * c;
  for (int i = lane; i < c; i += 32) {
    float v = (row_at(xr, x2r, i) - mean) * inv;
    if (weight) v *= to_f32(weight[i]);
    if (bias) v += to_f32(bias[i]);
    const T out = from_f32<T>(v);
    yr[i] = out;
    if (y_pos) y_pos[row * c + i] = from_f32<T>(to_f32(out) + to_f32(pos[row * c + i]));
    if (y_f32) y_f32[row * c + i] = to_f32(out);
  }
}

// The register path of layer_norm_kernel, the same arithmetic: lane l holds
// the 16-byte vectors l, l + 32, ... of its row (at most N of them; lanes past
// the row's c / V vectors hold none). Row sums differ from the scalar kernel
// only in the order of the f32 additions.
constexpr int kRowsPerBlockVec = 4;  // warps per block: 300 rows -> 75 blocks

template <typename T, int N>
__global__ void __launch_bounds__(kRowsPerBlockVec * 32)
    layer_norm_vec_kernel(const T* x, const T* x2, const T* weight, const T* bias, T* y, const T* pos, T* y_pos,
                          float* y_f32, int64_t rows, int c, float eps) {
  dev::enter_grid();
  const int64_t row = int64_t(blockIdx.x) * kRowsPerBlockVec + (threadIdx.x >> 5);
  if (row >= rows) return;
  const int64_t base = row * c;
  dev::layer_norm_row_vec<T, N>(x + base, x2 ? x2 + base : nullptr, weight, bias, y + base, y_pos ? pos + base : nullptr,
                                y_pos ? y_pos + base : nullptr, y_f32 ? y_f32 + base : nullptr, c, eps, threadIdx.x & 31);
}

// Row (o, r) of [outer, extent, inner]: elements at (o * extent + i) * inner + r.
template <typename T>
__global__ void softmax_kernel(const T* x, T* y, int64_t rows, int64_t extent, int64_t inner) {
  dev::enter_grid();
  const int lane = threadIdx.x & 31;
  const int64_t row = int64_t(blockIdx.x) * kRowsPerBlock + (threadIdx.x >> 5);
  if (row >= rows) return;
  const int64_t base = (row / inner) * extent * inner + row % inner;
  float m = -INFINITY;
  for (int64_t i = lane; i < extent; i += 32) m = fmaxf(m, to_f32(x[base + i * inner]));
  m = warp_max(m);
  float s = 0.f;
  for (int64_t i = lane; i < extent; i += 32) s += expf(to_f32(x[base + i * inner]) - m);
  const float inv = 1.f / warp_sum(s);
  for (int64_t i = lane; i < extent; i += 32) y[base + i * inner] = from_f32<T>(expf(to_f32(x[base + i * inner]) - m) * inv);
}

int blocks_for_rows(int64_t rows) {
  const int64_t b = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
  if (b > int64_t(0x7fffffff)) fail_runtime("cuda norm: ", rows, " rows is too many");
  return int(b);
}

// Vectors per lane of layer_norm_vec_kernel<T, N> for rows of c, or 0 where
// the scalar kernel runs (c not a multiple of V, a row of more than 8 vectors
// per lane, or a pointer off 16 bytes; c multiple of V keeps every row and
// vector 16-byte aligned after an aligned start).
template <typename T>
int vec_lanes_for(const LayerNormIo& io, int c) {
  constexpr int V = dev::kVec16<T>;
  if (c % V != 0) return 0;
  for (const void* p : {io.x, io.x2, io.weight, io.bias, static_cast<const void*>(io.y), io.pos,
                        static_cast<const void*>(io.y_pos), static_cast<const void*>(io.y_f32)})
    if (p && !detail::aligned16(p)) return 0;
  const int per_lane = (c / V + 31) / 32;
  return per_lane <= 1 ? 1 : per_lane <= 2 ? 2 : per_lane <= 4 ? 4 : per_lane <= 8 ? 8 : 0;
}

template <typename T, int N>
void launch_layer_norm_vec(const LayerNormIo& io, int64_t rows, int c, float eps, cudaStream_t stream) {
  const int64_t b = (rows + kRowsPerBlockVec - 1) / kRowsPerBlockVec;
  if (b > int64_t(0x7fffffff)) fail_runtime("cuda norm: ", rows, " rows is too many");
  detail::launch("layer_norm", layer_norm_vec_kernel<T, N>, int(b), kRowsPerBlockVec * 32, 0, stream,
                 static_cast<const T*>(io.x), static_cast<const T*>(io.x2), static_cast<const T*>(io.weight),
                 static_cast<const T*>(io.bias), static_cast<T*>(io.y), static_cast<const T*>(io.pos),
                 static_cast<T*>(io.y_pos), io.y_f32, rows, c, eps);
}

}  // namespace

void layer_norm_rows(const LayerNormIo& io, DType dt, int64_t rows, int c, float eps, cudaStream_t stream) {
  if (rows <= 0 || c <= 0) return;
  detail::dispatch_float(dt, "layer_norm", [&](auto t) {
    using T = decltype(t);
    switch (vec_lanes_for<T>(io, c)) {
      case 1: return launch_layer_norm_vec<T, 1>(io, rows, c, eps, stream);
      case 2: return launch_layer_norm_vec<T, 2>(io, rows, c, eps, stream);
      case 4: return launch_layer_norm_vec<T, 4>(io, rows, c, eps, stream);
      case 8: return launch_layer_norm_vec<T, 8>(io, rows, c, eps, stream);
      default: break;
    }
    detail::launch("layer_norm", layer_norm_kernel<T>, blocks_for_rows(rows), kRowsPerBlock * 32, 0, stream,
                   static_cast<const T*>(io.x), static_cast<const T*>(io.x2), static_cast<const T*>(io.weight),
                   static_cast<const T*>(io.bias), static_cast<T*>(io.y), static_cast<const T*>(io.pos),
                   static_cast<T*>(io.y_pos), io.y_f32, rows, c, eps);
  });
}

void softmax_axis(const void* x, void* y, DType dt, int64_t outer, int64_t extent, int64_t inner, cudaStream_t stream) {
  const int64_t rows = outer * inner;
  if (rows <= 0 || extent <= 0) return;
  detail::dispatch_float(dt, "softmax", [&](auto t) {
    using T = decltype(t);
    detail::launch("softmax", softmax_kernel<T>, blocks_for_rows(rows), kRowsPerBlock * 32, 0, stream,
                   static_cast<const T*>(x), static_cast<T*>(y), rows, extent, inner);
  });
}

}  // namespace kiln::cuda
