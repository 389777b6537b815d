// GPU executor of a PreprocessPlan (image_preprocess.hpp). Our own kernels:
// NPP and nvImageProcessing resize with their own filters and rounding, not
// PIL's fixed-point tables, so none of them can give timm's exact pixels.
#include <cuda_runtime.h>

#include <vector>

#include "backends/cuda/cuda_check.hpp"
#include "backends/cuda/device_buffer.hpp"
#include "backends/cuda/image_preprocess.hpp"
#include "core/error.hpp"

namespace kiln::cuda {
namespace {

constexpr int kFrac = kResampleFractionBits;

__device__ __forceinline__ uint8_t clip8(int32_t acc) {
  const int32_t v = acc >> kFrac;
  return static_cast<uint8_t>(v < 0 ? 0 : (v > 255 ? 255 : v));
}

// One thread per output pixel; channels summed in PIL's tap order.
__global__ void horizontal_kernel(const uint8_t* __restrict__ in, int in_w, uint8_t* __restrict__ out, int out_w,
                                  int out_h, int row_offset, int ksize, const int* __restrict__ first,
                                  const int* __restrict__ count, const int32_t* __restrict__ w) {
  const int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y;
  if (x >= out_w || y >= out_h) return;
  const uint8_t* p = in + (static_cast<size_t>(y + row_offset) * in_w + first[x]) * 3;
  const int32_t* k = w + static_cast<size_t>(x) * ksize;
  int32_t s0 = 1 << (kFrac - 1), s1 = s0, s2 = s0;
  for (int t = 0; t < count[x]; ++t, p += 3) {
    s0 += p[0] * k[t];
    s1 += p[1] * k[t];
    s2 += p[2] * k[t];
  }
  uint8_t* d = out + (static_cast<size_t>(y) * out_w + x) * 3;
  d[0] = clip8(s0), d[1] = clip8(s1), d[2] = clip8(s2);
}

// One thread per output byte (pixel x channel) of row y.
__global__ void vertical_kernel(const uint8_t* __restrict__ in, int width, uint8_t* __restrict__ out, int out_h,
                                int row_offset, int ksize, const int* __restrict__ first, const int* __restrict__ count,
                                const int32_t* __restrict__ w) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y;
  const int stride = width * 3;
  if (i >= stride || y >= out_h) return;
  const uint8_t* p = in + static_cast<size_t>(first[y] - row_offset) * stride + i;
  const int32_t* k = w + static_cast<size_t>(y) * ksize;
  int32_t s = 1 << (kFrac - 1);
  for (int t = 0; t < count[y]; ++t, p += stride) s += p[0] * k[t];
  out[static_cast<size_t>(y) * stride + i] = clip8(s);
}

__global__ void nearest_kernel(const uint8_t* __restrict__ in, int in_w, uint8_t* __restrict__ out, int out_w,
                               int out_h, const int* __restrict__ xs, const int* __restrict__ ys) {
  const int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y;
  if (x >= out_w || y >= out_h) return;
  uint8_t* d = out + (static_cast<size_t>(y) * out_w + x) * 3;
  if (xs[x] < 0 || ys[y] < 0) {
    d[0] = d[1] = d[2] = 0;
    return;
  }
  const uint8_t* s = in + (static_cast<size_t>(ys[y]) * in_w + xs[x]) * 3;
  d[0] = s[0], d[1] = s[1], d[2] = s[2];
}

// Crop (or pad with fill) and the float table: one thread per output pixel.
__global__ void crop_lut_kernel(const uint8_t* __restrict__ img, int w, int h, float* __restrict__ chw, int out_w,
                                int out_h, int dx, int dy, uchar3 fill, const float* __restrict__ lut) {
  const int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y;
  if (x >= out_w || y >= out_h) return;
  const int sx = x + dx, sy = y + dy;
  uint8_t v[3] = {fill.x, fill.y, fill.z};
  if (sx >= 0 && sx < w && sy >= 0 && sy < h) {
    const uint8_t* s = img + (static_cast<size_t>(sy) * w + sx) * 3;
    v[0] = s[0], v[1] = s[1], v[2] = s[2];
  }
  const size_t plane = static_cast<size_t>(out_w) * out_h, at = static_cast<size_t>(y) * out_w + x;
  for (int c = 0; c < 3; ++c) chw[plane * c + at] = lut[c * 256 + v[c]];
}

dim3 grid_for(int width, int rows, int block) { return dim3((width + block - 1) / block, rows); }

template <typename T>
DeviceBuffer upload(const std::vector<T>& v, cudaStream_t s) {
  DeviceBuffer b(v.size() * sizeof(T));
  if (!v.empty()) KILN_CUDA_CHECK(cudaMemcpyAsync(b.get(), v.data(), b.size(), cudaMemcpyHostToDevice, s));
  return b;
}

}  // namespace

