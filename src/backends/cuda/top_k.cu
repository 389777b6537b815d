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
// Rows of kClusterMinExtent..kClusterMaxExtent elements (RT-DETR's 8400) take
// the cluster form (top_k_cluster_kernel): the same keys, select and ranks,
// with the row split over the kCluster blocks of one thread-block cluster.
// Each block holds and histograms its share (1/8 of the loads and of the
// same-bin shared atomics, which serialise when scores share their high
// digits: the suspected cost of one block, not profiled),
// the blocks' histograms are summed through distributed shared memory (every
// block reads all and takes the same decision: one cluster barrier a pass),
// the winners are gathered into every block, and each block ranks 1/8 of them
// with 8 lanes per winner. Its output is the single-block kernel's, bit for bit.
// TODO(speed): a warp per short row.
// Tried and not kept (session 26, H100): warp-aggregated histogram and
// collection adds (__match_any_sync on the digit, the lowest lane of each
// group adding its popcount) with 1024 threads and every load of the row in
// flight at once: 13.7 -> 31.3 us for RT-DETR's 8400 -> 300 in the graph.
#include <cooperative_groups.h>

#include "backends/cuda/device_common.cuh"
#include "backends/cuda/kernels.hpp"

namespace kiln::cuda {
namespace {

namespace cg = cooperative_groups;

constexpr int kThreadsTopK = 512;
constexpr int64_t kMaxSmemExtent = 24576;  // 96 KiB of order values

// The cluster form: 8 blocks (the portable cluster size) of 256 threads.
constexpr int kCluster = 8;
constexpr int kThreadsCluster = 256;
constexpr int64_t kClusterMinExtent = 4096;                         // below: one block is enough
constexpr int64_t kClusterMaxExtent = kCluster * kMaxSmemExtent;   // each block's share in shared memory

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

// The winner `key` at output position `rank` of row (o, r): its stored value
// (xr: the row's first element) and its index, decoded from the key's low half.
template <typename T>
__device__ __forceinline__ void write_ranked(unsigned long long key, int rank, const T* xr, T* values, int64_t* indices,
                                             int64_t o, int64_t r, int k, int64_t inner) {
  const int64_t index = int64_t(0xffffffffull - (key & 0xffffffffull));
  const int64_t y = (o * k + rank) * inner + r;
  values[y] = xr[index * inner];
  indices[y] = index;
}

// The radix select's state, in shared memory: the digits chosen so far
// (prefix under mask), how many keys are still wanted below them, and whether
// the select is complete.
struct SelectState {
  unsigned long long prefix, mask;
  unsigned int remaining;
  int done;
};

// One pass's decision, both kernels: thread j < 256 holds v, the count of
// digit 255 - j among the keys matching the prefix (threads past 255 take no
// part). The digit holding the remaining-th largest key is found by a block
// scan of the counts from digit 255 down, so no thread walks the 256 bins
// alone (that walk was most of the kernel's time: 54 us for RT-DETR's
// 8400 -> 300 on the H200); the one thread it falls to records it at `shift`.
// If every key of that digit is wanted, the keys >= the prefix (lower bits
// zero) are exactly the k largest and the select is done. Reads st before its
// first barrier and returns after its last, so every thread may read st then.
__device__ __forceinline__ void choose_digit(unsigned int v, int shift, SelectState& st, unsigned int* warp_total) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const unsigned long long prefix = st.prefix, mask = st.mask;
  const unsigned int want = st.remaining;
  unsigned int incl = v;
  if (threadIdx.x < 256) {
    for (int d = 1; d < 32; d <<= 1) {
      const unsigned int t = __shfl_up_sync(0xffffffffu, incl, d);
      if (lane >= d) incl += t;
    }
    if (lane == 31) warp_total[warp] = incl;
  }
  __syncthreads();
  if (threadIdx.x < 256) {
    for (int w = 0; w < warp; ++w) incl += warp_total[w];
    const unsigned int above = incl - v;  // matching keys with a larger digit
    if (above < want && want <= incl) {   // exactly one thread
      const unsigned long long b = 255u - threadIdx.x;
      st.remaining = want - above;
      st.prefix = prefix | (b << shift);
      st.mask = mask | (255ull << shift);
      st.done = v == want - above;
    }
  }
  __syncthreads();
}

// bits[i] = order_bits(row[(first + i) * inner]) for i < n, by the block's
// threads with kBatch loads each in flight before any store.
template <typename T>
__device__ __forceinline__ void load_order_bits(const T* row, int64_t inner, int64_t first, int64_t n, bool largest,
                                                uint32_t* bits) {
  constexpr int kBatch = 8;
  for (int64_t i0 = threadIdx.x; i0 < n; i0 += int64_t(kBatch) * blockDim.x) {
    float v[kBatch];
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int64_t i = i0 + int64_t(j) * blockDim.x;
      v[j] = i < n ? dev::to_f32(row[(first + i) * inner]) : 0.f;
    }
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int64_t i = i0 + int64_t(j) * blockDim.x;
      if (i < n) bits[i] = order_bits(v[j], largest);
    }
  }
}

