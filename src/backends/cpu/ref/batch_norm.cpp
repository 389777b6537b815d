// batch_norm in its inference form on any rank >= 2 (channel axis 1):
// y = (x - mean) / sqrt(var + eps) * scale + bias.
#include <cmath>

#include "backends/cpu/ref/ref.hpp"

namespace kiln::ref {

Buffer batch_norm(const OpArgs& a) {
  const Shape& xs = a.in_shape(0);
  const int64_t batch = xs[0], channels = xs[1];
  int64_t inner = 1;  // elements per (image, channel)
  for (size_t d = 2; d < xs.size(); ++d) inner *= xs[d];
  const Buffer &x = a.in[0], &scale = a.in[1], &bias = a.in[2], &mean = a.in[3], &var = a.in[4];
  const double eps = a.n.attr_float("eps", 1e-5);
  Buffer y(x.size());
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t c = 0; c < channels; ++c)
      for (int64_t i = 0; i < inner; ++i) {
        const int64_t at = (b * channels + c) * inner + i;
        y[at] = static_cast<float>((double(x[at]) - mean[c]) / std::sqrt(double(var[c]) + eps) * scale[c] + bias[c]);
      }
  return y;
}

}  // namespace kiln::ref
