// kiln's implicit-GEMM convolution for dense f16/bf16 NHWC convs (groups 1),
// one candidate of the conv selector next to cuDNN's engines (conv.cpp,
// switch igemm_conv).
//
// Why our own: at batch 1 a detector backbone's convs do not fill the GPU.
// RT-DETR v2 r18vd's 3x3 convs each do 1.9 GFLOP (160x160x64 ... 20x20x512)
// and cuDNN 9.14 takes 8-15 us for each where the FLOP and byte bound is
// 3-4 us; its stem convs (320x320, 32-64 channels) take 10-22 us
// (bench/results/2026-12-05-session21). cuDNN's engines cannot split K over
// a thread-block cluster (the 20x20x512 convs make 56 tiles of 64x64 for 132
// SMs), and a library kernel cannot start its constant filter loads before
// the previous kernel ends (PDL). This kernel does both:
//   - a block owns a BM x BN output tile; K walks (filter tap, 32-channel
//     chunk) through a 3-stage cp.async pipeline in shared memory, ldmatrix
//     into mma.sync.m16n8k16 (f32 accumulation), 4 warps in 2 x 2;
//   - `splits` blocks of one cluster take equal parts of K and add their
//     partial tiles through distributed shared memory; each finishes 1/splits
//     of the tile's rows, so no workspace, no second launch, and the sum's
//     order is fixed (deterministic);
//   - the first stages' filter tiles are requested before the PDL wait
//     (filters are engine constants, written before any call), the input
//     tiles after it;
//   - the epilogue is act(acc + bias + residual), cuDNN's fused pattern,
//     stored 16 bytes at a time.
// Measured (H100, CudaIgemmConvPerf, bench/results/2026-12-05-session22):
// every form below loses to cuDNN's fastest tactic on every r18vd conv
// (im2col 1.4-3.3x; the halo form 1.07x on the stem, 1.5x on 160x160x64), so
// the switch is off by default. Beating cuDNN here needs wgmma + TMA.
#include <cooperative_groups.h>

#include <algorithm>

#include "backends/cuda/device_common.cuh"
#include "backends/cuda/kernels.hpp"

namespace kiln::cuda {
namespace {

namespace cg = cooperative_groups;

constexpr int kBK = 32;             // K per stage: 32 channels of one filter tap
constexpr int kPitch = kBK + 8;     // shared row pitch in elements (80 bytes: ldmatrix rows hit distinct banks)
constexpr int kStages = 3;
constexpr int kThreads = 128;       // 4 warps, 2 x 2 over the tile

using dev::cp_async16;
using dev::cp_async_commit;
using dev::cp_async_wait;
using dev::ldmatrix_x4;

// Adds 8 channels of an f32 accumulator tile row (a 16-byte-aligned f32 run in shared memory).
__device__ __forceinline__ void add8(float (&v)[8], const float* p) {
  const float4 lo = reinterpret_cast<const float4*>(p)[0], hi = reinterpret_cast<const float4*>(p)[1];
  v[0] += lo.x, v[1] += lo.y, v[2] += lo.z, v[3] += lo.w, v[4] += hi.x, v[5] += hi.y, v[6] += hi.z, v[7] += hi.w;
}

struct IgemmArgs {
  IgemmConvShape s;
  int64_t rows;      // output pixels, n * out_h * out_w
  int x_px, y_px;    // pixel strides (elements)
  int cchunks;       // 32-channel chunks per tap
  int iters;         // K stages in all: r * s * cchunks
  Activation act;
};

// The row of B (output channel within the tile) whose address lane gives
// ldmatrix for the warp's first pair of n8 tiles (matrices: n 0-7 k 0-7,
// n 0-7 k 8-15, n 8-15 k 0-7, n 8-15 k 8-15; the k half is added by the caller).
template <int BN>
__device__ __forceinline__ int b_lane_row(int wn, int lane) {
  return wn * (BN / 2) + (lane & 7) + ((lane >> 4) << 3);
}

// acc += A B over one k16 step for a warp's MT x NT tiles of 16 x 8. arow[i]:
// this lane's A row for m16 tile i (row i*16 + lane % 16, k half lane / 16,
// as ldmatrix wants it); brow: this lane's B row for the first n8 pair (B
// stored [n][k], pitch bpitch elements), its k half included.
template <typename T, int MT, int NT>
__device__ __forceinline__ void mma_k16(float (&acc)[MT][NT][4], const T* (&arow)[MT], const T* brow,
                                        int bpitch) {
  uint32_t fa[MT][4], fb[NT][2];
#pragma unroll
  for (int i = 0; i < MT; ++i) ldmatrix_x4(fa[i], arow[i]);
#pragma unroll
  for (int j = 0; j < NT; j += 2) {
    uint32_t r[4];
    ldmatrix_x4(r, brow + j * 8 * bpitch);
    fb[j][0] = r[0], fb[j][1] = r[1], fb[j + 1][0] = r[2], fb[j + 1][1] = r[3];
  }
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int j = 0; j < NT; ++j) dev::mma16816<T>(acc[i][j], fa[i], fb[j][0], fb[j][1]);
}

// The epilogue of 8 output channels [n, n + 8) of output pixel m: + bias,
// + residual, activation, one 16-byte store.
template <typename T>
__device__ __forceinline__ void finish8(float (&v)[8], int64_t m, int n, const T* bias, const T* res, T* y,
                                        const IgemmArgs& a) {
  if (bias) {
    float b[8];
    dev::load_vec<T, 8>(bias + n, b);
#pragma unroll
    for (int u = 0; u < 8; ++u) v[u] += b[u];
  }
  if (res) {
    float rr[8];
    dev::load_vec<T, 8>(res + m * a.s.k + n, rr);
#pragma unroll
    for (int u = 0; u < 8; ++u) v[u] += rr[u];
  }
#pragma unroll
  for (int u = 0; u < 8; ++u) v[u] = dev::act_rt<true>(a.act, v[u]);
  dev::store_vec<T, 8>(y + m * a.y_px + n, v);
}

// A warp's share of a BM x BN f32 tile into shared memory [BM][BN + 4]
// (mma's accumulator layout: lane g = lane / 4 holds rows g and g + 8, t = lane % 4 columns 2t, 2t + 1).
template <int BM, int BN>
__device__ __forceinline__ void stage_tile(float* so, const float (&acc)[BM / 32][BN / 16][4], int wm, int wn, int lane) {
  constexpr int kOutPitch = BN + 4;
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int i = 0; i < BM / 32; ++i)
#pragma unroll
    for (int j = 0; j < BN / 16; ++j) {
      const int r = wm * (BM / 2) + i * 16 + g, c = wn * (BN / 2) + j * 8 + 2 * t;
      *reinterpret_cast<float2*>(so + r * kOutPitch + c) = make_float2(acc[i][j][0], acc[i][j][1]);
      *reinterpret_cast<float2*>(so + (r + 8) * kOutPitch + c) = make_float2(acc[i][j][2], acc[i][j][3]);
    }
}

