// Broadcasting a per-image constant over the batch (add and mul, ops.def):
// b has y's rank, extent 1 on the batch axis, and on every other axis either
// y's extent or 1 (numpy's rule, restricted so that one image's worth of b
// repeats unchanged for every image). RT-DETR's anchors, valid mask and
// position embedding are such constants; before this rule they were made
// per image by a linear from a tensor of ones (a conv and a GEMM per run).
#pragma once
#include <vector>

#include "core/tensor.hpp"

namespace kiln {

// Whether b (not equal to y) broadcasts per image into y as above.
inline bool broadcasts_per_image(const Shape& b, const Shape& y) {
  if (b.size() != y.size() || b.size() < 2 || b[0] != 1 || b == y) return false;
  for (size_t d = 1; d < b.size(); ++d)
    if (b[d] != y[d] && b[d] != 1) return false;
  return true;
}

// b's values repeated over the axes where it has extent 1: one image of y
// (shape_numel(y) / y[0] values) in y's row-major order.
inline std::vector<float> broadcast_one_image(const std::vector<float>& b, const Shape& bs, const Shape& ys) {
  const size_t rank = ys.size();
  std::vector<int64_t> b_stride(rank, 0);  // b's stride along each of y's axes (0 where it repeats)
  int64_t s = 1;
  for (size_t d = rank; d-- > 0;) {
    b_stride[d] = bs[d] == 1 ? 0 : s;
    s *= bs[d];
  }
  const int64_t count = ys[0] > 0 ? shape_numel(ys) / ys[0] : 0;
  std::vector<float> out(static_cast<size_t>(count));
  std::vector<int64_t> idx(rank, 0);
  for (int64_t i = 0; i < count; ++i) {
    int64_t at = 0;
    for (size_t d = 1; d < rank; ++d) at += idx[d] * b_stride[d];
    out[static_cast<size_t>(i)] = b[static_cast<size_t>(at)];
    for (size_t d = rank; d-- > 1;) {  // next index of y's image, last axis fastest
      if (++idx[d] < ys[d]) break;
      idx[d] = 0;
    }
  }
  return out;
}

}  // namespace kiln
