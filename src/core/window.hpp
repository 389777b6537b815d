// Output length of a sliding window (convolution or pooling) along one axis,
// PyTorch's rule: floor((in + pads - dilation*(k-1) - 1) / stride) + 1, and
// with ceil_mode the rounding goes up but the last window must start inside
// the input or the begin padding. The one definition shared by shape
// inference, the CPU kernels and the CUDA descriptors. Callers validate
// (positive k/stride/dilation, window not larger than the padded input).
#pragma once
#include <cstdint>

namespace kiln {

constexpr int64_t window_out_dim(int64_t in, int64_t k, int64_t stride, int64_t pad_begin, int64_t pad_end,
                                 int64_t dilation = 1, bool ceil_mode = false) {
  const int64_t span = in + pad_begin + pad_end - dilation * (k - 1) - 1;
  int64_t out = (ceil_mode ? (span + stride - 1) / stride : span / stride) + 1;
  if (ceil_mode && (out - 1) * stride >= in + pad_begin) --out;
  return out;
}

}  // namespace kiln