// y = act(conv(x, w) + bias + residual) for one BM x BN tile and one part of
// K (blockIdx.z of a cluster of SPLITS along z).
template <typename T, int BM, int BN>
__global__ void __launch_bounds__(kThreads) igemm_conv_kernel(const T* __restrict__ x, const T* __restrict__ w,
                                                               const T* __restrict__ bias, const T* __restrict__ res,
                                                               T* __restrict__ y, IgemmArgs a) {
  constexpr int MT = BM / 32, NT = BN / 16;       // m16 / n8 tiles of a warp's (BM/2) x (BN/2)
  constexpr int AR = BM / 32, BR = BN / 32;       // tile rows each thread loads (4 threads per 32-channel row)
  extern __shared__ __align__(16) unsigned char smem[];
  T* sa = reinterpret_cast<T*>(smem);                       // [kStages][BM][kPitch]
  T* sb = sa + kStages * BM * kPitch;                       // [kStages][BN][kPitch]
  const IgemmConvShape& s = a.s;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm = warp & 1, wn = warp >> 1;
  const int64_t m0 = int64_t(blockIdx.x) * BM;
  const int n0 = blockIdx.y * BN;
  const int splits = gridDim.z, part = blockIdx.z;
  const int it0 = int(int64_t(a.iters) * part / splits), it1 = int(int64_t(a.iters) * (part + 1) / splits);
  const int ld_row = tid >> 2, ld_ch = (tid & 3) * 8;  // this thread's row in each 32-row group, its 8 channels
  const int64_t kdim = int64_t(s.r) * s.s * s.c;

  // Filter rows this thread loads (KRSC: row n is output channel n's K values).
  const T* wrow[BR];
  bool wok[BR];
#pragma unroll
  for (int j = 0; j < BR; ++j) {
    const int n = n0 + ld_row + 32 * j;
    wok[j] = n < s.k;
    wrow[j] = w + (wok[j] ? int64_t(n) * kdim : 0);
  }
  auto tap_of = [&](int it, int& tap, int& c0) {
    tap = it / a.cchunks;
    c0 = (it - tap * a.cchunks) * kBK;
  };
  auto load_b = [&](int stage, int it) {
    int tap, c0;
    tap_of(it, tap, c0);
    const int ch = c0 + ld_ch;
    const bool cok = ch < s.c;
    T* dst = sb + stage * BN * kPitch + ld_row * kPitch + ld_ch;
#pragma unroll
    for (int j = 0; j < BR; ++j) {
      const bool ok = wok[j] && cok;
      cp_async16(dst + 32 * j * kPitch, ok ? wrow[j] + int64_t(tap) * s.c + ch : w, ok);
    }
  };

  // Prefetch: the first stages' filter tiles need nothing from the kernel before.
#pragma unroll
  for (int st = 0; st < kStages - 1; ++st)
    if (it0 + st < it1) load_b(st, it0 + st);
  dev::enter_grid();

  // Output pixels of the rows this thread loads: image start, top-left input coordinate.
  int64_t img[AR];
  int iy0[AR], ix0[AR];
#pragma unroll
  for (int j = 0; j < AR; ++j) {
    const int64_t m = m0 + ld_row + 32 * j;
    if (m < a.rows) {
      const int ox = int(m % s.out_w);
      const int64_t rest = m / s.out_w;
      const int oy = int(rest % s.out_h), nn = int(rest / s.out_h);
      img[j] = int64_t(nn) * s.h * s.w;
      iy0[j] = oy * s.stride_h - s.pad_t;
      ix0[j] = ox * s.stride_w - s.pad_l;
    } else {
      img[j] = 0, iy0[j] = -(1 << 28), ix0[j] = 0;  // never inside the image
    }
  }
  auto load_a = [&](int stage, int it) {
    int tap, c0;
    tap_of(it, tap, c0);
    const int ky = tap / s.s, kx = tap - ky * s.s;
    const int ch = c0 + ld_ch;
    const bool cok = ch < s.c;
    T* dst = sa + stage * BM * kPitch + ld_row * kPitch + ld_ch;
#pragma unroll
    for (int j = 0; j < AR; ++j) {
      const int iy = iy0[j] + ky * s.dil_h, ix = ix0[j] + kx * s.dil_w;
      const bool ok = cok && iy >= 0 && iy < s.h && ix >= 0 && ix < s.w;
      const T* src = ok ? x + (img[j] + int64_t(iy) * s.w + ix) * a.x_px + ch : x;
      cp_async16(dst + 32 * j * kPitch, src, ok);
    }
  };
#pragma unroll
  for (int st = 0; st < kStages - 1; ++st) {
    if (it0 + st < it1) load_a(st, it0 + st);
    cp_async_commit();
  }

  float acc[MT][NT][4] = {};
  for (int it = it0; it < it1; ++it) {
    cp_async_wait<kStages - 2>();
    __syncthreads();
    {
      const int nx = it + kStages - 1;
      if (nx < it1) {
        const int st = (nx - it0) % kStages;
        load_b(st, nx);
        load_a(st, nx);
      }
      cp_async_commit();
    }
    const int st = (it - it0) % kStages;
    const T* tile_a = sa + st * BM * kPitch + (wm * (BM / 2) + (lane & 15)) * kPitch + (lane >> 4) * 8;
    const T* tile_b = sb + st * BN * kPitch + b_lane_row<BN>(wn, lane) * kPitch + ((lane >> 3) & 1) * 8;
#pragma unroll
    for (int kk = 0; kk < kBK; kk += 16) {
      const T* arow[MT];
#pragma unroll
      for (int i = 0; i < MT; ++i) arow[i] = tile_a + i * 16 * kPitch + kk;
      mma_k16<T, MT, NT>(acc, arow, tile_b + kk, kPitch);
    }
  }
  cp_async_wait<0>();
  __syncthreads();  // the pipeline's shared memory becomes the f32 tile

  // The partial tile in shared memory, [BM][BN + 4] f32.
  constexpr int kOutPitch = BN + 4;
  float* so = reinterpret_cast<float*>(smem);
  stage_tile<BM, BN>(so, acc, wm, wn, lane);
  if (splits > 1) cg::this_cluster().sync();
  else __syncthreads();

  // This block's rows of the tile: the sum over the cluster's parts, then the epilogue.
  const int r_lo = BM * part / splits, r_hi = BM * (part + 1) / splits;
  constexpr int kGroups = BN / 8;  // 8 channels (16 bytes out) per step
  for (int e = tid; e < (r_hi - r_lo) * kGroups; e += kThreads) {
    const int r = r_lo + e / kGroups, c = (e % kGroups) * 8;
    const int64_t m = m0 + r;
    const int n = n0 + c;
    if (m >= a.rows || n >= s.k) continue;
    float v[8] = {};
    add8(v, so + r * kOutPitch + c);
    for (int q = 0; q < splits; ++q)
      if (q != part) add8(v, cg::this_cluster().map_shared_rank(so, q) + r * kOutPitch + c);
    finish8<T>(v, m, n, bias, res, y, a);
  }
  if (splits > 1) cg::this_cluster().sync();  // peers read this block's tile until here
}

