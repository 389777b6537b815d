// kiln's own tensor-core convolution for narrow channel windows (Res2Net's
// chunk convs), f16/bf16 NHWC, implicit GEMM on mma.sync.m16n8k16.
//
// Why our own: a Res2Net block's 3x3 convs read channel windows of the 1x1
// conv's output, add the previous chunk's result to their input, and write
// into the block's concat buffer. cuDNN 9.14 runs a strided (windowed) conv
// with one extra kernel and has no prologue that adds a second tensor, so with
// cuDNN the block needs a split, the chain adds and the concat as kernels of
// their own (families/timm_res2net/README.md). Here x, x_add and y are windows
// (pointer + pixel stride), the add happens while the im2col rows are loaded,
// and the result lands in place: a block is its convs.
//
// The problems are small (batch 1: 49-3136 output pixels, 16-208 channels,
// K = 9*c up to 1872), so the kernel is built for latency, not peak
// throughput: a block owns a 16-pixel x 8*NT-channel tile, its warps split
// the K loop (reduced through shared memory at the end), and every operand
// goes straight from global memory (L1/L2) into the mma fragments, with no
// shared-memory staging or block-wide barriers inside the loop.
#include "backends/cuda/device_common.cuh"
#include "backends/cuda/kernels.hpp"

namespace kiln::cuda {
namespace {

// Loads two consecutive 16-bit elements as one 32-bit register.
__device__ __forceinline__ uint32_t ld2(const void* p) { return *static_cast<const uint32_t*>(p); }

// The elementwise sum of two packed pairs, each rounded to T the way the
// stored add kernel rounds it (f32 sum, round to nearest even), so a fused
// chain add gives the bits an add node would have stored.
template <typename T>
__device__ __forceinline__ uint32_t add_pair(uint32_t a, uint32_t b) {
  const T* pa = reinterpret_cast<const T*>(&a);
  const T* pb = reinterpret_cast<const T*>(&b);
  T r[2];
  r[0] = dev::from_f32<T>(dev::to_f32(pa[0]) + dev::to_f32(pb[0]));
  r[1] = dev::from_f32<T>(dev::to_f32(pa[1]) + dev::to_f32(pb[1]));
  return *reinterpret_cast<const uint32_t*>(r);
}


// One output row (pixel) of the tile as the im2col loader sees it.
struct RowOrigin {
  int64_t image_px;  // first pixel of its image, in pixels
  int iy0, ix0;      // top-left input coordinate of its window
  bool valid;
};

__device__ __forceinline__ RowOrigin row_origin(int64_t m, int64_t rows, const WindowConvShape& s) {
  RowOrigin o{0, 0, 0, m < rows};
  if (!o.valid) return o;
  const int ox = int(m % s.out_w);
  const int64_t rest = m / s.out_w;
  const int oy = int(rest % s.out_h);
  const int n = int(rest / s.out_h);
  o.image_px = int64_t(n) * s.h * s.w;
  o.iy0 = oy * s.stride_h - s.pad_t;
  o.ix0 = ox * s.stride_w - s.pad_l;
  return o;
}

// The side job for the tile's 16 output pixels, two channels per step. The
// pool sums its window row by row and scales by 1/divisor exactly as
// avg_pool_nhwc does, so the result is the same bits; a 1x1 pool is a copy.
template <typename T>
__device__ void run_side(const WindowSide& sd, int64_t m0, int64_t rows) {
  const PoolShape& p = sd.pool;
  const T* src = static_cast<const T*>(sd.src);
  T* dst = static_cast<T*>(sd.dst);
  const bool copy = p.kh == 1 && p.kw == 1 && p.stride_h == 1 && p.stride_w == 1 && p.pad_t == 0 && p.pad_l == 0;
  const int pairs = p.c / 2;
  for (int i = threadIdx.x; i < 16 * pairs; i += blockDim.x) {
    const int64_t m = m0 + i / pairs;
    const int e = 2 * (i % pairs);
    if (m >= rows) continue;
    uint32_t* out = reinterpret_cast<uint32_t*>(dst + m * p.y_stride + e);
    if (copy) {
      *out = ld2(src + m * p.x_stride + e);
      continue;
    }
    const int ox = int(m % p.out_w);
    const int64_t rest = m / p.out_w;
    const int oy = int(rest % p.out_h), b = int(rest / p.out_h);
    const int hs = oy * p.stride_h - p.pad_t, ws = ox * p.stride_w - p.pad_l;
    const int h0 = max(hs, 0), h1 = min(hs + p.kh, p.h), w0 = max(ws, 0), w1 = min(ws + p.kw, p.w);
    const T* img = src + int64_t(b) * p.h * p.w * p.x_stride + e;
    float a0 = 0.f, a1 = 0.f;
    for (int yy = h0; yy < h1; ++yy)
      for (int xx = w0; xx < w1; ++xx) {
        const uint32_t v = ld2(img + (int64_t(yy) * p.w + xx) * p.x_stride);
        const T* pv = reinterpret_cast<const T*>(&v);
        a0 += dev::to_f32(pv[0]);
        a1 += dev::to_f32(pv[1]);
      }
    const int he = min(hs + p.kh, p.h + p.pad_b), we = min(ws + p.kw, p.w + p.pad_r);
    const int divisor = p.count_include_pad ? (he - hs) * (we - ws) : (h1 - h0) * (w1 - w0);
    const float inv = 1.f / float(divisor);
    T r[2] = {dev::from_f32<T>(a0 * inv), dev::from_f32<T>(a1 * inv)};
    *out = *reinterpret_cast<const uint32_t*>(r);
  }
}

// A 16x8*NT tile of y = act(conv(x [+ x_add], w) + bias) for conv blockIdx.z
// of the group. Lane layout is mma.m16n8k16's: g = lane / 4 picks rows g and
// g + 8 (A, C) or column g (B), t = lane % 4 picks the element pair 2t (and
// 2t + 8 along K). K is walked in chunks of 16 channels of one filter tap;
// c % 8 == 0, so the upper half of a chunk is either all inside c or all past
// it (then zero). Warp v takes chunks v, v + warps, ...; (tap, channel) of
// the next chunk are stepped, not divided out.
template <typename T, Activation A, int NT>
__global__ void window_conv_kernel(const T* __restrict__ x, const T* __restrict__ x_add, const T* __restrict__ w,
                                   const T* __restrict__ bias, T* __restrict__ y, WindowConvShape s, int64_t rows,
                                   WindowSide side) {
  dev::enter_grid();
  extern __shared__ float partial[];  // [warps - 1][32 lanes][NT * 4]
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int64_t m0 = int64_t(blockIdx.x) * 16;
  const int n0 = blockIdx.y * 8 * NT;
  const int64_t kdim = int64_t(s.r) * s.s * s.c;
  x += blockIdx.z * s.x_group_step;
  y += blockIdx.z * s.y_group_step;
  w += blockIdx.z * int64_t(s.k) * kdim;
  if (bias) bias += blockIdx.z * s.k;
  if (side.src && blockIdx.y == 0 && blockIdx.z == 0) run_side<T>(side, m0, rows);
  const RowOrigin ro[2] = {row_origin(m0 + g, rows, s), row_origin(m0 + g + 8, rows, s)};
  const int per_tap = (s.c + 15) / 16;
  const int chunks = s.r * s.s * per_tap;
  // Filter rows this lane reads (KRSC: row n holds the K values of output channel n).
  const T* wrow[NT];
  bool wok[NT];
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    const int n = n0 + j * 8 + g;
    wok[j] = n < s.k;
    wrow[j] = w + (wok[j] ? int64_t(n) * kdim : 0);
  }
  const int tap_step = warps / per_tap, c_step = (warps - tap_step * per_tap) * 16;
  int tap = warp / per_tap, c0 = (warp - tap * per_tap) * 16;
  int ky = tap / s.s, kx = tap - ky * s.s;
  float acc[NT][4] = {};
#pragma unroll 2
  for (int ch = warp; ch < chunks; ch += warps) {
    const bool hi_ok = c0 + 8 < s.c;
    uint32_t a[4];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const RowOrigin& o = ro[h];
      const int iy = o.iy0 + ky * s.dil_h, ix = o.ix0 + kx * s.dil_w;
      const bool in = o.valid && iy >= 0 && iy < s.h && ix >= 0 && ix < s.w;
      const int64_t px = o.image_px + int64_t(iy) * s.w + ix;
      const int cl = c0 + 2 * t, chh = cl + 8;
      uint32_t lo = 0, hi = 0;
      if (in) {
        lo = ld2(x + px * s.x_stride + cl);
        if (hi_ok) hi = ld2(x + px * s.x_stride + chh);
        if (x_add) {
          lo = add_pair<T>(lo, ld2(x_add + px * s.x_add_stride + cl));
          if (hi_ok) hi = add_pair<T>(hi, ld2(x_add + px * s.x_add_stride + chh));
        }
      }
      a[h] = lo;      // a0: row g, a1: row g + 8 (K pair 2t)
      a[h + 2] = hi;  // a2, a3: the same rows, K pair 2t + 8
    }
    const int64_t kofs = int64_t(tap) * s.c + c0 + 2 * t;
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      const uint32_t b0 = wok[j] ? ld2(wrow[j] + kofs) : 0u;
      const uint32_t b1 = wok[j] && hi_ok ? ld2(wrow[j] + kofs + 8) : 0u;
      dev::mma16816<T>(acc[j], a, b0, b1);
    }
    // Next chunk of this warp.
    c0 += c_step;
    int dtap = tap_step;
    if (c0 >= per_tap * 16) c0 -= per_tap * 16, ++dtap;
    tap += dtap;
    kx += dtap;
    while (kx >= s.s) kx -= s.s, ++ky;
  }
  // Split-K: warps 1.. hand their partial sums to warp 0, which finishes the tile.
  if (warps > 1) {
    if (warp > 0) {
      float* mine = partial + (size_t(warp - 1) * 32 + lane) * NT * 4;
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) mine[j * 4 + e] = acc[j][e];
    }
    __syncthreads();
    if (warp > 0) return;
    for (int v = 1; v < warps; ++v) {
      const float* theirs = partial + (size_t(v - 1) * 32 + lane) * NT * 4;
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[j][e] += theirs[j * 4 + e];
    }
  }
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    const int n = n0 + j * 8 + 2 * t;
    if (n >= s.k) continue;
    const float b0 = bias ? dev::to_f32(bias[n]) : 0.f, b1 = bias ? dev::to_f32(bias[n + 1]) : 0.f;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t m = m0 + g + 8 * h;
      if (m >= rows) continue;
      T out[2];
      out[0] = dev::from_f32<T>(dev::act<A, true>(acc[j][2 * h] + b0));
      out[1] = dev::from_f32<T>(dev::act<A, true>(acc[j][2 * h + 1] + b1));
      *reinterpret_cast<uint32_t*>(y + m * s.y_stride + n) = *reinterpret_cast<const uint32_t*>(out);
    }
  }
}

