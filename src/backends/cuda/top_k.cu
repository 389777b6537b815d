// top_k (top_k.cpp lowers it): one block per row. Each element gets a 64-bit
// key whose order is the order the op defines — the value's bits mapped to an
// order-preserving unsigned integer in the high half (NaN above +inf, -0 as
// +0; inverted for largest = 0, so NaN then ranks last), and the inverted
// index in the low half (equal values: smaller index first). All keys of a
// row differ, so the k-th largest key is found exactly by a radix select
// (8 passes of 8 bits, a shared histogram each), the k elements at or above
// it are collected in shared memory, and each one's output position is the
// number of collected keys above it. A pass whose chosen digit holds exactly
// the keys still wanted ends the select early (typically after 3 of the 8
// passes on real scores).
// Rows up to kMaxSmemExtent elements first copy their 32-bit order values to
// shared memory (the index half of a key is the position), so only that first
// read touches global memory, with all of a thread's loads in flight at once;
// the histogram passes and the collection then read shared memory. Reading
// the row from L2 in every pass was most of the kernel's 22 us for RT-DETR's
// 8400 -> 300 on the H100 (Nsight Compute, session 23): one block, a chain
// of 17 dependent loads per thread per pass. Longer rows read global memory
// in each pass as before.
// k = 1 has its own kernel (top_1_kernel below).
// TODO(speed): several blocks per row for very long rows, a warp per short row.
// Tried and not kept (session 26, H100): warp-aggregated histogram and
// collection adds (__match_any_sync on the digit, the lowest lane of each
// group adding its popcount) with 1024 threads and every load of the row in
// flight at once: 13.7 -> 31.3 us for RT-DETR's 8400 -> 300 in the graph.
#include "backends/cuda/device_common.cuh"
#include "backends/cuda/kernels.hpp"

namespace kiln::cuda {
namespace {

constexpr int kThreadsTopK = 512;
constexpr int64_t kMaxSmemExtent = 24576;  // 96 KiB of order values

__device__ __forceinline__ uint32_t order_bits(float v, bool largest) {
  uint32_t u;
  if (isnan(v)) {
    u = 0xffffffffu;  // above every number, all NaNs equal
  } else {
    if (v == 0.f) v = 0.f;  // -0 ranks as +0 (they compare equal)
    u = __float_as_uint(v);
    u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  }
  return largest ? u : ~u;
}

__device__ __forceinline__ unsigned long long key_from(uint32_t bits, int64_t index) {
  return (static_cast<unsigned long long>(bits) << 32) | (0xffffffffull - static_cast<unsigned long long>(index));
}
__device__ __forceinline__ unsigned long long order_key(float v, int64_t index, bool largest) {
  return key_from(order_bits(v, largest), index);
}

template <typename T, bool kSmem>
__global__ void top_k_kernel(const T* x, T* values, int64_t* indices, int64_t extent, int64_t inner, int k, bool largest) {
  dev::enter_grid();
  extern __shared__ uint32_t row_bits[];  // kSmem: the row's order values
  __shared__ unsigned int hist[256];
  __shared__ unsigned long long prefix_s, mask_s;
  __shared__ unsigned int remaining_s, picked_s;
  __shared__ unsigned long long picked[kMaxCudaTopK];
  const int64_t row = blockIdx.x;
  const int64_t o = row / inner, r = row % inner;
  const T* xr = x + o * extent * inner + r;
  if constexpr (kSmem) {
    constexpr int kBatch = 8;  // loads a thread has in flight before it stores any
    for (int64_t i0 = threadIdx.x; i0 < extent; i0 += int64_t(kBatch) * blockDim.x) {
      float v[kBatch];
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        const int64_t i = i0 + int64_t(j) * blockDim.x;
        v[j] = i < extent ? dev::to_f32(xr[i * inner]) : 0.f;
      }
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        const int64_t i = i0 + int64_t(j) * blockDim.x;
        if (i < extent) row_bits[i] = order_bits(v[j], largest);
      }
    }
    __syncthreads();
  }
  auto key_of = [&](int64_t i) {
    if constexpr (kSmem) return key_from(row_bits[i], i);
    else return order_key(dev::to_f32(xr[i * inner]), i, largest);
  };
  __shared__ unsigned int warp_total[kThreadsTopK / 32];
  __shared__ int done_s;
  if (threadIdx.x == 0) {
    prefix_s = 0, mask_s = 0, remaining_s = unsigned(k), picked_s = 0, done_s = 0;
  }
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int shift = 56; shift >= 0; shift -= 8) {
    for (int b = threadIdx.x; b < 256; b += blockDim.x) hist[b] = 0;
    __syncthreads();
    const unsigned long long prefix = prefix_s, mask = mask_s;
    const unsigned int want = remaining_s;
    for (int64_t i = threadIdx.x; i < extent; i += blockDim.x) {
      const unsigned long long key = key_of(i);
      if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 255u], 1u);
    }
    __syncthreads();
    // The digit holding the want-th largest key among those matching the
    // prefix: a block scan of the counts from digit 255 down (thread j takes
    // digit 255 - j), so no thread walks the 256 bins alone (that walk was
    // most of the kernel's time: 54 us for RT-DETR's 8400 -> 300 on the H200).
    unsigned int v = 0, incl = 0;
    if (threadIdx.x < 256) {
      v = hist[255 - threadIdx.x];
      incl = v;
      for (int o = 1; o < 32; o <<= 1) {
        const unsigned int t = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += t;
      }
      if (lane == 31) warp_total[warp] = incl;
    }
    __syncthreads();
    if (threadIdx.x < 256) {
      for (int w = 0; w < warp; ++w) incl += warp_total[w];
      const unsigned int above = incl - v;  // matching keys with a larger digit
      if (above < want && want <= incl) {   // exactly one thread
        const unsigned long long b = 255u - threadIdx.x;
        remaining_s = want - above;
        prefix_s = prefix | (b << shift);
        mask_s = mask | (255ull << shift);
        // Every key of this digit is wanted: the keys >= the prefix (lower
        // bits zero) are exactly the k largest, and no more passes are needed.
        done_s = v == want - above;
      }
    }
    __syncthreads();
    if (done_s) break;
  }
  // The k-th largest key itself (keys are distinct), or after an early stop
  // its prefix with the lower bits zero: either way the k keys at or above it.
  const unsigned long long kth = prefix_s;
  for (int64_t i = threadIdx.x; i < extent; i += blockDim.x) {
    const unsigned long long key = key_of(i);
    if (key >= kth) picked[atomicAdd(&picked_s, 1u)] = key;
  }
  __syncthreads();
  for (int s = threadIdx.x; s < k; s += blockDim.x) {
    const unsigned long long key = picked[s];
    int rank = 0;
    for (int t = 0; t < k; ++t) rank += picked[t] > key;
    const int64_t index = int64_t(0xffffffffull - (key & 0xffffffffull));
    const int64_t y = (o * k + rank) * inner + r;
    values[y] = xr[index * inner];
    indices[y] = index;
  }
}