// The halo form for convs of few channels over large maps (RT-DETR's stem and
// first stage: 320x320x32, 160x160x64). The im2col form fetches every input
// pixel once per filter tap (9x for 3x3) from L2; here a block owns a TH x TW
// patch of output pixels of one image x BN channels, copies the patch's input
// window (its halo: (TH-1)*stride + (R-1)*dil + 1 rows, likewise columns) for
// one 32-channel chunk into shared memory once, with the chunk's filter for
// every tap, and ldmatrix reads each tap's A rows straight out of the window
// (a lane's row address is its output pixel's input pixel for that tap).
// Chunks are double-buffered; the first chunk's filter is requested before
// the PDL wait. No K split (the K loop is short: c / 32 chunks).
struct HaloArgs {
  int ih, iw;           // the input window of a patch
  int tiles_x, tiles_y; // patches per image
  int wpitch;           // filter row pitch in shared memory: r*s*32 + 8 elements
};

// Elements of one stage of the halo form: the window, then bn filter rows.
__host__ __device__ constexpr int halo_stage_elems(int ih, int iw, int wpitch, int bn) {
  return ih * iw * kPitch + bn * wpitch;
}

// Copies channels [c0, c0 + 32 * chunks) of every tap of filter rows
// [n0, n0 + BN) (KRSC) into dst [BN][wpitch], tap t's channels at t * 32 * chunks;
// zeros past k and c.
template <typename T, int BN>
__device__ __forceinline__ void load_filter(T* dst, const T* w, const IgemmConvShape& s, int n0, int c0, int chunks,
                                            int wpitch) {
  const int taps = s.r * s.s, per_row = taps * chunks * 4;
  const int64_t kdim = int64_t(taps) * s.c;
  for (int e = threadIdx.x; e < BN * per_row; e += kThreads) {
    const int n = e / per_row, rest = e - n * per_row, tap = rest / (chunks * 4), off = (rest - tap * chunks * 4) * 8;
    const int ch = c0 + off;
    const bool ok = n0 + n < s.k && ch < s.c;
    cp_async16(dst + n * wpitch + tap * chunks * kBK + off, ok ? w + int64_t(n0 + n) * kdim + int64_t(tap) * s.c + ch : w,
               ok);
  }
}

