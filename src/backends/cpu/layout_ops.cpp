// Ops that move values for the CPU backend: transpose (any rank), nearest
// upsampling by integer factors, gather along an axis. Rows of the output run
// in parallel; the innermost copies are contiguous wherever the layout allows.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "backends/cpu/kernels.hpp"
#include "core/error.hpp"

namespace kiln::cpu {

namespace {

// A transpose with extent-1 axes dropped and output axes that stay adjacent
// in the input merged: [B, C, H, W] -> [B, H, W, C] becomes [B, C, HW] ->
// [B, HW, C]. Same bytes moved, fewer and longer loops.
struct Collapsed {
  std::vector<int64_t> out_extent;  // per output axis
  std::vector<int64_t> in_stride;   // per output axis: the input stride of that axis
};

Collapsed collapse(const std::vector<int64_t>& shape, const std::vector<int64_t>& perm) {
  const size_t rank = shape.size();
  std::vector<int64_t> stride(rank, 1);
  for (size_t d = rank; d-- > 1;) stride[d - 1] = stride[d] * shape[d];
  Collapsed c;
  for (size_t d = 0; d < rank; ++d) {
    const int64_t extent = shape[perm[d]], s = stride[perm[d]];
    if (extent == 1) continue;
    // Mergeable with the previous output axis when it sits just outside this one in the input.
    if (!c.out_extent.empty() && c.in_stride.back() == s * extent) {
      c.out_extent.back() *= extent;
      c.in_stride.back() = s;
      continue;
    }
    c.out_extent.push_back(extent);
    c.in_stride.push_back(s);
  }
  if (c.out_extent.empty()) c.out_extent = {1}, c.in_stride = {1};
  return c;
}

}  // namespace

void transpose(const std::vector<int64_t>& shape, const std::vector<int64_t>& perm, const float* x, float* y,
               ThreadPool& pool) {
  if (perm.size() != shape.size()) fail_runtime("transpose: perm of ", perm.size(), " axes for rank ", shape.size());
  int64_t count = 1;
  for (int64_t e : shape) count *= e;
  if (count == 0) return;
  const Collapsed c = collapse(shape, perm);
  const size_t rank = c.out_extent.size();
  const int64_t len = c.out_extent.back(), step = c.in_stride.back();
  // The input offset of the output element whose index along the output axes
  // before `end` is `flat` (row-major over those axes); fills `at` with it.
  auto offset_of = [&](int64_t flat, size_t end, std::vector<int64_t>& at) {
    int64_t from = 0;
    for (int64_t d = static_cast<int64_t>(end) - 1; d >= 0; --d) {
      at[d] = flat % c.out_extent[d];
      flat /= c.out_extent[d];
      from += at[d] * c.in_stride[d];
    }
    return from;
  };
  if (rank >= 2 && c.in_stride[rank - 2] == 1 && step == c.out_extent[rank - 2]) {
    // The last two output axes are an [L, Q] input block read transposed
    // (NCHW -> NHWC is [C, HW] -> [HW, C] per image): copy it in 32 x 32 tiles
    // so reads and writes both stay within a few cache lines per tile.
    constexpr int64_t kTile = 32;
    const int64_t q = c.out_extent[rank - 2], l = len;
    const int64_t blocks = (q + kTile - 1) / kTile, outer = count / (q * l);
    pool.parallel_for(outer * blocks, [&](int64_t t0, int64_t t1) {
      std::vector<int64_t> at(rank, 0);
      for (int64_t t = t0; t < t1; ++t) {
        const int64_t o = t / blocks, i0 = (t % blocks) * kTile, i1 = std::min(q, i0 + kTile);
        const float* src = x + offset_of(o, rank - 2, at);
        float* dst = y + o * q * l;
        for (int64_t j0 = 0; j0 < l; j0 += kTile) {
          const int64_t j1 = std::min(l, j0 + kTile);
          for (int64_t i = i0; i < i1; ++i)
            for (int64_t j = j0; j < j1; ++j) dst[i * l + j] = src[j * q + i];
        }
      }
    }, std::max<int64_t>(1, 4096 / (kTile * l)));
    return;
  }
  const int64_t rows = count / len;
  pool.parallel_for(rows, [&](int64_t r0, int64_t r1) {
    std::vector<int64_t> at(rank, 0);
    int64_t from = offset_of(r0, rank - 1, at);  // output row r0's first element
    for (int64_t r = r0; r < r1; ++r) {
      float* dst = y + r * len;
      if (step == 1) std::memcpy(dst, x + from, static_cast<size_t>(len) * sizeof(float));
      else
        for (int64_t i = 0; i < len; ++i) dst[i] = x[from + i * step];
      for (int64_t d = static_cast<int64_t>(rank) - 2; d >= 0; --d) {  // next row
        from += c.in_stride[d];
        if (++at[d] < c.out_extent[d]) break;
        from -= at[d] * c.in_stride[d];
        at[d] = 0;
      }
    }
  }, std::max<int64_t>(1, 16384 / len));
}

void upsample_nearest(int64_t planes, int64_t h, int64_t w, int64_t sh, int64_t sw, const float* x, float* y,
                      ThreadPool& pool) {
  if (planes < 0 || h < 0 || w < 0 || sh < 1 || sw < 1) fail_runtime("upsample_nearest: invalid sizes");
  const int64_t ow = w * sw;
  if (planes == 0 || h == 0 || ow == 0) return;
  pool.parallel_for(planes * h, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {  // input row r: output rows r*sh .. r*sh + sh - 1
      const float* src = x + r * w;
      float* dst = y + r * sh * ow;
      for (int64_t j = 0; j < w; ++j) std::fill(dst + j * sw, dst + (j + 1) * sw, src[j]);
      for (int64_t k = 1; k < sh; ++k) std::memcpy(dst + k * ow, dst, static_cast<size_t>(ow) * sizeof(float));
    }
  }, std::max<int64_t>(1, 8192 / (ow * sh)));
}

int64_t first_bad_index(const float* index, int64_t count, int64_t extent) {
  for (int64_t i = 0; i < count; ++i) {
    const float f = index[i];
    if (!(f >= 0.f && f < static_cast<float>(extent)) || f != std::floor(f)) return i;
  }
  return -1;
}

void gather(int64_t outer, int64_t extent, int64_t inner, int64_t k, const float* x, const float* index, float* y,
            ThreadPool& pool, bool shared_x) {
  if (outer < 0 || extent < 0 || inner < 0 || k < 0) fail_runtime("gather: negative size");
  if (first_bad_index(index, outer * k, extent) >= 0) fail_runtime("gather: index outside [0, ", extent, ")");
  pool.parallel_for(outer * k, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t o = r / k, i = static_cast<int64_t>(index[r]);
      std::memcpy(y + r * inner, x + ((shared_x ? 0 : o) * extent + i) * inner, static_cast<size_t>(inner) * sizeof(float));
    }
  }, std::max<int64_t>(1, 16384 / std::max<int64_t>(1, inner)));
}

}  // namespace kiln::cpu
