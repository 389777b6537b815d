// kiln's direct conv for convs with few input channels (an RGB stem: c <= 4),
// NHWC, y = act(conv(x, w) + bias + residual), a candidate of the conv
// selector next to cuDNN's engines (conv.cpp, always timed).
//
// Why our own: a stem conv has K = r * s * c = 27 (3x3 over RGB) or 147 (7x7):
// too short a K for an implicit GEMM on tensor cores, which cuDNN runs anyway
// (RT-DETR v2 r18vd's 3 -> 32 stride-2 conv at 640x640 took 9.3-9.9 us on the
// H100 in the traces of sessions 27 and 29, for 88 million FMAs: ~3 us of the
// GPU's f32 FMA rate).
//
// Layout of the work (session 30's form): a block's warps share one group of 8
// output channels (blockIdx.y), so every filter read from shared memory is the
// same address for the whole warp (one broadcast), and each thread computes
// those 8 channels for kPix output pixels (32 apart), so each filter value
// read feeds kPix * 8 FMAs. The group's filter share (f32, [tap][c][8]) is
// staged before the PDL wait (engine constants). Session 29's form (one pixel
// x 8 channels a thread, the channel groups interleaved across a warp's
// lanes) read 32 filter bytes from shared memory per 8 FMAs: ~350 MB of
// shared-memory reads for r18vd's stem, the bound of its 16.9 us against
// cuDNN's 12.2 (CudaDirectConvPerf.Stems, H100).
#include <type_traits>

#include "backends/cuda/device_common.cuh"
#include "backends/cuda/kernels.hpp"