// Copies chunk c0 (32 channels) of the input window of the patch whose
// top-left output pixel is (oy0, ox0) of image img into dst [ih * iw][kPitch],
// zeros outside the image and past the channels.
template <typename T, int TH, int TW>
__device__ __forceinline__ void load_window(T* dst, const T* x, const IgemmArgs& a, const HaloArgs& hl, int img, int oy0,
                                            int ox0, int c0) {
  const IgemmConvShape& s = a.s;
  const int iy_base = oy0 * s.stride_h - s.pad_t, ix_base = ox0 * s.stride_w - s.pad_l;
  for (int e = threadIdx.x; e < hl.ih * hl.iw * 4; e += kThreads) {
    const int px = e >> 2, hy = px / hl.iw, hx = px - hy * hl.iw, ch = c0 + (e & 3) * 8;
    const int iy = iy_base + hy, ix = ix_base + hx;
    const bool ok = ch < s.c && iy >= 0 && iy < s.h && ix >= 0 && ix < s.w;
    cp_async16(dst + px * kPitch + (e & 3) * 8, ok ? x + ((int64_t(img) * s.h + iy) * s.w + ix) * a.x_px + ch : x, ok);
  }
}

// This lane's A rows in a window: for m16 tile i, output pixel (ty, tx) of
// the patch (row wm * BM/2 + i*16 + lane % 16) -> its window pixel for tap (0, 0).
template <int BM, int TW>
__device__ __forceinline__ void window_rows(int (&pix)[BM / 32], const IgemmConvShape& s, const HaloArgs& hl, int wm,
                                            int lane) {
#pragma unroll
  for (int i = 0; i < BM / 32; ++i) {
    const int r = wm * (BM / 2) + i * 16 + (lane & 15), ty = r / TW, tx = r - ty * TW;
    pix[i] = ty * s.stride_h * hl.iw + tx * s.stride_w;
  }
}

// acc += one 32-channel chunk of every tap: A rows out of the window (pix:
// window_rows), B from shared filter rows at wrow + tap * tap_step (this
// lane's ldmatrix row and k half included), pitch hl.wpitch.
template <typename T, int MT, int NT>
__device__ __forceinline__ void window_chunk(float (&acc)[MT][NT][4], const T* window, const int (&pix)[MT], int lane,
                                             const T* wrow, int tap_step, const IgemmConvShape& s, const HaloArgs& hl) {
  const int a_half = (lane >> 4) * 8;
  for (int tap = 0; tap < s.r * s.s; ++tap) {
    const int ky = tap / s.s, kx = tap - ky * s.s;
    const int toff = ky * s.dil_h * hl.iw + kx * s.dil_w;
#pragma unroll
    for (int kk = 0; kk < kBK; kk += 16) {
      const T* arow[MT];
#pragma unroll
      for (int i = 0; i < MT; ++i) arow[i] = window + (pix[i] + toff) * kPitch + kk + a_half;
      mma_k16<T, MT, NT>(acc, arow, wrow + tap * tap_step + kk, hl.wpitch);
    }
  }
}

