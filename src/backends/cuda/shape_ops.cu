// Kernels of the shape ops (shape_ops.cpp lowers transpose, reshape,
// upsample_nearest and gather to them): one strided copy that every
// relayout is an instance of, and gather by per-row indices. Both move
// elements unchanged (as 1/2/4/8-byte words), so one instance serves every
// dtype. Written for clarity: one thread per output element.
// TODO(speed): tiled shared-memory transposes and 16-byte vectors where the
// innermost stride is 1 (layout.cu's NHWC kernels show the pattern).
#include "backends/cuda/device_common.cuh"
#include "backends/cuda/kernels.hpp"

namespace kiln::cuda {
namespace {

template <typename W>
__global__ void strided_copy_kernel(const W* x, W* y, StridedCopy s, int64_t total) {
  dev::enter_grid();
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    int64_t rest = i, off = 0;
    for (int d = s.rank - 1; d >= 0; --d) {
      const int64_t e = s.shape[d];
      off += (rest % e) * s.x_strides[d];
      rest /= e;
    }
    y[i] = x[off];
  }
}

template <typename W, typename I>
__global__ void gather_kernel(const W* x, const I* index, W* y, int64_t extent, int64_t inner, int64_t k, int64_t total,
                              int64_t* flag) {
  dev::enter_grid();
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    const int64_t r = i % inner, row = i / inner;  // row = o * k + j
    const int64_t o = row / k;
    int64_t at = int64_t(index[row]);
    if (at < 0 || at >= extent) {
      if (r == 0 && atomicCAS(reinterpret_cast<unsigned long long*>(flag), 0ull, 1ull) == 0ull) {
        flag[1] = at;
        flag[2] = row;
      }
      at = 0;  // read inside x; the run fails once the flag is read
    }
    y[i] = x[(o * extent + at) * inner + r];
  }
}

template <typename F>
void dispatch_word(size_t bytes, const char* op, F&& f) {
  switch (bytes) {
    case 1: f(uint8_t{}); return;
    case 2: f(uint16_t{}); return;
    case 4: f(uint32_t{}); return;
    case 8: f(uint64_t{}); return;
    default: fail_runtime("cuda ", op, ": unsupported element size ", bytes);
  }
}

}  // namespace

void strided_copy(const void* x, void* y, size_t elem_bytes, const StridedCopy& s, cudaStream_t stream) {
  if (s.rank < 1 || s.rank > kMaxStridedRank) fail_runtime("cuda strided_copy: rank ", s.rank, " not in 1..", kMaxStridedRank);
  int64_t total = 1;
  for (int d = 0; d < s.rank; ++d) total *= s.shape[d];
  if (total <= 0) return;
  dispatch_word(elem_bytes, "strided_copy", [&](auto w) {
    using W = decltype(w);
    detail::launch("strided_copy", strided_copy_kernel<W>, detail::grid_for(total), detail::kThreads, 0, stream,
                   static_cast<const W*>(x), static_cast<W*>(y), s, total);
  });
}

void gather_rows(const void* x, const void* index, DType index_dt, void* y, size_t elem_bytes, int64_t outer,
                 int64_t extent, int64_t inner, int64_t k, int64_t* flag, cudaStream_t stream) {
  const int64_t total = outer * k * inner;
  if (total <= 0) return;
  if (extent <= 0) fail_runtime("cuda gather_rows: gather from an empty axis");
  dispatch_word(elem_bytes, "gather_rows", [&](auto w) {
    using W = decltype(w);
    auto go = [&](auto i) {
      using I = decltype(i);
      detail::launch("gather_rows", gather_kernel<W, I>, detail::grid_for(total), detail::kThreads, 0, stream,
                     static_cast<const W*>(x), static_cast<const I*>(index), static_cast<W*>(y), extent, inner, k, total,
                     flag);
    };
    if (index_dt == DType::I64) go(int64_t{});
    else if (index_dt == DType::I32) go(int32_t{});
    else fail_runtime("cuda gather_rows: index dtype ", dtype_name(index_dt), " (i64 or i32)");
  });
}

}  // namespace kiln::cuda