// k = 1 (an arg-max, e.g. RT-DETR's best class per anchor: 8400 rows of 80):
// one warp per row takes the largest order key, the same key as above, so the
// result is the general kernel's bit for bit (ties: smaller index). The block
// per row above spent 8 histogram passes on each short row (0.33 ms for
// 8400 x 80 on the H200; kiln bench --profile).
constexpr int kWarpsTop1 = 8;

template <typename T>
__global__ void top_1_kernel(const T* x, T* values, int64_t* indices, int64_t rows, int64_t extent, int64_t inner, bool largest) {
  dev::enter_grid();
  const int64_t row = int64_t(blockIdx.x) * kWarpsTop1 + threadIdx.x / 32;
  if (row >= rows) return;
  const int lane = threadIdx.x % 32;
  const int64_t o = row / inner, r = row % inner;
  const T* xr = x + o * extent * inner + r;
  unsigned long long best = 0;
  for (int64_t i = lane; i < extent; i += 32) {
    const unsigned long long key = order_key(dev::to_f32(xr[i * inner]), i, largest);
    best = key > best ? key : best;
  }
  for (int d = 16; d > 0; d /= 2) {
    const unsigned long long other = __shfl_xor_sync(0xffffffffu, best, d);
    best = other > best ? other : best;
  }
  if (lane == 0) {
    const int64_t index = int64_t(0xffffffffull - (best & 0xffffffffull));
    const int64_t y = o * inner + r;
    values[y] = xr[index * inner];
    indices[y] = index;
  }
}

}  // namespace

void top_k_rows(const void* x, void* values, int64_t* indices, DType dt, int64_t outer, int64_t extent, int64_t inner,
                int k, bool largest, cudaStream_t stream) {
  const int64_t rows = outer * inner;
  if (rows <= 0 || k <= 0) return;
  if (k > kMaxCudaTopK || k > extent) fail_runtime("cuda top_k: k ", k, " of ", extent, " (at most ", kMaxCudaTopK, ")");
  if (extent > int64_t(0xffffffff)) fail_runtime("cuda top_k: rows of ", extent, " elements are too long");
  if (rows > int64_t(0x7fffffff)) fail_runtime("cuda top_k: ", rows, " rows is too many");
  detail::dispatch_float(dt, "top_k", [&](auto t) {
    using T = decltype(t);
    if (k == 1) {
      const unsigned blocks = unsigned((rows + kWarpsTop1 - 1) / kWarpsTop1);
      detail::launch("top_k", top_1_kernel<T>, dim3(blocks), 32 * kWarpsTop1, 0, stream, static_cast<const T*>(x),
                     static_cast<T*>(values), indices, rows, extent, inner, largest);
      return;
    }
    if (extent <= kMaxSmemExtent) {
      // The kernel's static shared memory (the collected keys, 16 KiB) plus
      // the row's values pass the 48 KiB default at RT-DETR's 8400: opt in
      // on every launch (the attribute is per device; attention.cu does the same).
      const size_t smem = size_t(extent) * sizeof(uint32_t);
      KILN_CUDA_CHECK(cudaFuncSetAttribute(top_k_kernel<T, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
      detail::launch("top_k", top_k_kernel<T, true>, dim3(unsigned(rows)), kThreadsTopK, smem, stream,
                     static_cast<const T*>(x), static_cast<T*>(values), indices, extent, inner, k, largest);
      return;
    }
    detail::launch("top_k", top_k_kernel<T, false>, dim3(unsigned(rows)), kThreadsTopK, 0, stream, static_cast<const T*>(x),
                   static_cast<T*>(values), indices, extent, inner, k, largest);
  });
}

}  // namespace kiln::cuda