template <typename T, int TH, int TW, int BN>
__global__ void __launch_bounds__(kThreads) igemm_halo_kernel(const T* __restrict__ x, const T* __restrict__ w,
                                                               const T* __restrict__ bias, const T* __restrict__ res,
                                                               T* __restrict__ y, IgemmArgs a, HaloArgs hl) {
  constexpr int BM = TH * TW, MT = BM / 32, NT = BN / 16;
  extern __shared__ __align__(16) unsigned char smem[];
  T* base = reinterpret_cast<T*>(smem);
  const IgemmConvShape& s = a.s;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm = warp & 1, wn = warp >> 1;
  const int per_image = hl.tiles_x * hl.tiles_y;
  const int img = blockIdx.x / per_image, patch = blockIdx.x - img * per_image;
  const int oy0 = (patch / hl.tiles_x) * TH, ox0 = (patch % hl.tiles_x) * TW;
  const int n0 = blockIdx.y * BN;
  const int stage_elems = halo_stage_elems(hl.ih, hl.iw, hl.wpitch, BN);
  const int window_elems = hl.ih * hl.iw * kPitch;

  auto load_w = [&](int stage, int q) {
    load_filter<T, BN>(base + stage * stage_elems + window_elems, w, s, n0, q * kBK, 1, hl.wpitch);
  };
  auto load_x = [&](int stage, int q) {
    load_window<T, TH, TW>(base + stage * stage_elems, x, a, hl, img, oy0, ox0, q * kBK);
  };
  load_w(0, 0);
  dev::enter_grid();
  load_x(0, 0);
  cp_async_commit();

  int pix[MT];
  window_rows<BM, TW>(pix, s, hl, wm, lane);
  const int b_row = b_lane_row<BN>(wn, lane), b_half = ((lane >> 3) & 1) * 8;

  float acc[MT][NT][4] = {};
  for (int q = 0; q < a.cchunks; ++q) {
    if (q + 1 < a.cchunks) {  // the next chunk into the other buffer (its last reader finished at the barrier below)
      load_w((q + 1) & 1, q + 1);
      load_x((q + 1) & 1, q + 1);
    }
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    const T* window = base + (q & 1) * stage_elems;
    window_chunk<T, MT, NT>(acc, window, pix, lane, window + window_elems + b_row * hl.wpitch + b_half, kBK, s, hl);
    __syncthreads();  // this buffer is loaded again two chunks on
  }
  cp_async_wait<0>();

  float* so = reinterpret_cast<float*>(smem);  // every chunk's reads ended at the loop's last barrier
  stage_tile<BM, BN>(so, acc, wm, wn, lane);
  __syncthreads();
  constexpr int kGroups = BN / 8;
  for (int e = tid; e < BM * kGroups; e += kThreads) {
    const int r = e / kGroups, c = (e - r * kGroups) * 8;
    const int ty = r / TW, tx = r - ty * TW, oy = oy0 + ty, ox = ox0 + tx, n = n0 + c;
    if (oy >= s.out_h || ox >= s.out_w || n >= s.k) continue;
    float v[8] = {};
    add8(v, so + r * (BN + 4) + c);
    finish8<T>(v, (int64_t(img) * s.out_h + oy) * s.out_w + ox, n, bias, res, y, a);
  }
}

