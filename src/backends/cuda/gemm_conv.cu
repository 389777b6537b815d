// The im2col copy of kiln's GEMM conv (gemm_conv.hpp): the conv's input
// gathered into the GEMM's A matrix in the step's workspace, for cuBLASLt.
#include <cstdint>

#include "backends/cuda/device_common.cuh"

namespace kiln::cuda {

namespace {

// One thread per vector V (4, 8 or 16 bytes, or one element) of cols, in
// cols' order: consecutive threads copy consecutive vectors of one input
// pixel's channels, then the next filter tap's pixel, so both sides stay
// coalesced. `vecs`: vectors per pixel. I: the unsigned index type (32 bits
// when cols has fewer than 2^31 vectors, so the grid stride cannot wrap: the
// divisions are the kernel's cost).
template <typename V, typename I>
__global__ void im2col_kernel(const V* __restrict__ x, V* __restrict__ cols, Im2colShape s, I vecs, I total) {
  dev::enter_grid();
  const I taps = I(s.r) * s.s;
  for (I i = I(blockIdx.x) * I(blockDim.x) + I(threadIdx.x); i < total; i += I(gridDim.x) * I(blockDim.x)) {
    const I v = i % vecs, pixel_tap = i / vecs;
    const int tap = int(pixel_tap % taps);
    const I m = pixel_tap / taps;  // output pixel
    const int ox = int(m % s.out_w);
    const I rest = m / s.out_w;
    const int oy = int(rest % s.out_h);
    const I b = rest / s.out_h;
    const int iy = oy * s.stride_h - s.pad_t + (tap / s.s) * s.dil_h;
    const int ix = ox * s.stride_w - s.pad_l + (tap % s.s) * s.dil_w;
    V val{};  // zero: the tap is in the padding
    if (iy >= 0 && iy < s.h && ix >= 0 && ix < s.w) val = x[((b * I(s.h) + I(iy)) * I(s.w) + I(ix)) * vecs + v];
    cols[i] = val;
  }
}

template <typename V>
void launch_im2col(const void* x, void* cols, const Im2colShape& s, int64_t pixel_bytes, cudaStream_t stream) {
  const int64_t vecs = pixel_bytes / int64_t(sizeof(V));
  const int64_t total = int64_t(s.n) * s.out_h * s.out_w * s.r * s.s * vecs;
  const int blocks = detail::grid_for(total);
  if (total < (int64_t(1) << 31))
    detail::launch("im2col_nhwc", im2col_kernel<V, uint32_t>, blocks, detail::kThreads, 0, stream, static_cast<const V*>(x),
                   static_cast<V*>(cols), s, uint32_t(vecs), uint32_t(total));
  else
    detail::launch("im2col_nhwc", im2col_kernel<V, uint64_t>, blocks, detail::kThreads, 0, stream, static_cast<const V*>(x),
                   static_cast<V*>(cols), s, uint64_t(vecs), uint64_t(total));
}

}  // namespace

void im2col_nhwc(const void* x, void* cols, DType dt, const Im2colShape& s, cudaStream_t stream) {
  const size_t es = dtype_size(dt);
  if (es != 2 && es != 4) fail_runtime("cuda im2col_nhwc: unsupported dtype ", dtype_name(dt));
  if (s.n < 1 || s.c < 1 || s.r < 1 || s.s < 1 || s.out_h < 1 || s.out_w < 1)
    fail_runtime("cuda im2col_nhwc: empty shape n=", s.n, " c=", s.c, " ", s.r, "x", s.s, " -> ", s.out_h, "x", s.out_w);
  // The widest copy that every pixel's channels and both base pointers allow.
  const int64_t pixel_bytes = int64_t(s.c) * int64_t(es);
  const auto fits = [&](int64_t vb) {
    return pixel_bytes % vb == 0 && (reinterpret_cast<uintptr_t>(x) | reinterpret_cast<uintptr_t>(cols)) % uintptr_t(vb) == 0;
  };
  if (fits(16)) return launch_im2col<uint4>(x, cols, s, pixel_bytes, stream);
  if (fits(8)) return launch_im2col<uint2>(x, cols, s, pixel_bytes, stream);
  if (fits(4)) return launch_im2col<uint32_t>(x, cols, s, pixel_bytes, stream);
  launch_im2col<uint16_t>(x, cols, s, pixel_bytes, stream);  // 16-bit elements, odd channel counts
}

}  // namespace kiln::cuda