template <typename T, bool kSmem>
__global__ void top_k_kernel(const T* x, T* values, int64_t* indices, int64_t extent, int64_t inner, int k, bool largest) {
  dev::enter_grid();
  extern __shared__ uint32_t row_bits[];  // kSmem: the row's order values
  __shared__ unsigned int hist[256];
  __shared__ SelectState sel;
  __shared__ unsigned int picked_s;
  __shared__ unsigned long long picked[kMaxCudaTopK];
  const int64_t row = blockIdx.x;
  const int64_t o = row / inner, r = row % inner;
  const T* xr = x + o * extent * inner + r;
  if constexpr (kSmem) {
    load_order_bits(xr, inner, 0, extent, largest, row_bits);
    __syncthreads();
  }
  auto key_of = [&](int64_t i) {
    if constexpr (kSmem) return key_from(row_bits[i], i);
    else return order_key(dev::to_f32(xr[i * inner]), i, largest);
  };
  __shared__ unsigned int warp_total[kThreadsTopK / 32];
  if (threadIdx.x == 0) sel = SelectState{0, 0, unsigned(k), 0}, picked_s = 0;
  for (int shift = 56; shift >= 0; shift -= 8) {
    for (int b = threadIdx.x; b < 256; b += blockDim.x) hist[b] = 0;
    __syncthreads();
    const unsigned long long prefix = sel.prefix, mask = sel.mask;
    for (int64_t i = threadIdx.x; i < extent; i += blockDim.x) {
      const unsigned long long key = key_of(i);
      if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 255u], 1u);
    }
    __syncthreads();
    choose_digit(threadIdx.x < 256 ? hist[255 - threadIdx.x] : 0u, shift, sel, warp_total);
    if (sel.done) break;
  }
  // The k-th largest key itself (keys are distinct), or after an early stop
  // its prefix with the lower bits zero: either way the k keys at or above it.
  const unsigned long long kth = sel.prefix;
  for (int64_t i = threadIdx.x; i < extent; i += blockDim.x) {
    const unsigned long long key = key_of(i);
    if (key >= kth) picked[atomicAdd(&picked_s, 1u)] = key;
  }
  __syncthreads();
  for (int s = threadIdx.x; s < k; s += blockDim.x) {
    const unsigned long long key = picked[s];
    int rank = 0;
    for (int t = 0; t < k; ++t) rank += picked[t] > key;
    write_ranked(key, rank, xr, values, indices, o, r, k, inner);
  }
}

