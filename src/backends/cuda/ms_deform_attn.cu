// ms_deform_attn (ms_deform_attn.cpp lowers it; ref/ms_deform_attn.cpp says
// what it computes): one block per (image, query).
//   1. one thread per (head, point) pair: the head's softmax over its P
//      logits, the point's sampling location and its (up to) 4 corner rows of
//      value with their weights (attention weight x bilinear weight; a corner
//      outside its map gets row -1), into shared memory;
//   2. one thread per output channel (head h, channel d): the sum over the
//      head's P x 4 corners of weight x value[row, h, d]; the threads of a head
//      read one row's D contiguous elements together (coalesced).
// The location arithmetic is f32 in the CPU kernel's order with explicitly
// rounded operations (no FMA contraction), so the discrete method picks the
// reference's pixel and the bilinear weights are the CPU kernel's.
// The warp form (switch warp_deform, DeformPath::Warp) computes the same
// corners and the same sums in the same order, so the same bits, with one
// warp per query: step 1 by its 32 lanes, step 2 with each lane summing
// 16 / sizeof(T) channels that it loads 16 bytes at a time, 4 corners' loads
// in flight. Why: the block form's thread per channel makes 4 * P two-byte
// loads (48 for RT-DETR) one after another, latency-bound, which shows at
// batch 8 (34 us a layer against the warp form's 18 on the H100); at batch 1
// the block form's 300 blocks win (7.4 against 11.3 us).
#include "backends/cuda/device_common.cuh"
#include "backends/cuda/kernels.hpp"

