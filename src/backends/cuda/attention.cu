// attention (ops.def; attention.cpp lowers it, ref/attention.cpp says what it
// computes): multi-head scaled dot-product attention in one kernel, for the
// short token sequences of detection transformers (RT-DETR: 400 encoder
// tokens, 300 decoder queries, 8 heads of width 32). The heads are read and
// written in place in the [N, L, H*D] token layout, so the split/transposes
// and the merge of the unfused form disappear too. Our own kernels, not
// cuDNN's SDPA graph: that one wants its own layouts and runtime-compiles per
// shape, and at these sizes a head's whole attention is a few tiles.
//
// Two kernels:
//
// * Tensor cores (f16/bf16, d and dv multiples of 16 up to 128, 16-byte
//   aligned rows; attention_uses_mma): flash-attention style on
//   mma.sync.m16n8k16 with f32 accumulation. A block of 4 warps owns
//   (image, head, 16 * 4/split queries); each warp holds 16 query rows as mma
//   A fragments in registers, loaded once. k and v stream through a ring of
//   64-key tiles in shared memory (cp.async, rows padded by 8 elements so the
//   ldmatrix reads hit 32 banks; the whole head when it fits the ring, as at
//   RT-DETR's sizes). Per tile a warp computes S = q k^T (f32), scales it,
//   masks keys past lk, keeps a running row max and sum (online softmax, f32,
//   exp2f with log2(e) folded into the scale), rescales its output
//   accumulators, rounds P to T and adds P v on the tensor cores. At small
//   grids (batch 1: 56 blocks of 64 queries for AIFI on 132 SMs) the warps of
//   a block split the keys of each tile instead of the queries (split 2 or
//   4) and merge their (max, sum, output) through shared memory at the end:
//   more blocks, a shorter chain of dependent tiles per warp.
//   Numerics: scores, softmax, sums and the normalisation stay f32 as in the
//   exact kernel; the one extra rounding is P (in [0, 1]) to T before the
//   P v product (relative 2^-11 for f16, 2^-8 for bf16 per weight, while the
//   normaliser is the f32 sum of the unrounded weights), then y once.
// * Exact f32 (every other case: f32, odd head widths, misaligned pointers):
//   one block per (image, head, 16 queries): the head's k (transposed) and v
//   go to shared memory in f32 once; each warp then takes a query at a time:
//   lanes compute the scores of keys lane, lane+32, ... (f32), the warp
//   reduces max and sum of the exponentials, and each lane sums probability x
//   v for its output channels. When k and v do not fit, the same kernel reads
//   them from global memory (L2) instead.
#include <cfloat>
#include <cstdint>
#include <cstring>