// Tile width and split-K depth: wide tiles (fewer re-reads of the im2col rows)
// while there are at least as many tiles as SMs, then as many K-splitting
// warps as keep each SM at about 16 warps, each warp with >= 4 chunks.
WindowLaunch plan_launch(const WindowConvShape& s, WindowLaunch want) {
  const int64_t m_tiles = (int64_t(s.n) * s.out_h * s.out_w + 15) / 16;
  const int sms = detail::sm_count();
  auto tiles = [&](int nt) { return m_tiles * ((s.k + 8 * nt - 1) / (8 * nt)) * s.groups; };
  WindowLaunch l{want.nt ? want.nt : 4, 1};
  while (!want.nt && l.nt > 1 && tiles(l.nt) < sms) l.nt /= 2;
  const int chunks = s.r * s.s * ((s.c + 15) / 16);
  const int64_t blocks = tiles(l.nt);
  while (l.warps < 16 && blocks * l.warps * 2 <= int64_t(sms) * 16 && chunks >= l.warps * 4) l.warps *= 2;
  if (want.warps) l.warps = want.warps;
  return l;
}

template <typename T, Activation A, int NT>
void launch(const void* x, const void* x_add, const void* w, const void* bias, void* y, const WindowConvShape& s,
            const WindowLaunch& l, const WindowSide& side, cudaStream_t stream) {
  const int64_t rows = int64_t(s.n) * s.out_h * s.out_w;
  const dim3 grid(unsigned((rows + 15) / 16), unsigned((s.k + 8 * NT - 1) / (8 * NT)), unsigned(s.groups));
  const size_t smem = size_t(l.warps - 1) * 32 * NT * 4 * sizeof(float);
  detail::launch("window_conv_nhwc", window_conv_kernel<T, A, NT>, grid, l.warps * 32, smem, stream,
      static_cast<const T*>(x), static_cast<const T*>(x_add), static_cast<const T*>(w), static_cast<const T*>(bias),
      static_cast<T*>(y), s, rows, side);
}

