// top_k (top_k.cpp lowers it): one block per row. Each element gets a 64-bit
// key whose order is the order the op defines — the value's bits mapped to an
// order-preserving unsigned integer in the high half (NaN above +inf, -0 as
// +0; inverted for largest = 0, so NaN then ranks last), and the inverted
// index in the low half (equal values: smaller index first). All keys of a
// row differ, so the k-th largest key is found exactly by a radix select
// (8 passes of 8 bits, a shared histogram each), the k elements at or above
// it are collected in shared memory and put in order. A pass whose chosen
// digit holds exactly the keys still wanted ends the select early (typically
// after 3 of the 8 passes on real scores).
// Rows of up to kRegItems * 1024 elements (top_k_reg_kernel): the row is read
// once, each thread keeping the high halves of its keys in registers (the low
// half is the element's index); histogram counts are warp-aggregated
// (__match_any_sync: one shared atomic per distinct digit of a warp), and the
// k collected keys (k <= 1024) are sorted by a bitonic sort, one key per
// thread: shuffles for partners within a warp, shared memory beyond.
// Longer rows (top_k_kernel) re-read the row from global memory each pass,
// and each key's output position is the number of collected keys above it
// (so is k > 1024 in the register kernel).
// k = 1 has its own kernel (top_1_kernel below).
// TODO(speed): several blocks per row for very long rows, a warp per short row.
#include "backends/cuda/device_common.cuh"
#include "backends/cuda/kernels.hpp"