#include "backends/cuda/device_common.cuh"
#include "backends/cuda/kernels.hpp"
namespace kiln::cuda {
namespace {

using dev::from_f32;
using dev::to_f32;

constexpr int kWarps = 8, kQueriesPerBlock = 16;

using dev::warp_max;
using dev::warp_sum;

template <typename T, bool kShared>
__global__ void __launch_bounds__(kWarps * 32) attention_kernel(const T* __restrict__ q, const T* __restrict__ k,
                                                                const T* __restrict__ v, T* __restrict__ y, AttentionShape s) {
  dev::enter_grid();
  extern __shared__ float smem[];
  const int h = blockIdx.y, lk = s.lk, d = s.d, dv = s.dv;
  const int64_t n = blockIdx.z, cv = int64_t(s.heads) * dv;  // y's row; q, k, v rows s.q_ld, s.k_ld, s.v_ld apart
  const T* kh = k + n * lk * s.k_ld + int64_t(h) * d;  // row j, channel c: kh[j * s.k_ld + c]
  const T* vh = v + n * lk * s.v_ld + int64_t(h) * dv;
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
        dev::load_vec<T, V>(kh + int64_t(j) * s.k_ld + c0, f);
#pragma unroll
        for (int e = 0; e < V; ++e) kt[(c0 + e) * ldk + j] = f[e];
      }
      for (int i = threadIdx.x; i < lk * dvq; i += blockDim.x) {
        const int j = i / dvq, c0 = (i % dvq) * V;
        float f[V];
        dev::load_vec<T, V>(vh + int64_t(j) * s.v_ld + c0, f);
#pragma unroll
        for (int e = 0; e < V; ++e) vs[j * dv + c0 + e] = f[e];
      }
    } else {
      for (int i = threadIdx.x; i < lk * d; i += blockDim.x) kt[(i % d) * ldk + i / d] = to_f32(kh[int64_t(i / d) * s.k_ld + i % d]);
      for (int i = threadIdx.x; i < lk * dv; i += blockDim.x) vs[i] = to_f32(vh[int64_t(i / dv) * s.v_ld + i % dv]);
    }
    __syncthreads();
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float* p = pw + warp * lk;
  float* qq = qw + warp * d;
  const int first = blockIdx.x * kQueriesPerBlock, last = min(s.lq, first + kQueriesPerBlock);
  for (int i = first + warp; i < last; i += kWarps) {
    const T* qi = q + (n * s.lq + i) * s.q_ld + int64_t(h) * d;
    for (int c = lane; c < d; c += 32) qq[c] = to_f32(qi[c]);
    __syncwarp();
    float mx = -FLT_MAX;
    for (int j = lane; j < lk; j += 32) {
      float acc = 0.f;
      if (kShared)
        for (int c = 0; c < d; ++c) acc += qq[c] * kt[c * ldk + j];
      else
        for (int c = 0; c < d; ++c) acc += qq[c] * to_f32(kh[int64_t(j) * s.k_ld + c]);
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
        for (int j = 0; j < lk; ++j) acc += p[j] * to_f32(vh[int64_t(j) * s.v_ld + c]);
      yi[c] = from_f32<T>(acc * inv);
    }
    __syncwarp();  // p and qq are free for the warp's next query
  }
}

size_t smem_bytes(const AttentionShape& s, bool shared_kv) {
  return sizeof(float) * ((shared_kv ? size_t(s.lk | 1) * s.d + size_t(s.lk) * s.dv : 0) + size_t(kWarps) * (s.lk + s.d));
}


// ---- tensor-core kernel ----------------------------------------------------

// Warps of a block: kSplit key shares x kGroups query groups of 16 rows
// (kGroups 4 / kSplit by default, 4 warps; the wide form keeps kSplit 4 with
// 2 or 4 groups, so one block's copy of a head's k and v serves 32 or 64
// queries instead of 16).
constexpr int kKeyTile = 64;  // keys per ring slot: 4 chunks of 16 (one mma K step of P v)
constexpr int kPad = 8;       // elements of padding per shared row (16 bytes)

// Ring slots per head-width bucket (kChunks 16-wide chunks): RT-DETR's d = 32
// holds 8 tiles (512 keys), so its 400-key heads load in one go; wider heads
// take fewer slots to keep a block's shared memory near 100 KiB or below.
__host__ __device__ constexpr int mma_stages(int chunks) { return chunks <= 2 ? 8 : chunks <= 4 ? 4 : 3; }
// Floats per lane a warp hands over in the split merge: outputs, max, sum.
__host__ __device__ constexpr int mma_merge_floats(int chunks) { return 8 * chunks + 4; }

__device__ __forceinline__ uint32_t smem_u32(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }

// 16 bytes global -> shared, bypassing L1; with valid false the 16 bytes are
// zero-filled instead (src is then not read, but stays a mapped address).
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// Four 8x8 b16 matrices; lane l gives the row address of matrix l / 8, row
// l % 8, and receives (row l / 4, columns 2(l % 4), +1) of each matrix, or
// with .trans (rows 2(l % 4), +1, column l / 4).
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

using dev::ld32;
using dev::pack2;