bool aligned4(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 3u) == 0; }

}  // namespace

std::string window_conv_unsupported(DType dt, const WindowConvShape& s, const PoolShape* side) {
  if (dt != DType::F16 && dt != DType::BF16) return cat("dtype ", dtype_name(dt), " (f16/bf16 only: tensor-core mma)");
  if (s.c % 8 || s.k % 8) return cat("channels ", s.c, " -> ", s.k, " (multiples of 8 only)");
  if (s.x_stride % 2 || s.x_add_stride % 2 || s.y_stride % 2 || s.x_stride < s.c || s.y_stride < s.k ||
      s.x_add_stride < s.c || s.x_group_step % 2 || s.y_group_step % 2)
    return cat("pixel strides ", s.x_stride, "/", s.x_add_stride, "/", s.y_stride, " (even, >= the window width)");
  if (s.n < 1 || s.out_h < 1 || s.out_w < 1 || s.r < 1 || s.s < 1 || s.groups < 1 || s.groups > 65535)
    return "empty shape";
  if (int64_t(s.r) * s.s * s.c > (int64_t(1) << 30)) return "filter too large";
  if (side) {
    const PoolShape& p = *side;
    if (p.n != s.n || p.out_h != s.out_h || p.out_w != s.out_w)
      return cat("side job over ", p.n, "x", p.out_h, "x", p.out_w, " pixels, conv output ", s.n, "x", s.out_h, "x", s.out_w);
    if (p.c % 2 || p.c < 2 || p.x_stride % 2 || p.y_stride % 2 || p.x_stride < p.c || p.y_stride < p.c || p.kh < 1 ||
        p.kw < 1 || p.stride_h < 1 || p.stride_w < 1)
      return cat("side job of ", p.c, " channels at pixel strides ", p.x_stride, "/", p.y_stride);
  }
  return "";
}