// The persistent halo form: one block per SM share (per BN channels) holds
// the filter of all its taps and channels in shared memory, loaded once
// (before the PDL wait), and walks patches blockIdx.x, + gridDim.x, ...; each
// patch's input window is loaded per 32-channel chunk, double-buffered across
// chunks and patches, and the epilogue writes from the accumulator fragments.
// For the stem and first-stage convs, whose filters (18-74 KiB) the plain
// halo form re-reads from L2 for every patch. hl.wpitch: r*s*cchunks*32 + 8.
template <typename T, int TH, int TW, int BN>
__global__ void __launch_bounds__(kThreads) igemm_halo_persist_kernel(const T* __restrict__ x, const T* __restrict__ w,
                                                                       const T* __restrict__ bias,
                                                                       const T* __restrict__ res, T* __restrict__ y,
                                                                       IgemmArgs a, HaloArgs hl) {
  constexpr int BM = TH * TW, MT = BM / 32, NT = BN / 16;
  extern __shared__ __align__(16) unsigned char smem[];
  T* wts_all = reinterpret_cast<T*>(smem);              // [BN][wpitch]
  T* windows = wts_all + BN * hl.wpitch;                 // [2][ih * iw][kPitch]
  const IgemmConvShape& s = a.s;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm = warp & 1, wn = warp >> 1;
  const int n0 = blockIdx.y * BN;
  const int cpad = a.cchunks * kBK;
  const int window_elems = hl.ih * hl.iw * kPitch;
  const int per_image = hl.tiles_x * hl.tiles_y, patches = s.n * per_image;

  // The whole filter share, once.
  load_filter<T, BN>(wts_all, w, s, n0, 0, a.cchunks, hl.wpitch);
  cp_async_commit();
  dev::enter_grid();
  if (int(blockIdx.x) >= patches) {  // (the launcher makes no such block)
    cp_async_wait<0>();
    return;
  }

  auto load_item = [&](int buf, int p, int q) {
    const int img = p / per_image, patch = p - img * per_image;
    load_window<T, TH, TW>(windows + buf * window_elems, x, a, hl, img, (patch / hl.tiles_x) * TH,
                           (patch % hl.tiles_x) * TW, q * kBK);
  };
  load_item(0, blockIdx.x, 0);
  cp_async_commit();

  int pix[MT];
  window_rows<BM, TW>(pix, s, hl, wm, lane);
  const T* wrow = wts_all + b_lane_row<BN>(wn, lane) * hl.wpitch + ((lane >> 3) & 1) * 8;
  const int g = lane >> 2, t = lane & 3;

  int buf = 0;
  for (int p = blockIdx.x; p < patches; p += gridDim.x) {
    float acc[MT][NT][4] = {};
    for (int q = 0; q < a.cchunks; ++q) {
      const bool last = q + 1 == a.cchunks;
      const int np = last ? p + int(gridDim.x) : p, nq = last ? 0 : q + 1;
      if (np < patches) load_item(buf ^ 1, np, nq);  // its last reader finished at the barrier below
      cp_async_commit();
      cp_async_wait<1>();
      __syncthreads();
      window_chunk<T, MT, NT>(acc, windows + buf * window_elems, pix, lane, wrow + q * kBK, cpad, s, hl);
      __syncthreads();
      buf ^= 1;
    }
    // Epilogue from the fragments: rows g and g + 8 of each m16 tile, channels 2t and 2t + 1 of each n8 tile.
    const int img = p / per_image, patch = p - img * per_image;
    const int oy0 = (patch / hl.tiles_x) * TH, ox0 = (patch % hl.tiles_x) * TW;
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = wm * (BM / 2) + i * 16 + g + 8 * h, ty = r / TW, tx = r - ty * TW;
        const int oy = oy0 + ty, ox = ox0 + tx;
        if (oy >= s.out_h || ox >= s.out_w) continue;
        const int64_t m = (int64_t(img) * s.out_h + oy) * s.out_w + ox;
#pragma unroll
        for (int j = 0; j < NT; ++j) {
          const int n = n0 + wn * (BN / 2) + j * 8 + 2 * t;
          if (n >= s.k) continue;
          float v0 = acc[i][j][2 * h], v1 = acc[i][j][2 * h + 1];
          if (bias) v0 += dev::to_f32(bias[n]), v1 += dev::to_f32(bias[n + 1]);
          if (res) {
            const T* rp = res + m * s.k + n;
            v0 += dev::to_f32(rp[0]), v1 += dev::to_f32(rp[1]);
          }
          *reinterpret_cast<uint32_t*>(y + m * a.y_px + n) = dev::pack2<T>(dev::act_rt<true>(a.act, v0),
                                                                       dev::act_rt<true>(a.act, v1));
        }
      }
  }
  cp_async_wait<0>();
}

size_t smem_bytes(int bm, int bn, DType dt) {
  const size_t pipe = size_t(kStages) * (bm + bn) * kPitch * dtype_size(dt);
  const size_t out = size_t(bm) * (bn + 4) * sizeof(float);
  return pipe > out ? pipe : out;
}

template <typename T, int BM, int BN>
void launch(const void* x, const void* w, const void* bias, const void* res, void* y, const IgemmArgs& a, int splits,
            DType dt, cudaStream_t stream) {
  const size_t smem = smem_bytes(BM, BN, dt);
  const dim3 grid(unsigned((a.rows + BM - 1) / BM), unsigned((a.s.k + BN - 1) / BN), unsigned(splits));
  detail::launch_clustered("igemm_conv_nhwc", unsigned(splits), igemm_conv_kernel<T, BM, BN>, grid, kThreads, smem,
                           stream, static_cast<const T*>(x), static_cast<const T*>(w), static_cast<const T*>(bias),
                           static_cast<const T*>(res), static_cast<T*>(y), a);
}

// The halo form's patch geometry and shared memory for tile t (t.th > 0).
HaloArgs halo_args(const IgemmConvShape& s, const IgemmTile& t) {
  const int th = t.th, tw = t.bm / t.th;
  const int cchunks = (s.c + kBK - 1) / kBK;
  return {(th - 1) * s.stride_h + (s.r - 1) * s.dil_h + 1, (tw - 1) * s.stride_w + (s.s - 1) * s.dil_w + 1,
          (s.out_w + tw - 1) / tw, (s.out_h + th - 1) / th, s.r * s.s * (t.persist ? cchunks : 1) * kBK + 8};
}
size_t halo_smem_bytes(const IgemmConvShape& s, const IgemmTile& t, DType dt) {
  const HaloArgs h = halo_args(s, t);
  const size_t stage = size_t(halo_stage_elems(h.ih, h.iw, h.wpitch, t.bn));
  if (t.persist) return (stage + size_t(h.ih) * h.iw * kPitch) * dtype_size(dt);  // the filter share, two windows
  const int stages = s.c > kBK ? 2 : 1;
  const size_t pipe = size_t(stages) * stage * dtype_size(dt);
  const size_t out = size_t(t.bm) * (t.bn + 4) * sizeof(float);
  return pipe > out ? pipe : out;
}
constexpr size_t kHaloMaxSmem = 200 * 1024;  // of the 227 KiB a block may opt into on sm_90

