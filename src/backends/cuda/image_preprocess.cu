// GPU executor of a PreprocessPlan (image_preprocess.hpp). Our own kernels:
// NPP and nvImageProcessing resize with their own filters and rounding, not
// PIL's fixed-point tables, so none of them can give timm's exact pixels.
#include <algorithm>
#include <cstring>
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

// Calls f(data, bytes) for each table of `plan` in the fixed order the
// kernels read them: nearest indices, each pass's first/count/weights, the
// float table. write_tables and run walk the same order.
template <typename F>
void for_each_table(const PreprocessPlan& plan, F f) {
  const ResizePlan& r = plan.resize;
  auto vec = [&](const auto& v) { f(static_cast<const void*>(v.data()), v.size() * sizeof(v[0])); };
  if (r.nearest) vec(r.nearest_x), vec(r.nearest_y);
  for (const ResamplePass& p : r.passes) vec(p.first), vec(p.count), vec(p.weights);
  static_assert(sizeof(plan.lut) == 3 * 256 * sizeof(float), "the float table is 3 x 256 contiguous floats");
  f(static_cast<const void*>(plan.lut[0].data()), sizeof(plan.lut));
}

constexpr size_t kTableAlign = 16;
size_t align_table(size_t n) { return (n + kTableAlign - 1) / kTableAlign * kTableAlign; }

}  // namespace

size_t GpuPreprocessor::table_bytes(const PreprocessPlan& plan) {
  size_t n = 0;
  for_each_table(plan, [&](const void*, size_t bytes) { n += align_table(bytes); });
  return n;
}

void GpuPreprocessor::write_tables(const PreprocessPlan& plan, void* host) {
  char* at = static_cast<char*>(host);
  for_each_table(plan, [&](const void* data, size_t bytes) {
    if (bytes) std::memcpy(at, data, bytes);
    at += align_table(bytes);
  });
}

// Grow-only device buffers reused call after call, in the order a call asks
// for them: the intermediate images (and, when the caller staged no tables,
// one buffer for them). A cudaMalloc/cudaFree for each table and image of
// each call (the first form) cost most of the pre-processing time and
// synchronized per image; one upload per table (the second) cost a host API
// call each. Reuse needs no synchronisation: the next call's uploads and
// kernels are queued on the same stream after the last call's readers; only
// growing a buffer (freeing one a queued kernel may read) or a change of
// stream waits for the previous call's work.
struct GpuPreprocessor::Impl {
  std::vector<DeviceBuffer> slots;
  size_t used = 0;
  cudaStream_t last = nullptr;
  bool any_call = false;
  std::vector<char> host_tables;  // the unstaged path's tables before their upload

  void begin(const std::vector<size_t>& sizes, cudaStream_t s) {
    bool grow = sizes.size() > slots.size();
    for (size_t i = 0; i < sizes.size() && !grow; ++i) grow = slots[i].size() < sizes[i];
    if (any_call && (grow || s != last)) KILN_CUDA_CHECK(cudaStreamSynchronize(last));
    if (slots.size() < sizes.size()) slots.resize(sizes.size());
    for (size_t i = 0; i < sizes.size(); ++i)
      if (slots[i].size() < sizes[i]) slots[i] = DeviceBuffer(std::max<size_t>(sizes[i], 1));
    used = 0, last = s, any_call = true;
  }
  void* take() { return slots.at(used++).get(); }
};

GpuPreprocessor::GpuPreprocessor() : impl_(new Impl) {}
GpuPreprocessor::~GpuPreprocessor() {
  cudaDeviceSynchronize();  // the last call's kernels may still read the buffers
  delete impl_;
}