// Fragment layout is mma.m16n8k16's throughout: g = lane / 4 owns rows g and
// g + 8 of the warp's 16 queries, t = lane % 4 columns 2t, 2t + 1 of every
// 8-wide tile (scores: keys; outputs: channels) and, in A fragments, of both
// 8-wide halves of a 16-wide K step. kChunks bounds d / 16 and dv / 16 (the
// loops stop at the runtime widths, so fragments stay in registers);
// kSplit warps share a row group and take kWarpChunks 16-key chunks of each
// tile apiece.
template <typename T, int kChunks, int kSplit, int kGroups>
__global__ void __launch_bounds__(kSplit * kGroups * 32) attention_mma_kernel(const T* __restrict__ q, const T* __restrict__ k,
                                                                       const T* __restrict__ v, T* __restrict__ y,
                                                                       AttentionShape s) {
  constexpr int kStages = mma_stages(kChunks);
  constexpr int kThreads = kSplit * kGroups * 32;
  constexpr int kRows = 16 * kGroups;  // queries per block
  constexpr int kWarpChunks = kKeyTile / 16 / kSplit;
  static_assert(kStages >= 2 && kWarpChunks >= 1, "ring and split");
  dev::enter_grid();
  extern __shared__ uint4 mma_smem[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int split = warp % kSplit;
  const int row0 = blockIdx.x * kRows + (warp / kSplit) * 16;  // the warp's first query
  const int h = blockIdx.y, lq = s.lq, lk = s.lk, d = s.d, dv = s.dv, nd = d >> 4, nv = dv >> 4;
  const int64_t n = blockIdx.z, cv = int64_t(s.heads) * dv;  // y's row; q, k, v rows s.q_ld, s.k_ld, s.v_ld apart
  const T* kh = k + n * lk * s.k_ld + int64_t(h) * d;  // key j, channel c: kh[j * s.k_ld + c]
  const T* vh = v + n * lk * s.v_ld + int64_t(h) * dv;
  // Keys are loaded up to a whole 16-key chunk (rows past lk zero-filled, so
  // a masked weight never meets garbage: 0 * NaN); chunks past that are
  // skipped. Row strides d + 8, dv + 8 elements: an odd number of 16-byte
  // units, so the 8 rows of an ldmatrix phase fall in 8 distinct bank quads.
  const int chunks = (lk + 15) >> 4, ntiles = (lk + kKeyTile - 1) / kKeyTile;
  const int slots = min(ntiles, kStages), ldk = d + kPad, ldv = dv + kPad;
  T* ks = reinterpret_cast<T*>(mma_smem);  // [slots][kKeyTile][ldk]
  T* vs = ks + slots * kKeyTile * ldk;      // [slots][kKeyTile][ldv]
  // Always one commit group per tile index, empty past the last tile, so
  // "tile i has landed" is wait_group<kStages - 2> at every step.
  auto load_tile = [&](int tile) {
    if (tile < ntiles) {
      const int slot = tile % kStages, j0 = tile * kKeyTile, rows = min(kKeyTile, chunks * 16 - j0);
      T* kd = ks + slot * kKeyTile * ldk;
      T* vd = vs + slot * kKeyTile * ldv;
      const int kq = d >> 3, vq = dv >> 3;  // 16-byte pieces per row
      for (int i = threadIdx.x; i < rows * kq; i += kThreads) {
        const int r = i / kq, c = (i - r * kq) * 8, j = j0 + r;
        cp_async16(smem_u32(kd + r * ldk + c), kh + int64_t(j < lk ? j : 0) * s.k_ld + c, j < lk);
      }
      for (int i = threadIdx.x; i < rows * vq; i += kThreads) {
        const int r = i / vq, c = (i - r * vq) * 8, j = j0 + r;
        cp_async16(smem_u32(vd + r * ldv + c), vh + int64_t(j < lk ? j : 0) * s.v_ld + c, j < lk);
      }
    }
    cp_async_commit();
  };
#pragma unroll
  for (int i = 0; i < kStages - 1; ++i) load_tile(i);

  // The warp's queries as A fragments of q k^T (rows past lq are zeros).
  uint32_t qa[kChunks][4];
  {
    const int r0 = row0 + g, r1 = r0 + 8;
    const T* q0 = q + (n * lq + min(r0, lq - 1)) * s.q_ld + int64_t(h) * d + 2 * t;
    const T* q1 = q + (n * lq + min(r1, lq - 1)) * s.q_ld + int64_t(h) * d + 2 * t;
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      const bool in = c < nd;
      qa[c][0] = in && r0 < lq ? ld32(q0 + 16 * c) : 0u;
      qa[c][1] = in && r1 < lq ? ld32(q1 + 16 * c) : 0u;
      qa[c][2] = in && r0 < lq ? ld32(q0 + 16 * c + 8) : 0u;
      qa[c][3] = in && r1 < lq ? ld32(q1 + 16 * c + 8) : 0u;
    }
  }
  const bool rows_in = row0 < lq;
  const float scale2 = s.scale * 1.4426950408889634f;  // exp(x) = exp2(x log2 e)
  // Output accumulators (8-wide channel tiles), running max (of scaled
  // log2-domain scores) and this lane's partial sum, for rows g and g + 8.
  float o[2 * kChunks][4] = {};
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  // ldmatrix row addresses: lane l reads key (l % 8) + 8 * bit of each matrix
  // pair. k (non-transposed): matrices (keys 0-7 | 8-15) x (channels 0-7 |
  // 8-15) in the order b0, b1 of key tile 0, b0, b1 of key tile 1. v
  // (transposed): (keys 0-7 | 8-15) x (channels 0-7 | 8-15) as b0, b1 of
  // channel tile 0, then of channel tile 1.
  const int k_row = (lane & 7) + ((lane >> 4) << 3), k_col = ((lane >> 3) & 1) << 3;
  const int v_row = (lane & 7) + (((lane >> 3) & 1) << 3), v_col = (lane >> 4) << 3;

  for (int tile = 0; tile < ntiles; ++tile) {
    cp_async_wait<kStages - 2>();
    __syncthreads();  // tile landed for every thread's copies; slot (tile - 1) % kStages is free
    load_tile(tile + kStages - 1);
    const int c0 = tile * (kKeyTile / 16) + split * kWarpChunks;  // the warp's first chunk (global)
    if (!rows_in || c0 >= chunks) continue;
    const int slot = tile % kStages, key0 = split * kWarpChunks * 16;  // key0: within the tile
    const T* kt = ks + slot * kKeyTile * ldk;
    const T* vt = vs + slot * kKeyTile * ldv;

    float sc[2 * kWarpChunks][4] = {};
#pragma unroll
    for (int kk = 0; kk < kWarpChunks; ++kk) {
      if (c0 + kk >= chunks) break;
      const uint32_t base = smem_u32(kt + (key0 + 16 * kk + k_row) * ldk + k_col);
#pragma unroll
      for (int c = 0; c < kChunks; ++c) {
        if (c >= nd) break;
        uint32_t b[4];
        ldsm_x4(b, base + 32 * c);  // channels 16c.. (32 bytes on)
        dev::mma16816<T>(sc[2 * kk], qa[c], b[0], b[1]);
        dev::mma16816<T>(sc[2 * kk + 1], qa[c], b[2], b[3]);
      }
    }
    // Online softmax: the row max over the 4 lanes of a quad (they share
    // rows), the old accumulators rescaled by exp2(old max - new max). mu
    // stands in for a max that is still -inf (no key yet) so no inf - inf
    // appears; every row sees key 0 in its first chunk, so it never does.
    float mx[2] = {m[0], m[1]};
    const int kbase = tile * kKeyTile + key0 + 2 * t;
#pragma unroll
    for (int j = 0; j < 2 * kWarpChunks; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float x = kbase + 8 * j + (e & 1) < lk ? sc[j][e] * scale2 : -INFINITY;
        sc[j][e] = x;
        mx[e >> 1] = fmaxf(mx[e >> 1], x);
      }
    float alpha[2], mu[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
      mu[r] = mx[r] == -INFINITY ? 0.f : mx[r];
      alpha[r] = exp2f(m[r] - mu[r]);
      m[r] = mx[r];
      l[r] *= alpha[r];
    }
#pragma unroll
    for (int j = 0; j < 2 * kWarpChunks; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float p = exp2f(sc[j][e] - mu[e >> 1]);
        sc[j][e] = p;
        l[e >> 1] += p;
      }
#pragma unroll
    for (int j = 0; j < 2 * kChunks; ++j) {
      o[j][0] *= alpha[0], o[j][1] *= alpha[0];
      o[j][2] *= alpha[1], o[j][3] *= alpha[1];
    }
    // P v: the score tiles 2kk, 2kk + 1 (C layout) are exactly the A
    // fragment of key chunk kk: (row g | g + 8) x (keys 2t | 8 + 2t).
#pragma unroll
    for (int kk = 0; kk < kWarpChunks; ++kk) {
      if (c0 + kk >= chunks) break;
      const uint32_t pa[4] = {pack2<T>(sc[2 * kk][0], sc[2 * kk][1]), pack2<T>(sc[2 * kk][2], sc[2 * kk][3]),
                              pack2<T>(sc[2 * kk + 1][0], sc[2 * kk + 1][1]), pack2<T>(sc[2 * kk + 1][2], sc[2 * kk + 1][3])};
      const uint32_t base = smem_u32(vt + (key0 + 16 * kk + v_row) * ldv + v_col);
#pragma unroll
      for (int c = 0; c < kChunks; ++c) {
        if (c >= nv) break;
        uint32_t b[4];
        ldsm_x4_trans(b, base + 32 * c);
        dev::mma16816<T>(o[2 * c], pa, b[0], b[1]);
        dev::mma16816<T>(o[2 * c + 1], pa, b[2], b[3]);
      }
    }
  }
  cp_async_wait<0>();  // only empty groups are left; none may land in reused memory
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
  }
  if constexpr (kSplit > 1) {
    // Warps 1..kSplit-1 of a row group hand (outputs, max, sum) to its warp
    // 0 lane by lane ([warp][value][lane]: conflict-free), which rescales
    // them to the common max and adds them, in split order.
    constexpr int E = mma_merge_floats(kChunks);
    float* xs = reinterpret_cast<float*>(mma_smem);
    __syncthreads();  // every warp is done with the k, v tiles
    if (split > 0) {
      float* mine = xs + warp * E * 32 + lane;
#pragma unroll
      for (int j = 0; j < 2 * kChunks; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) mine[(4 * j + e) * 32] = o[j][e];
      mine[(E - 4) * 32] = m[0], mine[(E - 3) * 32] = m[1], mine[(E - 2) * 32] = l[0], mine[(E - 1) * 32] = l[1];
    }
    __syncthreads();
    if (split == 0) {
#pragma unroll
      for (int w = 1; w < kSplit; ++w) {
        const float* other = xs + (warp + w) * E * 32 + lane;
        float a[2], b[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const float mo = other[(E - 4 + r) * 32], lo = other[(E - 2 + r) * 32];
          const float mn = fmaxf(m[r], mo), mun = mn == -INFINITY ? 0.f : mn;
          a[r] = exp2f(m[r] - mun), b[r] = exp2f(mo - mun);
          l[r] = l[r] * a[r] + lo * b[r];
          m[r] = mn;
        }
#pragma unroll
        for (int j = 0; j < 2 * kChunks; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) o[j][e] = o[j][e] * a[e >> 1] + other[(4 * j + e) * 32] * b[e >> 1];
      }
    }
  }
  if (split != 0 || !rows_in) return;
  const float inv0 = 1.f / l[0], inv1 = 1.f / l[1];  // l >= 1: the max's own weight is exp2(0)
  const int r0 = row0 + g, r1 = r0 + 8;
  T* y0 = y + (n * lq + r0) * cv + int64_t(h) * dv + 2 * t;
  T* y1 = y + (n * lq + r1) * cv + int64_t(h) * dv + 2 * t;