struct GpuPreprocessor::Impl {
  // Kept until the next call: the kernels of the last call may still read them.
  std::vector<DeviceBuffer> keep;
};

GpuPreprocessor::GpuPreprocessor() : impl_(new Impl) {}
GpuPreprocessor::~GpuPreprocessor() {
  cudaDeviceSynchronize();  // the last call's kernels may still read the buffers
  delete impl_;
}

void GpuPreprocessor::run(const PreprocessPlan& plan, const uint8_t* rgb, float* chw, void* stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const ResizePlan& r = plan.resize;
  if (r.in_w < 1 || r.in_h < 1 || plan.out_w < 1 || plan.out_h < 1) fail_input("GPU pre-processing: empty plan");
  KILN_CUDA_CHECK(cudaStreamSynchronize(s));  // the previous call's buffers are about to be freed
  std::vector<DeviceBuffer> keep;
  constexpr int kBlock = 128;
  const uint8_t* cur = rgb;
  int cur_w = r.in_w, cur_h = r.in_h;
  if (r.nearest) {
    keep.push_back(upload(r.nearest_x, s));
    keep.push_back(upload(r.nearest_y, s));
    keep.emplace_back(static_cast<size_t>(r.out_w) * r.out_h * 3);
    auto* out = static_cast<uint8_t*>(keep.back().get());
    nearest_kernel<<<grid_for(r.out_w, r.out_h, kBlock), kBlock, 0, s>>>(
        cur, cur_w, out, r.out_w, r.out_h, static_cast<const int*>(keep[keep.size() - 3].get()),
        static_cast<const int*>(keep[keep.size() - 2].get()));
    KILN_CUDA_CHECK(cudaGetLastError());
    cur = out, cur_w = r.out_w, cur_h = r.out_h;
  }
  for (const ResamplePass& p : r.passes) {
    if (p.in_w != cur_w || p.in_h != cur_h) fail_input("GPU pre-processing: a resampling pass does not fit its input");
    keep.push_back(upload(p.first, s));
    const int* first = static_cast<const int*>(keep.back().get());
    keep.push_back(upload(p.count, s));
    const int* count = static_cast<const int*>(keep.back().get());
    keep.push_back(upload(p.weights, s));
    const int32_t* w = static_cast<const int32_t*>(keep.back().get());
    keep.emplace_back(static_cast<size_t>(p.out_w) * p.out_h * 3);
    auto* out = static_cast<uint8_t*>(keep.back().get());
    if (p.horizontal)
      horizontal_kernel<<<grid_for(p.out_w, p.out_h, kBlock), kBlock, 0, s>>>(cur, cur_w, out, p.out_w, p.out_h,
                                                                              p.row_offset, p.ksize, first, count, w);
    else
      vertical_kernel<<<grid_for(p.out_w * 3, p.out_h, kBlock), kBlock, 0, s>>>(cur, p.out_w, out, p.out_h,
                                                                                p.row_offset, p.ksize, first, count, w);
    KILN_CUDA_CHECK(cudaGetLastError());
    cur = out, cur_w = p.out_w, cur_h = p.out_h;
  }
  std::vector<float> lut(3 * 256);
  for (int c = 0; c < 3; ++c)
    for (int v = 0; v < 256; ++v) lut[c * 256 + v] = plan.lut[c][v];
  keep.push_back(upload(lut, s));
  const uchar3 fill{plan.fill[0], plan.fill[1], plan.fill[2]};
  crop_lut_kernel<<<grid_for(plan.out_w, plan.out_h, kBlock), kBlock, 0, s>>>(
      cur, cur_w, cur_h, chw, plan.out_w, plan.out_h, plan.dx, plan.dy, fill, static_cast<const float*>(keep.back().get()));
  KILN_CUDA_CHECK(cudaGetLastError());
  // Host vectors above are uploaded asynchronously from pageable memory, which
  // cudaMemcpyAsync copies before it returns; the device buffers stay alive here.
  impl_->keep = std::move(keep);
}

}  // namespace kiln::cuda