// The cluster form (header comment). Grid (rows, 1, kCluster), cluster
// (1, 1, kCluster); block z holds elements [z * share, (z + 1) * share) of
// the row as order values in dynamic shared memory.
template <typename T>
__global__ void __launch_bounds__(kThreadsCluster) top_k_cluster_kernel(const T* x, T* values, int64_t* indices, int64_t extent,
                                                                        int64_t inner, int k, bool largest) {
  dev::enter_grid();
  extern __shared__ uint32_t share_bits[];
  __shared__ unsigned int hist[2][256];  // by pass parity: a pass's counts are read by every block
  __shared__ unsigned int warp_total[kThreadsCluster / 32];
  __shared__ SelectState sel;
  __shared__ unsigned int count_s;
  __shared__ unsigned long long mine[kMaxCudaTopK];    // this block's winners
  __shared__ unsigned long long winners[kMaxCudaTopK];  // every block's, gathered
  cg::cluster_group cluster = cg::this_cluster();
  const int rank = int(cluster.block_rank());
  const int64_t row = blockIdx.x;
  const int64_t o = row / inner, r = row % inner;
  const T* xr = x + o * extent * inner + r;
  const int64_t share = (extent + kCluster - 1) / kCluster;
  const int64_t i0 = int64_t(rank) * share;
  const int64_t left = extent - i0;
  const int n = left <= 0 ? 0 : int(left < share ? left : share);
  load_order_bits(xr, inner, i0, n, largest, share_bits);
  if (threadIdx.x == 0) sel = SelectState{0, 0, unsigned(k), 0}, count_s = 0;
  const int lane = threadIdx.x % 32;
  for (int shift = 56; shift >= 0; shift -= 8) {
    const int parity = (shift >> 3) & 1;
    // hist[parity] was last read by the other blocks two passes ago, before
    // they arrived at the last pass's cluster barrier, which this block passed.
    hist[parity][threadIdx.x] = 0;  // 256 threads, 256 bins
    __syncthreads();
    const unsigned long long prefix = sel.prefix, mask = sel.mask;
    for (int i = threadIdx.x; i < n; i += kThreadsCluster) {
      const unsigned long long key = key_from(share_bits[i], i0 + i);
      if ((key & mask) == prefix) atomicAdd(&hist[parity][(key >> shift) & 255u], 1u);
    }
    cluster.sync();  // every block's counts for this pass are complete and visible
    // Digit 255 - threadIdx.x summed over the blocks; every block takes the same decision.
    unsigned int v = 0;
    for (int m = 0; m < kCluster; ++m) v += cluster.map_shared_rank(&hist[parity][0], m)[255 - threadIdx.x];
    choose_digit(v, shift, sel, warp_total);
    if (sel.done) break;
  }
  // This block's keys at or above the k-th largest (see the single-block
  // kernel), appended a warp at a time.
  const unsigned long long kth = sel.prefix;
  for (int b0 = 0; b0 < n; b0 += kThreadsCluster) {
    const int i = b0 + threadIdx.x;
    const unsigned long long key = i < n ? key_from(share_bits[i], i0 + i) : 0ull;
    const bool take = i < n && key >= kth;
    const unsigned int ballot = __ballot_sync(0xffffffffu, take);
    unsigned int base = 0;
    if (lane == 0 && ballot) base = atomicAdd(&count_s, unsigned(__popc(ballot)));
    base = __shfl_sync(0xffffffffu, base, 0);
    if (take) mine[base + __popc(ballot & ((1u << lane) - 1u))] = key;
  }
  cluster.sync();  // every block's count is final
  unsigned int offset = 0, total = 0;
  for (int m = 0; m < kCluster; ++m) {
    const unsigned int c = *cluster.map_shared_rank(&count_s, m);
    offset += m < rank ? c : 0u;
    total += c;
  }
  // total == k: the keys are distinct, so exactly k are at or above the k-th.
  const unsigned int mine_n = count_s;
  for (int m = 0; m < kCluster; ++m) {
    unsigned long long* dst = cluster.map_shared_rank(winners, m) + offset;
    for (unsigned int j = threadIdx.x; j < mine_n; j += kThreadsCluster) dst[j] = mine[j];
  }
  cluster.sync();  // every block holds all k winners; no remote access after this
  // Block `rank` ranks winners rank * 32 + g (+ 256, ...): 8 lanes each, each
  // counting the winners above it in every 8th slot.
  const int g = threadIdx.x / 8, sub = threadIdx.x % 8;
  for (int j0 = rank * (kThreadsCluster / 8); j0 < int(total); j0 += kCluster * (kThreadsCluster / 8)) {
    const int j = j0 + g;
    int above = 0;
    unsigned long long key = 0;
    if (j < int(total)) {
      key = winners[j];
      for (int t = sub; t < int(total); t += 8) above += winners[t] > key;
    }
    above += __shfl_xor_sync(0xffffffffu, above, 1);
    above += __shfl_xor_sync(0xffffffffu, above, 2);
    above += __shfl_xor_sync(0xffffffffu, above, 4);
    if (j < int(total) && sub == 0) write_ranked(key, above, xr, values, indices, o, r, k, inner);
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
                int k, bool largest, cudaStream_t stream, TopKPath path) {
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
    if (path != TopKPath::OneBlock && extent >= kClusterMinExtent && extent <= kClusterMaxExtent) {
      const size_t smem = size_t((extent + kCluster - 1) / kCluster) * sizeof(uint32_t);
      KILN_CUDA_CHECK(cudaFuncSetAttribute(top_k_cluster_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
      detail::launch_clustered("top_k", kCluster, top_k_cluster_kernel<T>, dim3(unsigned(rows), 1, kCluster), dim3(kThreadsCluster),
                               smem, stream, static_cast<const T*>(x), static_cast<T*>(values), indices, extent, inner, k,
                               largest);
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