namespace kiln::cuda {

namespace {

constexpr int kDirectWarps = 4;
constexpr int kDirectPix = 4;  // output pixels a thread computes
constexpr int kDirectBlockPix = 32 * kDirectWarps * kDirectPix;

// R > 0: an R x R filter known at compile time, so the tap loops unroll and
// the loads of a tap's pixels are issued together; R == 0: any filter.
// In = T: x is NHWC in the storage type. In = float: x is the engine's NCHW
// f32 input, each value rounded to T as it is loaded, so the conv computes
// what the NCHW -> NHWC cast step and the conv compute (the cast's launch
// is saved).
template <typename T, typename In, int C, int R, Activation A>
__global__ void __launch_bounds__(32 * kDirectWarps)
    direct_conv_kernel(const In* __restrict__ x, const T* __restrict__ w_krsc, const T* __restrict__ bias,
                       const T* __restrict__ residual, T* __restrict__ y, DirectConvShape s, int64_t pixels) {
  extern __shared__ float4 smem4[];
  float* sw = reinterpret_cast<float*>(smem4);  // [tap][c][8]: this block's 8 output channels
  const int taps = s.r * s.s, k = s.k, ch = int(blockIdx.y) * 8;
  for (int i = threadIdx.x; i < taps * C * 8; i += blockDim.x) {
    const int u = i % 8, tc = i / 8;  // tc = tap * C + channel: the KRSC filter's inner index
    sw[i] = dev::to_f32(w_krsc[int64_t(ch + u) * taps * C + tc]);
  }
  dev::enter_grid();
  __syncthreads();
  // Each pixel's image, top-left input corner, and whether it exists.
  constexpr bool kPlanar = std::is_same_v<In, float>;
  const int64_t plane = int64_t(s.h) * s.w;
  const In* img[kDirectPix];
  int iy0[kDirectPix], ix0[kDirectPix];
  int64_t px[kDirectPix];
#pragma unroll
  for (int p = 0; p < kDirectPix; ++p) {
    px[p] = int64_t(blockIdx.x) * kDirectBlockPix + (threadIdx.x / 32) * 32 * kDirectPix + p * 32 + threadIdx.x % 32;
    const int64_t q = px[p] < pixels ? px[p] : 0;
    const int ox = int(q % s.out_w);
    const int64_t rest = q / s.out_w;
    const int oy = int(rest % s.out_h), b = int(rest / s.out_h);
    img[p] = x + int64_t(b) * plane * C;
    iy0[p] = px[p] < pixels ? oy * s.stride_h - s.pad_t : -(1 << 29);  // a missing pixel reads nothing
    ix0[p] = ox * s.stride_w - s.pad_l;
  }
  float acc[kDirectPix][8] = {};
  const auto tap = [&](int i, int j) {
    float v[kDirectPix][C];
#pragma unroll
    for (int p = 0; p < kDirectPix; ++p) {
      const int iy = iy0[p] + i * s.dil_h, ix = ix0[p] + j * s.dil_w;
      const bool in = iy >= 0 && iy < s.h && ix >= 0 && ix < s.w;
      const int64_t at = in ? int64_t(iy) * s.w + ix : 0;
#pragma unroll
      for (int c = 0; c < C; ++c) {
        if constexpr (kPlanar) v[p][c] = in ? dev::to_f32(dev::from_f32<T>(img[p][c * plane + at])) : 0.f;
        else v[p][c] = in ? dev::to_f32(img[p][at * C + c]) : 0.f;
      }
    }
    const float* wr = sw + (i * s.s + j) * C * 8;
#pragma unroll
    for (int c = 0; c < C; ++c) {
      const float4 w0 = *reinterpret_cast<const float4*>(wr + c * 8);
      const float4 w1 = *reinterpret_cast<const float4*>(wr + c * 8 + 4);
#pragma unroll
      for (int p = 0; p < kDirectPix; ++p) {
        float* a = acc[p];
        const float e = v[p][c];
        a[0] = fmaf(e, w0.x, a[0]), a[1] = fmaf(e, w0.y, a[1]), a[2] = fmaf(e, w0.z, a[2]), a[3] = fmaf(e, w0.w, a[3]);
        a[4] = fmaf(e, w1.x, a[4]), a[5] = fmaf(e, w1.y, a[5]), a[6] = fmaf(e, w1.z, a[6]), a[7] = fmaf(e, w1.w, a[7]);
      }
    }
  };
  if constexpr (R > 0) {
#pragma unroll
    for (int i = 0; i < R; ++i)
#pragma unroll
      for (int j = 0; j < R; ++j) tap(i, j);
  } else {
    for (int i = 0; i < s.r; ++i)
      for (int j = 0; j < s.s; ++j) tap(i, j);
  }
  float bb[8] = {};
  if (bias) dev::load_vec<T, 8>(bias + ch, bb);
#pragma unroll
  for (int p = 0; p < kDirectPix; ++p) {
    if (px[p] >= pixels) continue;
    float* a = acc[p];
#pragma unroll
    for (int u = 0; u < 8; ++u) a[u] += bb[u];
    if (residual) {
      float rr[8];
      dev::load_vec<T, 8>(residual + px[p] * k + ch, rr);
#pragma unroll
      for (int u = 0; u < 8; ++u) a[u] += rr[u];
    }
#pragma unroll
    for (int u = 0; u < 8; ++u) a[u] = dev::act<A, dev::kFastMath<T>>(a[u]);
    dev::store_vec<T, 8>(y + px[p] * k + ch, acc[p]);
  }
}

// A block stages its 8 output channels' share of the filter.
size_t filter_bytes(const DirectConvShape& s) { return size_t(s.r) * s.s * s.c * 8 * sizeof(float); }

}  // namespace

std::string direct_conv_unsupported(DType dt, const DirectConvShape& s) {
  if (dt != DType::F16 && dt != DType::BF16) return cat("dtype ", dtype_name(dt), " (f16/bf16)");
  if (s.n <= 0 || s.h <= 0 || s.w <= 0 || s.c <= 0 || s.k <= 0 || s.r <= 0 || s.s <= 0 || s.out_h <= 0 || s.out_w <= 0)
    return "an empty shape";
  if (s.c > kMaxDirectConvChannels) return cat(s.c, " input channels (at most ", kMaxDirectConvChannels, ")");
  if (s.k % 8) return cat(s.k, " output channels (a multiple of 8)");
  if (s.k / 8 > 65535) return cat(s.k, " output channels (at most ", 8 * 65535, ")");
  if (s.stride_h < 1 || s.stride_w < 1 || s.dil_h < 1 || s.dil_w < 1) return "stride or dilation below 1";
  if (s.x_stride || s.y_stride) return "pixel strides (dense x and y only)";
  if (filter_bytes(s) > kMaxDirectConvFilterBytes)
    return cat("a filter share of ", filter_bytes(s), " bytes in f32 per 8 output channels (at most ", kMaxDirectConvFilterBytes,
               " in shared memory)");
  return "";
}

namespace {

template <typename In>
void launch_direct_conv(const char* what, const In* x, const void* w_krsc, const void* bias, const void* residual, void* y,
                        DType dt, const DirectConvShape& s, Activation act, cudaStream_t stream) {
  if (const std::string why = direct_conv_unsupported(dt, s); !why.empty()) fail_runtime("cuda ", what, ": ", why);
  if (!detail::aligned16(y) || (bias && !detail::aligned16(bias)) || (residual && !detail::aligned16(residual)))
    fail_runtime("cuda ", what, ": y, bias and residual must be 16-byte aligned");
  const int64_t pixels = int64_t(s.n) * s.out_h * s.out_w;
  if ((pixels + kDirectBlockPix - 1) / kDirectBlockPix > int64_t(0x7fffffff))
    fail_runtime("cuda ", what, ": ", pixels, " output pixels is too many");
  const dim3 grid(unsigned((pixels + kDirectBlockPix - 1) / kDirectBlockPix), unsigned(s.k / 8));
  detail::dispatch_float(dt, what, [&](auto t) {
    using T = decltype(t);
    if constexpr (sizeof(T) == 2) {
      using X = std::conditional_t<std::is_same_v<In, float>, float, T>;
      detail::dispatch_act(act, [&](auto a) {
        constexpr Activation A = decltype(a)::value;
        const auto go = [&](auto kernel) {
          detail::launch(what, kernel, grid, 32 * kDirectWarps, filter_bytes(s), stream, reinterpret_cast<const X*>(x),
                         static_cast<const T*>(w_krsc), static_cast<const T*>(bias), static_cast<const T*>(residual),
                         static_cast<T*>(y), s, pixels);
        };
        // RGB stems (3 channels, 3x3 or 7x7) unrolled; other shapes take the runtime-bounded loops.
        const int r = s.r == s.s ? s.r : 0;
        if (s.c == 3 && r == 3) go(direct_conv_kernel<T, X, 3, 3, A>);
        else if (s.c == 3 && r == 7) go(direct_conv_kernel<T, X, 3, 7, A>);
        else if (s.c == 1) go(direct_conv_kernel<T, X, 1, 0, A>);
        else if (s.c == 2) go(direct_conv_kernel<T, X, 2, 0, A>);
        else if (s.c == 3) go(direct_conv_kernel<T, X, 3, 0, A>);
        else go(direct_conv_kernel<T, X, 4, 0, A>);
      });
    }
  });
}

}  // namespace

void direct_conv_nhwc(const void* x, const void* w_krsc, const void* bias, const void* residual, void* y, DType dt,
                      const DirectConvShape& s, Activation act, cudaStream_t stream) {
  launch_direct_conv("direct_conv_nhwc", static_cast<const char*>(x), w_krsc, bias, residual, y, dt, s, act, stream);
}

void direct_conv_nchw_f32(const float* x, const void* w_krsc, const void* bias, const void* residual, void* y, DType dt,
                          const DirectConvShape& s, Activation act, cudaStream_t stream) {
  launch_direct_conv("direct_conv_nchw_f32", x, w_krsc, bias, residual, y, dt, s, act, stream);
}

}  // namespace kiln::cuda