void GpuPreprocessor::run(const PreprocessPlan& plan, const uint8_t* rgb, float* chw, void* stream, const void* tables) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const ResizePlan& r = plan.resize;
  if (r.in_w < 1 || r.in_h < 1 || plan.out_w < 1 || plan.out_h < 1) fail_input("GPU pre-processing: empty plan");
  // The buffers this call takes, in order (Impl::take): the tables when not staged, then each stage's image.
  std::vector<size_t> sizes;
  if (!tables) sizes.push_back(table_bytes(plan));
  int cur_w = r.in_w, cur_h = r.in_h;
  if (r.nearest) {
    sizes.push_back(static_cast<size_t>(r.out_w) * r.out_h * 3);
    cur_w = r.out_w, cur_h = r.out_h;
  }
  for (const ResamplePass& p : r.passes) {
    if (p.in_w != cur_w || p.in_h != cur_h) fail_input("GPU pre-processing: a resampling pass does not fit its input");
    sizes.push_back(static_cast<size_t>(p.out_w) * p.out_h * 3);
    cur_w = p.out_w, cur_h = p.out_h;
  }
  impl_->begin(sizes, s);
  if (!tables) {
    impl_->host_tables.resize(sizes[0]);
    write_tables(plan, impl_->host_tables.data());
    void* dev = impl_->take();
    // From pageable memory: staged before cudaMemcpyAsync returns, so host_tables may change.
    KILN_CUDA_CHECK(cudaMemcpyAsync(dev, impl_->host_tables.data(), sizes[0], cudaMemcpyHostToDevice, s));
    tables = dev;
  }
  // The device address of each table, in for_each_table's order.
  std::vector<const char*> table;
  const char* at = static_cast<const char*>(tables);
  for_each_table(plan, [&](const void*, size_t bytes) { table.push_back(at), at += align_table(bytes); });
  size_t ti = 0;
  auto next_table = [&] { return table.at(ti++); };
  constexpr int kBlock = 128;
  const uint8_t* cur = rgb;
  cur_w = r.in_w, cur_h = r.in_h;
  if (r.nearest) {
    const int* nx = reinterpret_cast<const int*>(next_table());
    const int* ny = reinterpret_cast<const int*>(next_table());
    auto* out = static_cast<uint8_t*>(impl_->take());
    nearest_kernel<<<grid_for(r.out_w, r.out_h, kBlock), kBlock, 0, s>>>(cur, cur_w, out, r.out_w, r.out_h, nx, ny);
    KILN_CUDA_CHECK(cudaGetLastError());
    cur = out, cur_w = r.out_w, cur_h = r.out_h;
  }
  for (const ResamplePass& p : r.passes) {
    const int* first = reinterpret_cast<const int*>(next_table());
    const int* count = reinterpret_cast<const int*>(next_table());
    const int32_t* w = reinterpret_cast<const int32_t*>(next_table());
    auto* out = static_cast<uint8_t*>(impl_->take());
    if (p.horizontal)
      horizontal_kernel<<<grid_for(p.out_w, p.out_h, kBlock), kBlock, 0, s>>>(cur, cur_w, out, p.out_w, p.out_h,
                                                                              p.row_offset, p.ksize, first, count, w);
    else
      vertical_kernel<<<grid_for(p.out_w * 3, p.out_h, kBlock), kBlock, 0, s>>>(cur, p.out_w, out, p.out_h,
                                                                                p.row_offset, p.ksize, first, count, w);
    KILN_CUDA_CHECK(cudaGetLastError());
    cur = out, cur_w = p.out_w, cur_h = p.out_h;
  }
  const float* lut_d = reinterpret_cast<const float*>(next_table());
  const uchar3 fill{plan.fill[0], plan.fill[1], plan.fill[2]};
  crop_lut_kernel<<<grid_for(plan.out_w, plan.out_h, kBlock), kBlock, 0, s>>>(cur, cur_w, cur_h, chw, plan.out_w, plan.out_h,
                                                                              plan.dx, plan.dy, fill, lut_d);
  KILN_CUDA_CHECK(cudaGetLastError());
}

}  // namespace kiln::cuda