WindowLaunch window_conv_launch(const WindowConvShape& s) { return plan_launch(s, {}); }

void window_conv_nhwc(const void* x, const void* x_add, const void* w_krsc, const void* bias, void* y, DType dt,
                      const WindowConvShape& s, Activation act, cudaStream_t stream, const WindowSide& side,
                      WindowLaunch want) {
  const std::string why = window_conv_unsupported(dt, s, side.src ? &side.pool : nullptr);
  if (!why.empty()) fail_runtime("window_conv_nhwc: unsupported ", why);
  if (!aligned4(x) || !aligned4(w_krsc) || !aligned4(y) || (x_add && !aligned4(x_add)) ||
      (side.src && (!aligned4(side.src) || !aligned4(side.dst))))
    fail_runtime("window_conv_nhwc: pointers must be 4-byte aligned");
  if ((want.nt != 0 && want.nt != 1 && want.nt != 2 && want.nt != 4) || want.warps < 0 || want.warps > 16 ||
      (want.warps & (want.warps - 1)))
    fail_runtime("window_conv_nhwc: launch override nt ", want.nt, " warps ", want.warps);
  const WindowLaunch l = plan_launch(s, want);
  detail::dispatch_float(dt, "window_conv_nhwc", [&](auto tv) {
    using T = decltype(tv);
    if constexpr (!std::is_same_v<T, float>) {
      detail::dispatch_act(act, [&](auto a) {
        constexpr Activation A = decltype(a)::value;
        if (l.nt == 4) launch<T, A, 4>(x, x_add, w_krsc, bias, y, s, l, side, stream);
        else if (l.nt == 2) launch<T, A, 2>(x, x_add, w_krsc, bias, y, s, l, side, stream);
        else launch<T, A, 1>(x, x_add, w_krsc, bias, y, s, l, side, stream);
      });
    }
  });
}

}  // namespace kiln::cuda
