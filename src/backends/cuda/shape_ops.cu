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

// I: the index type (int32_t where every element and offset fits, the
// common case: 64-bit division is several times slower).
template <typename W, typename I>
__global__ void strided_copy_kernel(const W* x, W* y, StridedCopy s, I total) {
  dev::enter_grid();
  const I stride = I(gridDim.x) * blockDim.x;
  for (I i = I(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    I rest = i, off = 0;
    for (int d = s.rank - 1; d >= 0; --d) {
      const I e = I(s.shape[d]);
      off += (rest % e) * I(s.x_strides[d]);
      rest /= e;
    }
    y[i] = x[off];
  }
}

template <typename W, typename I>
__global__ void gather_kernel(const W* x, const I* index, W* y, int64_t extent, int64_t inner, int64_t k, int64_t total,
                              bool shared_x, int64_t* flag) {
  dev::enter_grid();
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    const int64_t r = i % inner, row = i / inner;  // row = o * k + j
    const int64_t o = shared_x ? 0 : row / k;
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

// Before the launch the copy is simplified, moving the same bytes: extent-1
// axes dropped, axes that x reads contiguously merged, and where x's
// innermost axis is contiguous, runs of up to 16 bytes moved as one word (an
// NHWC upsample or channel relayout moves 8 halves per thread, not one).
StridedCopy simplify_strided_copy(const StridedCopy& s, size_t& word_bytes, uintptr_t x_addr, uintptr_t y_addr) {
  StridedCopy r;
  for (int d = 0; d < s.rank; ++d) {
    if (s.shape[d] == 1) continue;
    if (r.rank > 0 && r.x_strides[r.rank - 1] == s.x_strides[d] * s.shape[d]) {
      r.shape[r.rank - 1] *= s.shape[d];
      r.x_strides[r.rank - 1] = s.x_strides[d];
      continue;
    }
    r.shape[r.rank] = s.shape[d];
    r.x_strides[r.rank] = s.x_strides[d];
    ++r.rank;
  }
  if (r.rank == 0) r.rank = 1, r.shape[0] = 1, r.x_strides[0] = 1;
  const int last = r.rank - 1;
  if (r.x_strides[last] != 1) return r;
  int64_t v = 1;
  for (int64_t cand = int64_t(16 / word_bytes); cand > 1; cand /= 2) {
    const uint64_t align = uint64_t(cand) * word_bytes;
    bool ok = r.shape[last] % cand == 0 && x_addr % align == 0 && y_addr % align == 0;
    for (int d = 0; d < last && ok; ++d) ok = r.x_strides[d] % cand == 0;
    if (ok) { v = cand; break; }
  }
  if (v == 1) return r;
  r.shape[last] /= v;
  for (int d = 0; d < last; ++d) r.x_strides[d] /= v;
  word_bytes *= size_t(v);
  return r;
}

void strided_copy(const void* x, void* y, size_t elem_bytes, const StridedCopy& s, cudaStream_t stream) {
  if (s.rank < 1 || s.rank > kMaxStridedRank) fail_runtime("cuda strided_copy: rank ", s.rank, " not in 1..", kMaxStridedRank);
  int64_t total = 1;
  for (int d = 0; d < s.rank; ++d) total *= s.shape[d];
  if (total <= 0) return;
  size_t word = elem_bytes;
  const StridedCopy c = simplify_strided_copy(s, word, reinterpret_cast<uintptr_t>(x), reinterpret_cast<uintptr_t>(y));
  int64_t words = 1, reach = 0;
  for (int d = 0; d < c.rank; ++d) words *= c.shape[d], reach += (c.shape[d] - 1) * (c.x_strides[d] < 0 ? -c.x_strides[d] : c.x_strides[d]);
  const bool narrow = words < INT32_MAX && reach < INT32_MAX;
  auto go = [&](auto w) {
    using W = decltype(w);
    if (narrow)
      detail::launch("strided_copy", strided_copy_kernel<W, int32_t>, detail::grid_for(words), detail::kThreads, 0,
                     stream, static_cast<const W*>(x), static_cast<W*>(y), c, int32_t(words));
    else
      detail::launch("strided_copy", strided_copy_kernel<W, int64_t>, detail::grid_for(words), detail::kThreads, 0,
                     stream, static_cast<const W*>(x), static_cast<W*>(y), c, words);
  };
  if (word == 16) return go(uint4{});
  dispatch_word(word, "strided_copy", go);
}

void gather_rows(const void* x, const void* index, DType index_dt, void* y, size_t elem_bytes, int64_t outer,
                 int64_t extent, int64_t inner, int64_t k, bool shared_x, int64_t* flag, cudaStream_t stream) {
  const int64_t total = outer * k * inner;
  if (total <= 0) return;
  if (extent <= 0) fail_runtime("cuda gather_rows: gather from an empty axis");
  dispatch_word(elem_bytes, "gather_rows", [&](auto w) {
    using W = decltype(w);
    auto go = [&](auto i) {
      using I = decltype(i);
      detail::launch("gather_rows", gather_kernel<W, I>, detail::grid_for(total), detail::kThreads, 0, stream,
                     static_cast<const W*>(x), static_cast<const I*>(index), static_cast<W*>(y), extent, inner, k, total,
                     shared_x, flag);
    };
    if (index_dt == DType::I64) go(int64_t{});
    else if (index_dt == DType::I32) go(int32_t{});
    else fail_runtime("cuda gather_rows: index dtype ", dtype_name(index_dt), " (i64 or i32)");
  });
}

}  // namespace kiln::cuda
