// Depthwise convolution (groups == in == out channels), NHWC, with bias,
// residual and activation in the epilogue. cuDNN's NHWC depthwise engines run
// at about a third of memory bandwidth on the H200 and do not fuse SiLU for
// bf16 (tests/gpu/test_cuda_conv.cpp perf printout); this kernel is one
// coalesced pass: consecutive threads take consecutive channels of one output
// pixel, and the filter is stored tap-major ([kh*kw][c]) so its reads are
// coalesced too. It is a tactic candidate next to cuDNN's, chosen by timing.
#include "backends/cuda/device_common.cuh"
#include "backends/cuda/kernels.hpp"

namespace kiln::cuda {

namespace {

template <typename T, Activation A>
__global__ void depthwise_kernel(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ bias,
                                 const T* __restrict__ residual, T* __restrict__ y, DepthwiseShape s, int64_t total) {
  dev::enter_grid();
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int ch = int(i % s.c);
    int64_t rest = i / s.c;
    const int ox = int(rest % s.out_w);
    rest /= s.out_w;
    const int oy = int(rest % s.out_h);
    const int n = int(rest / s.out_h);
    float acc = 0.f;
    const int iy0 = oy * s.stride_h - s.pad_t, ix0 = ox * s.stride_w - s.pad_l;
    for (int ky = 0; ky < s.kh; ++ky) {
      const int iy = iy0 + ky * s.dil_h;
      if (iy < 0 || iy >= s.h) continue;
      for (int kx = 0; kx < s.kw; ++kx) {
        const int ix = ix0 + kx * s.dil_w;
        if (ix < 0 || ix >= s.w) continue;
        acc += dev::to_f32(x[((int64_t(n) * s.h + iy) * s.w + ix) * s.c + ch]) *
               dev::to_f32(w[int64_t(ky * s.kw + kx) * s.c + ch]);
      }
    }
    if (bias) acc += dev::to_f32(bias[ch]);
    if (residual) acc += dev::to_f32(residual[i]);
    y[i] = dev::from_f32<T>(dev::act<A, dev::kFastMath<T>>(acc));
  }
}

}  // namespace

std::vector<float> depthwise_weights_tap_major(const float* w, int c, int kh, int kw) {
  std::vector<float> out(size_t(c) * kh * kw);
  for (int ch = 0; ch < c; ++ch)
    for (int t = 0; t < kh * kw; ++t) out[size_t(t) * c + ch] = w[size_t(ch) * kh * kw + t];
  return out;
}

void depthwise_conv_nhwc(const void* x, const void* w_tap_major, const void* bias, const void* residual, void* y, DType dt,
                         const DepthwiseShape& s, Activation act, cudaStream_t stream) {
  const int64_t total = int64_t(s.n) * s.out_h * s.out_w * s.c;
  if (total <= 0) return;
  detail::dispatch_float(dt, "depthwise_conv_nhwc", [&](auto t) {
    using T = decltype(t);
    detail::dispatch_act(act, [&](auto a) {
      detail::launch("depthwise_conv_nhwc", depthwise_kernel<T, decltype(a)::value>, detail::grid_for(total),
                     detail::kThreads, 0, stream, static_cast<const T*>(x), static_cast<const T*>(w_tap_major),
                     static_cast<const T*>(bias), static_cast<const T*>(residual), static_cast<T*>(y), s, total);
    });
  });
}

}  // namespace kiln::cuda
