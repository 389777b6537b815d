// layer_norm over the last axis, torch.nn.functional.layer_norm(x, [C], weight, bias, eps):
// per row of C values, mean and biased variance (divided by C), then
// y = (x - mean) / sqrt(var + eps) * weight + bias. In double here; the
// backends keep the statistics in f32 (never in the storage type).
#include <cmath>

#include "backends/cpu/ref/ref.hpp"

namespace kiln::ref {

Buffer layer_norm(const OpArgs& a) {
  const Buffer& x = a.in[0];
  const int64_t c = a.in_shape(0).back();
  const int64_t rows = c == 0 ? 0 : static_cast<int64_t>(x.size()) / c;
  const Buffer* weight = a.has_input(1) ? &a.in[1] : nullptr;
  const Buffer* bias = a.has_input(2) ? &a.in[2] : nullptr;
  const double eps = a.n.attr_float("eps", 1e-5);
  Buffer y(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = x.data() + r * c;
    double mean = 0;
    for (int64_t i = 0; i < c; ++i) mean += row[i];
    mean /= double(c);
    double var = 0;
    for (int64_t i = 0; i < c; ++i) var += (row[i] - mean) * (row[i] - mean);
    var /= double(c);
    const double inv_std = 1 / std::sqrt(var + eps);
    for (int64_t i = 0; i < c; ++i) {
      double v = (row[i] - mean) * inv_std;
      if (weight) v *= (*weight)[i];
      if (bias) v += (*bias)[i];
      y[r * c + i] = static_cast<float>(v);
    }
  }
  return y;
}

}  // namespace kiln::ref