namespace kiln::cuda {
namespace {

constexpr int kThreadsTopK = 512;

// The high half of an order key.
__device__ __forceinline__ uint32_t order_high(float v, bool largest) {
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
__device__ __forceinline__ unsigned long long order_key(uint32_t high, int64_t index) {
  return (static_cast<unsigned long long>(high) << 32) | (0xffffffffull - static_cast<unsigned long long>(index));
}
__device__ __forceinline__ unsigned long long order_key(float v, int64_t index, bool largest) {
  return order_key(order_high(v, largest), index);
}
__device__ __forceinline__ int64_t key_index(unsigned long long key) {
  return int64_t(0xffffffffull - (key & 0xffffffffull));
}

template <typename T>
__global__ void top_k_kernel(const T* x, T* values, int64_t* indices, int64_t extent, int64_t inner, int k, bool largest) {
  dev::enter_grid();
  __shared__ unsigned int hist[256];
  __shared__ unsigned long long prefix_s, mask_s;
  __shared__ unsigned int remaining_s, picked_s;
  __shared__ unsigned long long picked[kMaxCudaTopK];
  const int64_t row = blockIdx.x;
  const int64_t o = row / inner, r = row % inner;
  const T* xr = x + o * extent * inner + r;
  auto key_of = [&](int64_t i) { return order_key(dev::to_f32(xr[i * inner]), i, largest); };
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

// ---- rows of up to kRegItems * 1024 elements --------------------------------
constexpr int kRegItems = 16;      // keys per thread
constexpr int kRegThreadsMax = 1024;
constexpr int kSortMax = 1024;     // k up to this: bitonic sort, one key per thread

// Element i of the row is thread i % blockDim.x's item i / blockDim.x. Every
// loop over items skips whole warps past the row (warp-uniform), so warp
// collectives see all 32 lanes. Shared state as top_k_kernel's.
template <typename T>
__global__ void __launch_bounds__(kRegThreadsMax)
    top_k_reg_kernel(const T* x, T* values, int64_t* indices, int64_t extent, int64_t inner, int k, bool largest) {
  dev::enter_grid();
  __shared__ unsigned int hist[256];
  __shared__ unsigned long long prefix_s, mask_s;
  __shared__ unsigned int remaining_s, picked_s;
  __shared__ int done_s;
  __shared__ unsigned long long picked[kMaxCudaTopK];  // the collected keys; then the sort's two exchange buffers
  static_assert(kMaxCudaTopK >= 2 * kSortMax, "the sort's buffers live in picked");
  const int64_t row = blockIdx.x;
  const int64_t o = row / inner, r = row % inner;
  const T* xr = x + o * extent * inner + r;
  const uint32_t n = uint32_t(extent), nt = blockDim.x, tid = threadIdx.x;
  const int lane = int(tid % 32), warp = int(tid / 32);
  const uint32_t warp0 = tid - uint32_t(lane);  // the warp's first thread
  if (tid == 0) prefix_s = 0, mask_s = 0, remaining_s = unsigned(k), picked_s = 0, done_s = 0;
  for (uint32_t b = tid; b < 256; b += nt) hist[b] = 0;
  uint32_t high[kRegItems];
#pragma unroll
  for (int j = 0; j < kRegItems; ++j) {
    const uint32_t i = uint32_t(j) * nt + tid;
    high[j] = i < n ? order_high(dev::to_f32(xr[int64_t(i) * inner]), largest) : 0u;
  }
  __syncthreads();
  for (int shift = 56; shift >= 0; shift -= 8) {
    const unsigned long long prefix = prefix_s, mask = mask_s;
    const unsigned int want = remaining_s;
    // The key's halves apart: the high half from registers, the low ~i.
    const uint32_t pre_hi = uint32_t(prefix >> 32), pre_lo = uint32_t(prefix), mask_hi = uint32_t(mask >> 32),
                   mask_lo = uint32_t(mask);
#pragma unroll
    for (int j = 0; j < kRegItems; ++j) {
      if (uint32_t(j) * nt + warp0 >= n) break;  // this warp's items end here
      const uint32_t i = uint32_t(j) * nt + tid;
      unsigned int d = 256;  // no digit: past the row or off the prefix
      if (i < n && (high[j] & mask_hi) == pre_hi && (~i & mask_lo) == pre_lo)
        d = (shift >= 32 ? high[j] >> (shift - 32) : ~i >> shift) & 255u;
      const unsigned int peers = __match_any_sync(0xffffffffu, d);
      if (d < 256 && lane == __ffs(peers) - 1) atomicAdd(&hist[d], unsigned(__popc(peers)));
    }
    __syncthreads();
    // Warp 0 finds the digit holding the want-th largest key among those
    // matching the prefix: lane l takes digits 255 - 8l down to 248 - 8l, a
    // warp scan of the lanes' totals gives the counts above each; it clears
    // the bins for the next pass as it reads them.
    if (warp == 0) {
      unsigned int cnt[8], total = 0;
#pragma unroll
      for (int t = 0; t < 8; ++t) {
        const int b = 255 - 8 * lane - t;
        cnt[t] = hist[b];
        hist[b] = 0;
        total += cnt[t];
      }
      unsigned int incl = total;
#pragma unroll
      for (int d = 1; d < 32; d <<= 1) {
        const unsigned int u = __shfl_up_sync(0xffffffffu, incl, d);
        if (lane >= d) incl += u;
      }
      unsigned int above = incl - total;  // matching keys with a larger digit than this lane's first
#pragma unroll
      for (int t = 0; t < 8; ++t) {
        if (above < want && want <= above + cnt[t]) {  // exactly one (lane, t)
          const unsigned long long b = unsigned(255 - 8 * lane - t);
          remaining_s = want - above;
          prefix_s = prefix | (b << shift);
          mask_s = mask | (255ull << shift);
          done_s = cnt[t] == want - above;  // every key of this digit is wanted: the k largest are known
        }
        above += cnt[t];
      }
    }
    __syncthreads();
    if (done_s) break;
  }
  // The k-th largest key, or after an early stop its prefix with the lower
  // bits zero: either way exactly the k keys at or above it. Warp-aggregated
  // slots in picked (any order).
  const unsigned long long kth = prefix_s;
#pragma unroll
  for (int j = 0; j < kRegItems; ++j) {
    if (uint32_t(j) * nt + warp0 >= n) break;
    const uint32_t i = uint32_t(j) * nt + tid;
    const unsigned long long key = order_key(high[j], i);
    const bool sel = i < n && key >= kth;
    const unsigned int ballot = __ballot_sync(0xffffffffu, sel);
    if (ballot == 0) continue;
    const int leader = __ffs(ballot) - 1;
    unsigned int slot = 0;
    if (lane == leader) slot = atomicAdd(&picked_s, unsigned(__popc(ballot)));
    slot = __shfl_sync(0xffffffffu, slot, leader);
    if (sel) picked[slot + unsigned(__popc(ballot & ((1u << lane) - 1u)))] = key;
  }
  __syncthreads();
  if (k > kSortMax) {  // rank by counting (k <= kMaxCudaTopK)
    for (int s = int(tid); s < k; s += int(nt)) {
      const unsigned long long key = picked[s];
      int rank = 0;
      for (int t = 0; t < k; ++t) rank += picked[t] > key;
      const int64_t index = key_index(key);
      const int64_t y = (o * k + rank) * inner + r;
      values[y] = xr[index * inner];
      indices[y] = index;
    }
    return;
  }
  // Bitonic sort, descending, of p = max(32, pow2 >= k) keys (padded with 0,
  // below every key: the low half of a key is at least 1), key tid in thread
  // tid < p (whole warps; p <= blockDim.x, the host sees to it). Partners less
  // than 32 apart are in the warp (shuffles); farther ones go through one of
  // two alternating buffers in picked, so one barrier per such step suffices:
  // a buffer is rewritten only after the barrier of the step between.
  int p = 32;
  while (p < k) p *= 2;
  const bool sorting = int(tid) < p;  // warp-uniform
  unsigned long long v = int(tid) < k ? picked[tid] : 0ull;
  int buf = 0;
  for (int size = 2; size <= p; size *= 2)
    for (int stride = size / 2; stride > 0; stride /= 2) {
      unsigned long long other = 0;
      if (stride >= 32) {
        unsigned long long* xb = picked + buf * kSortMax;
        if (sorting) xb[tid] = v;  // buffer 0's first use: the slot this thread just read
        __syncthreads();
        if (sorting) other = xb[tid ^ uint32_t(stride)];
        buf ^= 1;
      } else if (sorting) {
        other = __shfl_xor_sync(0xffffffffu, v, stride);
      }
      if (sorting) {
        const bool descending = (int(tid) & size) == 0;  // this run's direction (the last run: all descending)
        const bool first = (int(tid) & stride) == 0;     // the pair's first position
        v = (first == descending) ? (v > other ? v : other) : (v < other ? v : other);
      }
    }
  if (int(tid) < k) {
    const int64_t index = key_index(v);
    const int64_t y = (o * k + int64_t(tid)) * inner + r;
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
    if (extent <= int64_t(kRegItems) * kRegThreadsMax) {
      // A power of two of threads, at least 32 and the row's length where it is
      // shorter than 1024 (so at least the sort's pow2 >= k keys, k <= extent).
      int threads = 32;
      while (threads < kRegThreadsMax && threads < extent) threads *= 2;
      detail::launch("top_k", top_k_reg_kernel<T>, dim3(unsigned(rows)), threads, 0, stream, static_cast<const T*>(x),
                     static_cast<T*>(values), indices, extent, inner, k, largest);
      return;
    }
    detail::launch("top_k", top_k_kernel<T>, dim3(unsigned(rows)), kThreadsTopK, 0, stream, static_cast<const T*>(x),
                   static_cast<T*>(values), indices, extent, inner, k, largest);
  });
}

}  // namespace kiln::cuda