namespace kiln::cuda {
namespace {

using dev::from_f32;
using dev::to_f32;

// torch's .to(int64) of loc * extent + 0.5 (truncation), clamped to [0, extent).
__device__ __forceinline__ int64_t discrete_index(float loc, int64_t extent) {
  const float f = __fadd_rn(__fmul_rn(loc, float(extent)), 0.5f);
  if (!(f >= 1.f)) return 0;  // trunc of (-1, 1) is 0; below (and NaN) clamps to 0
  if (double(f) >= double(extent - 1)) return extent - 1;
  return int64_t(f);
}

// The level of point p (points are level-major) and its first point.
__device__ __forceinline__ int level_of(const DeformAttnShape& s, int p) {
  int l = 0, first = 0;
  while (l + 1 < s.levels && p >= first + s.points[l]) first += s.points[l++];
  return l;
}

// Step 1 for (head, point) pair i: its softmax weight, sampling location and
// up to 4 corner rows of value with their weights (w4, r4; a corner outside
// its map or a padded one: row -1). logit(k): the f32 logit of point k of the
// pair's head; o: the pair's (x, y) offset in f32; b: the query's reference
// box (cx, cy, w, h). The forms read these from global or shared memory; the
// arithmetic is this one function, so their bits agree.
template <typename L>
__device__ __forceinline__ void corners_of(const DeformAttnShape& s, int i, const L& logit, float ox, float oy,
                                           const float (&b)[4], float* w4, int* r4) {
  const int h = i / s.p, p = i - h * s.p;
  float mx = -INFINITY;
  for (int k = 0; k < s.p; ++k) mx = fmaxf(mx, logit(h, k));
  float sum = 0.f;
  for (int k = 0; k < s.p; ++k) sum += expf(logit(h, k) - mx);
  const float a = __fmul_rn(expf(logit(h, p) - mx), __fdiv_rn(1.f, sum));
  const int l = level_of(s, p);
  const int64_t H = s.level_h[l], W = s.level_w[l], start = s.level_start[l];
  const float scale = __fdiv_rn(1.f, float(s.points[l]));  // transformers' n_points_scale
  const float lx = __fadd_rn(b[0], __fmul_rn(__fmul_rn(__fmul_rn(ox, scale), b[2]), s.offset_scale));
  const float ly = __fadd_rn(b[1], __fmul_rn(__fmul_rn(__fmul_rn(oy, scale), b[3]), s.offset_scale));
  for (int k = 0; k < 4; ++k) w4[k] = 0.f, r4[k] = -1;
  if (s.discrete) {
    w4[0] = a;
    r4[0] = int(start + discrete_index(ly, H) * W + discrete_index(lx, W));
    return;
  }
  const float px = __fsub_rn(__fmul_rn(lx, float(W)), 0.5f), py = __fsub_rn(__fmul_rn(ly, float(H)), 0.5f);
  // Entirely outside (or not finite): every corner is padding.
  if (!(px > -1.f && px < float(W) && py > -1.f && py < float(H))) return;
  const float x0f = floorf(px), y0f = floorf(py);
  const float fx = __fsub_rn(px, x0f), fy = __fsub_rn(py, y0f);
  const int64_t x0 = int64_t(x0f), y0 = int64_t(y0f);
  const bool x0_in = x0 >= 0, x1_in = x0 + 1 < W, y0_in = y0 >= 0, y1_in = y0 + 1 < H;
  const float gx = __fsub_rn(1.f, fx), gy = __fsub_rn(1.f, fy);
  if (y0_in && x0_in) w4[0] = __fmul_rn(__fmul_rn(a, gy), gx), r4[0] = int(start + y0 * W + x0);
  if (y0_in && x1_in) w4[1] = __fmul_rn(__fmul_rn(a, gy), fx), r4[1] = int(start + y0 * W + x0 + 1);
  if (y1_in && x0_in) w4[2] = __fmul_rn(__fmul_rn(a, fy), gx), r4[2] = int(start + (y0 + 1) * W + x0);
  if (y1_in && x1_in) w4[3] = __fmul_rn(__fmul_rn(a, fy), fx), r4[3] = int(start + (y0 + 1) * W + x0 + 1);
}

// Step 1 of query nq (n * q + query) for pairs first, first + stride, ...:
// corners_of with the query's box, logits and offsets read from global memory.
template <typename T>
__device__ __forceinline__ void corners_from(const DeformAttnShape& s, int64_t nq, int first, int stride,
                                             const T* __restrict__ ref, const T* __restrict__ off,
                                             const T* __restrict__ logits, float* wgt, int* row) {
  float b[4];
  for (int k = 0; k < 4; ++k) b[k] = to_f32(ref[nq * 4 + k]);
  const T* lg = logits + nq * s.logit_ld;
  const auto logit = [&](int h, int k) { return to_f32(lg[int64_t(h) * s.p + k]); };
  for (int i = first; i < s.heads * s.p; i += stride) {
    const T* o = off + nq * s.off_ld + int64_t(i) * 2;
    corners_of(s, i, logit, to_f32(o[0]), to_f32(o[1]), b, wgt + 4 * i, row + 4 * i);
  }
}

template <typename T>
__global__ void ms_deform_attn_kernel(const T* __restrict__ value, const T* __restrict__ ref, const T* __restrict__ off,
                                      const T* __restrict__ logits, T* __restrict__ y, DeformAttnShape s) {
  dev::enter_grid();
  extern __shared__ float smem[];
  const int pairs = s.heads * s.p;
  float* wgt = smem;                                    // [pairs][4] corner weights
  int* row = reinterpret_cast<int*>(smem + 4 * pairs);  // [pairs][4] value rows (S index), -1: none
  const int64_t nq = blockIdx.x;                        // n * q + query
  const int64_t n = nq / s.q;
  corners_from(s, nq, int(threadIdx.x), int(blockDim.x), ref, off, logits, wgt, row);
  __syncthreads();
  const int hd = s.heads * s.d;
  for (int c = threadIdx.x; c < hd; c += blockDim.x) {
    const int h = c / s.d;
    const T* v = value + n * s.s * s.value_ld + c;  // row r of this channel at v + r * value_ld
    const float* w = wgt + 4 * h * s.p;
    const int* r = row + 4 * h * s.p;
    float acc = 0.f;
    for (int k = 0; k < 4 * s.p; ++k)
      if (r[k] >= 0) acc += w[k] * to_f32(v[int64_t(r[k]) * s.value_ld]);
    y[nq * hd + c] = from_f32<T>(acc);
  }
}

// The warp form: warp w of the block takes query blockIdx.x * kDeformWarps + w.
// Its lanes compute the pairs' corners (corners_from, the block form's step 1),
// then each lane sums kVec channels (16 bytes) at a time over the head's
// corners in the block form's order (k = 0 .. 4P - 1, skipping rows -1), so
// every channel's sum is the block form's. The corners' loads are issued
// kAhead at a time before their sums (a row -1 loads row 0 and is not added).
// Session 33's first form, measured against a rewrite in session 34 (2 warps
// a block, logits and offsets staged in shared memory, 8 loads in flight): at
// batch 8 18.2 against 22.7 us, at batch 1 11.7 against 11.3 (H100; the block
// form 7.4 there, so the warp form runs from 2400 queries: kWarpDeformMinQueries).
constexpr int kDeformWarps = 4;
// Shared memory per warp: weights and rows [pairs][4].
__host__ __device__ constexpr size_t deform_warp_floats(int pairs) { return size_t(pairs) * 8; }
template <typename T>
__global__ void __launch_bounds__(kDeformWarps * 32) ms_deform_attn_warp_kernel(const T* __restrict__ value, const T* __restrict__ ref,
                                                                            const T* __restrict__ off, const T* __restrict__ logits,
                                                                            T* __restrict__ y, DeformAttnShape s) {
  constexpr int kVec = 16 / sizeof(T);
  constexpr int kAhead = 4;
  dev::enter_grid();
  extern __shared__ float smem[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int pairs = s.heads * s.p;
  float* wgt = smem + warp * deform_warp_floats(pairs);  // this warp's [pairs][4] weights
  int* row = reinterpret_cast<int*>(wgt + 4 * pairs);     // [pairs][4] rows
  const int64_t nq = int64_t(blockIdx.x) * kDeformWarps + warp;  // n * q + query
  if (nq >= s.n * s.q) return;
  const int64_t n = nq / s.q;
  corners_from(s, nq, lane, 32, ref, off, logits, wgt, row);
  __syncwarp();
  const int hd = s.heads * s.d, chunks = hd / kVec, corners = 4 * s.p;
  const T* vn = value + n * s.s * s.value_ld;
  for (int c = lane; c < chunks; c += 32) {
    const int c0 = c * kVec, h = c0 / s.d;
    const float* w = wgt + 4 * h * s.p;
    const int* r = row + 4 * h * s.p;
    float acc[kVec];
#pragma unroll
    for (int e = 0; e < kVec; ++e) acc[e] = 0.f;
    for (int k0 = 0; k0 < corners; k0 += kAhead) {
      uint4 v[kAhead];
#pragma unroll
      for (int j = 0; j < kAhead; ++j) {
        const int k = k0 + j, rk = k < corners ? r[k] : -1;
        v[j] = *reinterpret_cast<const uint4*>(vn + int64_t(rk >= 0 ? rk : 0) * s.value_ld + c0);
      }
#pragma unroll
      for (int j = 0; j < kAhead; ++j) {
        const int k = k0 + j;
        if (k >= corners || r[k] < 0) continue;
        const float wk = w[k];
        const T* ve = reinterpret_cast<const T*>(&v[j]);
#pragma unroll
        for (int e = 0; e < kVec; ++e) acc[e] += wk * to_f32(ve[e]);
      }
    }
    T out[kVec];
#pragma unroll
    for (int e = 0; e < kVec; ++e) out[e] = from_f32<T>(acc[e]);
    *reinterpret_cast<uint4*>(y + nq * hd + c0) = *reinterpret_cast<const uint4*>(out);
  }
}

}  // namespace

bool ms_deform_warp_ok(const DeformAttnShape& s, DType dt) {
  const int vec = dt == DType::F32 ? 4 : 8;  // elements in 16 bytes
  const int64_t value_ld = s.value_ld ? s.value_ld : int64_t(s.heads) * s.d;
  // Pairs: each warp's corners in shared memory (32 bytes a pair), the block's 4 warps under 48 KiB.
  return (dt == DType::F32 || dt == DType::F16 || dt == DType::BF16) && s.d % vec == 0 && value_ld % vec == 0 &&
         s.heads * s.p <= 256;
}

void ms_deform_attn(const void* value, const void* ref, const void* offsets, const void* logits, void* y, DType dt,
                    const DeformAttnShape& shape, cudaStream_t stream, DeformPath path) {
  DeformAttnShape s = shape;
  const int64_t blocks = s.n * s.q;
  if (blocks <= 0) return;
  if (!s.value_ld) s.value_ld = int64_t(s.heads) * s.d;
  if (!s.off_ld) s.off_ld = int64_t(s.heads) * s.p * 2;
  if (!s.logit_ld) s.logit_ld = int64_t(s.heads) * s.p;
  if (s.value_ld < int64_t(s.heads) * s.d || s.off_ld < int64_t(s.heads) * s.p * 2 || s.logit_ld < int64_t(s.heads) * s.p)
    fail_runtime("cuda ms_deform_attn: row strides ", s.value_ld, "/", s.off_ld, "/", s.logit_ld, " below the rows");
  if (blocks > int64_t(0x7fffffff)) fail_runtime("cuda ms_deform_attn: ", blocks, " queries is too many");
  const int pairs = s.heads * s.p, hd = s.heads * s.d;
  if (pairs > kMaxDeformPairs || s.levels < 1 || s.levels > kMaxDeformLevels)
    fail_runtime("cuda ms_deform_attn: ", pairs, " (head, point) pairs, ", s.levels, " levels");
  // The warp form where the shape and the pointers allow 16-byte value loads
  // and output stores; the block form otherwise (the same bits).
  const bool warp = path == DeformPath::Warp && ms_deform_warp_ok(s, dt) &&
                    reinterpret_cast<uintptr_t>(value) % 16 == 0 && reinterpret_cast<uintptr_t>(y) % 16 == 0;
  detail::dispatch_float(dt, "ms_deform_attn", [&](auto t) {
    using T = decltype(t);
    if (warp) {
      const size_t smem = kDeformWarps * deform_warp_floats(pairs) * sizeof(float);
      detail::launch("ms_deform_attn", ms_deform_attn_warp_kernel<T>, int((blocks + kDeformWarps - 1) / kDeformWarps),
                     kDeformWarps * 32, smem, stream, static_cast<const T*>(value), static_cast<const T*>(ref),
                     static_cast<const T*>(offsets), static_cast<const T*>(logits), static_cast<T*>(y), s);
      return;
    }
    const int want = hd > pairs ? hd : pairs;
    const int threads = want >= 1024 ? 1024 : (want + 31) / 32 * 32;
    const size_t smem = size_t(pairs) * 4 * (sizeof(float) + sizeof(int));
    detail::launch("ms_deform_attn", ms_deform_attn_kernel<T>, int(blocks), threads, smem, stream,
                   static_cast<const T*>(value), static_cast<const T*>(ref), static_cast<const T*>(offsets),
                   static_cast<const T*>(logits), static_cast<T*>(y), s);
  });
}

}  // namespace kiln::cuda