template <typename T, int TH, int TW, int BN>
void launch_halo(const void* x, const void* w, const void* bias, const void* res, void* y, const IgemmArgs& a,
                 const IgemmTile& t, DType dt, cudaStream_t stream) {
  const HaloArgs h = halo_args(a.s, t);
  const size_t smem = halo_smem_bytes(a.s, t, dt);
  auto kernel = t.persist ? igemm_halo_persist_kernel<T, TH, TW, BN> : igemm_halo_kernel<T, TH, TW, BN>;
  KILN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  const int64_t patches = int64_t(a.s.n) * h.tiles_x * h.tiles_y;
  const unsigned ytiles = unsigned((a.s.k + BN - 1) / BN);
  int64_t xblocks = patches;
  if (t.persist) {  // as many blocks as stay resident, shared among the channel tiles
    int per_sm = 0;
    KILN_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, smem));
    const int64_t resident = int64_t(std::max(per_sm, 1)) * detail::sm_count();
    xblocks = std::min<int64_t>(patches, std::max<int64_t>(1, resident / ytiles));
  }
  const dim3 grid(unsigned(xblocks), ytiles, 1);
  detail::launch("igemm_conv_nhwc", kernel, grid, kThreads, smem, stream, static_cast<const T*>(x),
                 static_cast<const T*>(w), static_cast<const T*>(bias), static_cast<const T*>(res), static_cast<T*>(y), a,
                 h);
}

constexpr IgemmTile kTiles[] = {{64, 32, 1}, {64, 64, 1}, {128, 64, 1}, {64, 128, 1}};
constexpr IgemmTile kHaloTiles[] = {{128, 32, 1, 8},       {128, 64, 1, 8},       {64, 32, 1, 8},       {64, 64, 1, 8},
                                    {128, 32, 1, 8, true}, {128, 64, 1, 8, true}, {64, 32, 1, 8, true}, {64, 64, 1, 8, true}};

}  // namespace

std::string igemm_tile_name(const IgemmTile& t) {
  if (t.th > 0) return cat("kiln igemm halo ", t.persist ? "persistent " : "", t.th, "x", t.bm / t.th, " n", t.bn);
  return cat("kiln igemm ", t.bm, "x", t.bn, " s", t.splits);
}

std::string igemm_conv_unsupported(DType dt, const IgemmConvShape& s, const IgemmTile& t) {
  if (dt != DType::F16 && dt != DType::BF16) return cat("dtype ", dtype_name(dt), " (f16/bf16 only: tensor-core mma)");
  if (s.c % 8 || s.k % 8) return cat("channels ", s.c, " -> ", s.k, " (multiples of 8 only: 16-byte loads and stores)");
  if (s.n < 1 || s.h < 1 || s.w < 1 || s.c < 1 || s.k < 1 || s.r < 1 || s.s < 1 || s.out_h < 1 || s.out_w < 1 ||
      s.stride_h < 1 || s.stride_w < 1 || s.dil_h < 1 || s.dil_w < 1 || s.pad_t < 0 || s.pad_l < 0)
    return "empty or negative shape";
  if ((s.x_stride && (s.x_stride < s.c || s.x_stride % 8)) || (s.y_stride && (s.y_stride < s.k || s.y_stride % 8)))
    return cat("pixel strides ", s.x_stride, "/", s.y_stride, " (multiples of 8, >= the channels)");
  const int64_t rows = int64_t(s.n) * s.out_h * s.out_w;
  if (int64_t(s.n) * s.h * s.w > (int64_t(1) << 31) / 2 || rows > (int64_t(1) << 31) / 2)
    return "more than 2^30 pixels";
  if (int64_t(s.r) * s.s * s.c > (int64_t(1) << 30) || s.r > 64 || s.s > 64 || s.dil_h > 64 || s.dil_w > 64 ||
      s.stride_h > 64 || s.stride_w > 64)
    return "filter too large";
  if (t.th > 0) {
    bool known = false;
    for (const IgemmTile& k : kHaloTiles)
      known = known || (k.bm == t.bm && k.bn == t.bn && k.th == t.th && k.persist == t.persist);
    if (!known || t.splits != 1) return cat("halo tile ", igemm_tile_name(t), " (8x16 or 8x8 patches, 32 or 64 channels)");
    if (halo_smem_bytes(s, t, dt) > kHaloMaxSmem)
      return cat("halo tile ", igemm_tile_name(t), " needs ", halo_smem_bytes(s, t, dt), " bytes of shared memory");
    const HaloArgs h = halo_args(s, t);
    if (int64_t(s.n) * h.tiles_x * h.tiles_y > 0x7fffffff || (s.k + t.bn - 1) / t.bn > 65535) return "grid too large";
    return "";
  }
  bool known = false;
  for (const IgemmTile& k : kTiles) known = known || (k.bm == t.bm && k.bn == t.bn);
  if (!known) return cat("tile ", t.bm, "x", t.bn, " (64x32, 64x64, 128x64 or 64x128)");
  if (t.splits != 1 && t.splits != 2 && t.splits != 4) return cat("K split in ", t.splits, " (1, 2 or 4)");
  const int iters = s.r * s.s * ((s.c + kBK - 1) / kBK);
  if (t.splits > iters) return cat("K split in ", t.splits, " with ", iters, " K stages");
  if ((rows + t.bm - 1) / t.bm > 0x7fffffff || (s.k + t.bn - 1) / t.bn > 65535) return "grid too large";
  return "";
}

