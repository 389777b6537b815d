// kiln's direct conv for convs with few input channels (an RGB stem: c <= 4),
// NHWC, y = act(conv(x, w) + bias + residual), a candidate of the conv
// selector next to cuDNN's engines (conv.cpp, always timed).
//
// Why our own: a stem conv has K = r * s * c = 27 (3x3 over RGB) or 147 (7x7):
// too short a K for an implicit GEMM on tensor cores, which cuDNN runs anyway
// (RT-DETR v2 r18vd's 3 -> 32 stride-2 conv at 640x640 took 9.9 us on the H100
// in session 27's trace, bench/results/2026-12-06-session27/call4, for 88
// million FMAs: ~3 us of the GPU's f32 FMA rate). Here one thread owns one
// output pixel and 8 output channels: the filter (f32, [tap][c][k]) is staged
// in shared memory before the PDL wait (engine constants), each input value is
// loaded once per thread and multiplied into 8 accumulators with one 32-byte
// shared read, and the epilogue (bias, residual, activation) ends in one
// 16-byte store.
#include "backends/cuda/device_common.cuh"
#include "backends/cuda/kernels.hpp"

namespace kiln::cuda {

namespace {

// R > 0: an R x R filter known at compile time, so the tap loops unroll and
// every in-bounds input load is issued before the first product (a runtime
// loop keeps one tap's loads in flight: session 29's first form took 16.9 us
// on r18vd's stem against cuDNN's 12.2, latency-bound). R == 0: any filter.
template <typename T, int C, int R, Activation A>
__global__ void direct_conv_kernel(const T* __restrict__ x, const T* __restrict__ w_krsc, const T* __restrict__ bias,
                                   const T* __restrict__ residual, T* __restrict__ y, DirectConvShape s, int64_t total) {
  extern __shared__ float4 smem4[];
  float* sw = reinterpret_cast<float*>(smem4);  // [tap][c][k]
  const int taps = s.r * s.s, k = s.k;
  for (int i = threadIdx.x; i < taps * C * k; i += blockDim.x) {
    const int o = i % k, tc = i / k;  // tc = tap * C + channel: the KRSC filter's inner index
    sw[i] = dev::to_f32(w_krsc[int64_t(o) * taps * C + tc]);
  }
  dev::enter_grid();
  __syncthreads();
  const int groups = k / 8;
  for (int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; t < total; t += int64_t(gridDim.x) * blockDim.x) {
    const int g = int(t % groups);
    const int64_t px = t / groups;
    const int ox = int(px % s.out_w);
    const int64_t rest = px / s.out_w;
    const int oy = int(rest % s.out_h), b = int(rest / s.out_h);
    float acc[8] = {};
    const T* img = x + int64_t(b) * s.h * s.w * C;
    const int iy0 = oy * s.stride_h - s.pad_t, ix0 = ox * s.stride_w - s.pad_l;
    const auto tap = [&](int i, int j) {
      const int iy = iy0 + i * s.dil_h, ix = ix0 + j * s.dil_w;
      if (iy < 0 || iy >= s.h || ix < 0 || ix >= s.w) return;
      const T* p = img + (int64_t(iy) * s.w + ix) * C;
      const float* wr = sw + (i * s.s + j) * C * k + g * 8;
#pragma unroll
      for (int c = 0; c < C; ++c) {
        const float v = dev::to_f32(p[c]);
        const float4 w0 = *reinterpret_cast<const float4*>(wr + c * k);
        const float4 w1 = *reinterpret_cast<const float4*>(wr + c * k + 4);
        acc[0] = fmaf(v, w0.x, acc[0]), acc[1] = fmaf(v, w0.y, acc[1]), acc[2] = fmaf(v, w0.z, acc[2]);
        acc[3] = fmaf(v, w0.w, acc[3]), acc[4] = fmaf(v, w1.x, acc[4]), acc[5] = fmaf(v, w1.y, acc[5]);
        acc[6] = fmaf(v, w1.z, acc[6]), acc[7] = fmaf(v, w1.w, acc[7]);
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
    const int ch = g * 8;
    if (bias) {
      float bb[8];
      dev::load_vec<T, 8>(bias + ch, bb);
#pragma unroll
      for (int u = 0; u < 8; ++u) acc[u] += bb[u];
    }
    if (residual) {
      float rr[8];
      dev::load_vec<T, 8>(residual + px * k + ch, rr);
#pragma unroll
      for (int u = 0; u < 8; ++u) acc[u] += rr[u];
    }
#pragma unroll
    for (int u = 0; u < 8; ++u) acc[u] = dev::act<A, dev::kFastMath<T>>(acc[u]);
    dev::store_vec<T, 8>(y + px * k + ch, acc);
  }
}

size_t filter_bytes(const DirectConvShape& s) { return size_t(s.r) * s.s * s.c * s.k * sizeof(float); }

}  // namespace

std::string direct_conv_unsupported(DType dt, const DirectConvShape& s) {
  if (dt != DType::F16 && dt != DType::BF16) return cat("dtype ", dtype_name(dt), " (f16/bf16)");
  if (s.n <= 0 || s.h <= 0 || s.w <= 0 || s.c <= 0 || s.k <= 0 || s.r <= 0 || s.s <= 0 || s.out_h <= 0 || s.out_w <= 0)
    return "an empty shape";
  if (s.c > kMaxDirectConvChannels) return cat(s.c, " input channels (at most ", kMaxDirectConvChannels, ")");
  if (s.k % 8) return cat(s.k, " output channels (a multiple of 8)");
  if (s.stride_h < 1 || s.stride_w < 1 || s.dil_h < 1 || s.dil_w < 1) return "stride or dilation below 1";
  if (filter_bytes(s) > kMaxDirectConvFilterBytes)
    return cat("a filter of ", filter_bytes(s), " bytes in f32 (at most ", kMaxDirectConvFilterBytes, " in shared memory)");
  return "";
}

void direct_conv_nhwc(const void* x, const void* w_krsc, const void* bias, const void* residual, void* y, DType dt,
                      const DirectConvShape& s, Activation act, cudaStream_t stream) {
  if (const std::string why = direct_conv_unsupported(dt, s); !why.empty()) fail_runtime("cuda direct_conv_nhwc: ", why);
  if (!detail::aligned16(y) || (bias && !detail::aligned16(bias)) || (residual && !detail::aligned16(residual)))
    fail_runtime("cuda direct_conv_nhwc: y, bias and residual must be 16-byte aligned");
  const int64_t total = int64_t(s.n) * s.out_h * s.out_w * (s.k / 8);
  detail::dispatch_float(dt, "direct_conv_nhwc", [&](auto t) {
    using T = decltype(t);
    if constexpr (sizeof(T) == 2) {
      detail::dispatch_act(act, [&](auto a) {
        constexpr Activation A = decltype(a)::value;
        const auto go = [&](auto kernel) {
          detail::launch("direct_conv_nhwc", kernel, detail::grid_for(total), detail::kThreads, filter_bytes(s), stream,
                         static_cast<const T*>(x), static_cast<const T*>(w_krsc), static_cast<const T*>(bias),
                         static_cast<const T*>(residual), static_cast<T*>(y), s, total);
        };
        // RGB stems (3 channels, 3x3 or 7x7) unrolled; other shapes take the runtime-bounded loops.
        const int r = s.r == s.s ? s.r : 0;
        if (s.c == 3 && r == 3) go(direct_conv_kernel<T, 3, 3, A>);
        else if (s.c == 3 && r == 7) go(direct_conv_kernel<T, 3, 7, A>);
        else if (s.c == 1) go(direct_conv_kernel<T, 1, 0, A>);
        else if (s.c == 2) go(direct_conv_kernel<T, 2, 0, A>);
        else if (s.c == 3) go(direct_conv_kernel<T, 3, 0, A>);
        else go(direct_conv_kernel<T, 4, 0, A>);
      });
    }
  });
}

}  // namespace kiln::cuda