#pragma unroll
  for (int j = 0; j < 2 * kChunks; ++j) {
    if (j >= 2 * nv) break;
    if (r0 < lq) *reinterpret_cast<uint32_t*>(y0 + 8 * j) = pack2<T>(o[j][0] * inv0, o[j][1] * inv0);
    if (r1 < lq) *reinterpret_cast<uint32_t*>(y1 + 8 * j) = pack2<T>(o[j][2] * inv1, o[j][3] * inv1);
  }
}

// Shared memory of the tensor-core kernel: the ring (no more slots than
// tiles), or the split merge's hand-over if that is larger.
size_t mma_smem_bytes(const AttentionShape& s, int chunks, int split, int groups) {
  const int64_t ntiles = (int64_t(s.lk) + kKeyTile - 1) / kKeyTile;
  const int64_t slots = ntiles < mma_stages(chunks) ? ntiles : mma_stages(chunks);
  const size_t ring = size_t(slots) * kKeyTile * size_t(s.d + kPad + s.dv + kPad) * 2;
  const size_t merge = split > 1 ? size_t(split) * groups * mma_merge_floats(chunks) * 32 * sizeof(float) : 0;
  return ring > merge ? ring : merge;
}

// Head-width bucket: 16-wide chunks the kernel's fragment arrays hold.
int mma_chunks(const AttentionShape& s) {
  const int c = (s.d > s.dv ? s.d : s.dv) / 16;
  return c <= 2 ? 2 : c <= 4 ? 4 : 8;
}