std::vector<IgemmTile> igemm_conv_tiles(const IgemmConvShape& s) {
  // Every tile whose N extent is not mostly padding, at every K split that
  // leaves each part >= 4 stages and makes at most ~4 blocks per SM; the halo
  // forms where a filter has several taps and the channels are few (<= 128:
  // at most 4 chunks) and they fit in shared memory. Timing picks among them
  // (conv.cpp).
  std::vector<IgemmTile> out;
  const int64_t rows = int64_t(s.n) * s.out_h * s.out_w;
  const int iters = s.r * s.s * ((s.c + kBK - 1) / kBK);
  const int64_t sms = detail::sm_count();
  for (const IgemmTile& t : kTiles) {
    if (t.bn > 32 && s.k <= t.bn / 2) continue;
    const int64_t tiles = ((rows + t.bm - 1) / t.bm) * ((s.k + t.bn - 1) / t.bn);
    for (int sp : {1, 2, 4}) {
      if (sp > 1 && (iters / sp < 4 || tiles * sp > 4 * sms)) continue;
      out.push_back({t.bm, t.bn, sp});
    }
  }
  if (s.r * s.s > 1 && s.c <= 4 * kBK)
    for (const IgemmTile& t : kHaloTiles)
      if (!(t.bn > 32 && s.k <= t.bn / 2) && halo_smem_bytes(s, t, DType::F16) <= kHaloMaxSmem) out.push_back(t);
  return out;
}

void igemm_conv_nhwc(const void* x, const void* w_krsc, const void* bias, const void* residual, void* y, DType dt,
                     const IgemmConvShape& s, Activation act, const IgemmTile& t, cudaStream_t stream) {
  const std::string why = igemm_conv_unsupported(dt, s, t);
  if (!why.empty()) fail_runtime("igemm_conv_nhwc: unsupported ", why);
  if (!detail::aligned16(x) || !detail::aligned16(w_krsc) || !detail::aligned16(y) || (bias && !detail::aligned16(bias)) ||
      (residual && !detail::aligned16(residual)))
    fail_runtime("igemm_conv_nhwc: pointers must be 16-byte aligned");
  IgemmArgs a{s, int64_t(s.n) * s.out_h * s.out_w, s.x_stride ? s.x_stride : s.c, s.y_stride ? s.y_stride : s.k,
              (s.c + kBK - 1) / kBK, 0, act};
  a.iters = s.r * s.s * a.cchunks;
  detail::dispatch_float(dt, "igemm_conv_nhwc", [&](auto tv) {
    using T = decltype(tv);
    if constexpr (!std::is_same_v<T, float>) {
      if (t.th > 0) {
        if (t.bm == 128 && t.bn == 32) launch_halo<T, 8, 16, 32>(x, w_krsc, bias, residual, y, a, t, dt, stream);
        else if (t.bm == 128) launch_halo<T, 8, 16, 64>(x, w_krsc, bias, residual, y, a, t, dt, stream);
        else if (t.bn == 32) launch_halo<T, 8, 8, 32>(x, w_krsc, bias, residual, y, a, t, dt, stream);
        else launch_halo<T, 8, 8, 64>(x, w_krsc, bias, residual, y, a, t, dt, stream);
      } else if (t.bm == 64 && t.bn == 32) launch<T, 64, 32>(x, w_krsc, bias, residual, y, a, t.splits, dt, stream);
      else if (t.bm == 64 && t.bn == 64) launch<T, 64, 64>(x, w_krsc, bias, residual, y, a, t.splits, dt, stream);
      else if (t.bm == 128) launch<T, 128, 64>(x, w_krsc, bias, residual, y, a, t.splits, dt, stream);
      else launch<T, 64, 128>(x, w_krsc, bias, residual, y, a, t.splits, dt, stream);
    }
  });
}

}  // namespace kiln::cuda