// Key split of the tensor-core kernel: queries across the 4 warps (split 1)
// when that already gives every SM a block; else the warps of a block split
// each key tile 2 or 4 ways, multiplying the blocks.
int mma_split(const AttentionShape& s) {
  for (int split : {1, 2}) {
    const int64_t rows = 16 * (4 / split);
    if ((s.lq + rows - 1) / rows * s.heads * s.n >= detail::sm_count()) return split;
  }
  return 4;
}

template <typename T, int kChunks, int kSplit, int kGroups>
void launch_mma(const void* q, const void* k, const void* v, void* y, const AttentionShape& s, cudaStream_t stream) {
  auto kernel = attention_mma_kernel<T, kChunks, kSplit, kGroups>;
  const size_t smem = mma_smem_bytes(s, kChunks, kSplit, kGroups);
  KILN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  constexpr int rows = 16 * kGroups;
  const dim3 grid(unsigned((s.lq + rows - 1) / rows), unsigned(s.heads), unsigned(s.n));
  detail::launch("attention", kernel, grid, kSplit * kGroups * 32, smem, stream, static_cast<const T*>(q),
                 static_cast<const T*>(k), static_cast<const T*>(v), static_cast<T*>(y), s);
}

// The block forms (key split, query groups) the kernel is built for; the
// caller checked the pair (attention_mma_form_ok).
template <typename T, int kChunks>
void launch_mma_form(int split, int groups, const void* q, const void* k, const void* v, void* y, const AttentionShape& s,
                     cudaStream_t stream) {
  if (split == 1) launch_mma<T, kChunks, 1, 4>(q, k, v, y, s, stream);
  else if (split == 2) launch_mma<T, kChunks, 2, 2>(q, k, v, y, s, stream);
  else if (groups == 1) launch_mma<T, kChunks, 4, 1>(q, k, v, y, s, stream);
  else if (groups == 2) launch_mma<T, kChunks, 4, 2>(q, k, v, y, s, stream);
  else launch_mma<T, kChunks, 4, 4>(q, k, v, y, s, stream);
}

}  // namespace

bool attention_uses_mma(const AttentionShape& s, DType dt) {
  return (dt == DType::F16 || dt == DType::BF16) && s.d % 16 == 0 && s.dv % 16 == 0 && s.d >= 16 && s.dv >= 16 &&
         s.d <= kMaxAttentionMmaWidth && s.dv <= kMaxAttentionMmaWidth && s.lq >= 1 && s.lk >= 1;
}
bool attention_mma_form_ok(int split, int groups) {
  return (split == 1 && groups == 4) || (split == 2 && groups == 2) || (split == 4 && (groups == 1 || groups == 2 || groups == 4));
}

int attention_wide_groups(int64_t lq, int64_t heads, int64_t n, int sms) {
  for (int groups : {4, 2})
    if ((lq + 16 * groups - 1) / (16 * groups) * heads * n * 2 >= sms) return groups;
  return 1;
}

bool attention_kv_in_shared(const AttentionShape& s) { return smem_bytes(s, true) <= kMaxAttentionSmem; }
bool attention_fits(const AttentionShape& s) { return smem_bytes(s, false) <= kMaxAttentionSmem; }

void attention(const void* q, const void* k, const void* v_, void* y, DType dt, const AttentionShape& shape,
               cudaStream_t stream) {
  AttentionShape s = shape;
  if (s.n <= 0) return;
  if (!s.q_ld) s.q_ld = int64_t(s.heads) * s.d;
  if (!s.k_ld) s.k_ld = int64_t(s.heads) * s.d;
  if (!s.v_ld) s.v_ld = int64_t(s.heads) * s.dv;
  if (s.q_ld < int64_t(s.heads) * s.d || s.k_ld < int64_t(s.heads) * s.d || s.v_ld < int64_t(s.heads) * s.dv)
    fail_runtime("cuda attention: row strides ", s.q_ld, "/", s.k_ld, "/", s.v_ld, " below the rows' ", s.heads, " heads");
  if (s.n > 65535 || s.heads > 65535 || s.lq < 1 || s.lk < 1 || s.d < 1 || s.dv < 1)
    fail_runtime("cuda attention: unsupported shape (n ", s.n, ", heads ", s.heads, ", lq ", s.lq, ", lk ", s.lk, ", d ", s.d,
                 ", dv ", s.dv, ")");
  // Tensor cores when the rows allow 16-byte copies and 32-bit fragment
  // loads; a misaligned view falls back to the exact kernel (same limits).
  using detail::aligned16;
  const bool rows16 = s.q_ld % 8 == 0 && s.k_ld % 8 == 0 && s.v_ld % 8 == 0;  // 16-byte rows of 2-byte elements
  if (attention_uses_mma(s, dt) && rows16 && aligned16(q) && aligned16(k) && aligned16(v_) && aligned16(y)) {
    if (s.split != 0 && s.split != 1 && s.split != 2 && s.split != 4) fail_runtime("cuda attention: key split ", s.split, " (1, 2 or 4)");
    const int chunks = mma_chunks(s), split = s.split ? s.split : mma_split(s);
    const int groups = s.groups                 ? s.groups
                       : split == 4 && s.wide ? attention_wide_groups(s.lq, s.heads, s.n, detail::sm_count())
                                              : 4 / split;
    if (!attention_mma_form_ok(split, groups))
      fail_runtime("cuda attention: key split ", split, " with ", groups, " query groups a block (split 1: 4; 2: 2; 4: 1, 2 or 4)");
    auto go = [&](auto t) {
      using T = decltype(t);
      if (chunks == 2) launch_mma_form<T, 2>(split, groups, q, k, v_, y, s, stream);
      else if (chunks == 4) launch_mma_form<T, 4>(split, groups, q, k, v_, y, s, stream);
      else launch_mma_form<T, 8>(split, groups, q, k, v_, y, s, stream);
    };
    if (dt == DType::F16) go(__half{});
    else go(__nv_bfloat16{});
    return;
  }
  if (!attention_fits(s))
    fail_runtime("cuda attention: unsupported shape (n ", s.n, ", heads ", s.heads, ", lq ", s.lq, ", lk ", s.lk, ", d ", s.d,
                 ", dv ", s.dv, ")");
  const bool shared_kv = attention_kv_in_shared(s);
  const size_t smem = smem_bytes(s, shared_kv);
  AttentionShape a = s;
  const dim3 grid((s.lq + kQueriesPerBlock - 1) / kQueriesPerBlock, s.heads, unsigned(s.n));
  detail::dispatch_float(dt, "attention", [&](auto t) {
    using T = decltype(t);
    const int per16 = 16 / int(sizeof(T));
    a.vec = s.d % per16 == 0 && s.dv % per16 == 0 && s.k_ld % per16 == 0 && s.v_ld % per16 == 0 && aligned16(k) &&
            aligned16(v_);
    auto kernel = shared_kv ? attention_kernel<T, true> : attention_kernel<T, false>;
    KILN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    detail::launch("attention", kernel, grid, kWarps * 32, smem, stream, static_cast<const T*>(q), static_cast<const T*>(k),
                   static_cast<const T*>(v_), static_cast<T*>(y), a);
  });
}

}  // namespace kiln::cuda
