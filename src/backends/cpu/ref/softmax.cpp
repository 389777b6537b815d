// softmax along one axis, torch.softmax(x, dim=axis): for each line along the
// axis, exp(x - max) / sum of exp(x - max). The max is subtracted so large
// logits do not overflow (the result is the same function). In double here;
// the backends compute in f32 for every storage type.
#include <cmath>
#include <limits>

#include "backends/cpu/ref/ref.hpp"
#include "ir/attrs.hpp"

namespace kiln::ref {

Buffer softmax(const OpArgs& a) {
  const AxisSplit s = softmax_split(a.g, a.n);
  const Buffer& x = a.in[0];
  Buffer y(x.size());
  for (int64_t o = 0; o < s.outer; ++o)
    for (int64_t r = 0; r < s.inner; ++r) {
      auto at = [&](int64_t i) { return static_cast<size_t>((o * s.extent + i) * s.inner + r); };
      double max = -std::numeric_limits<double>::infinity();
      for (int64_t i = 0; i < s.extent; ++i) max = std::max(max, double(x[at(i)]));
      double sum = 0;
      for (int64_t i = 0; i < s.extent; ++i) sum += std::exp(double(x[at(i)]) - max);
      for (int64_t i = 0; i < s.extent; ++i) y[at(i)] = static_cast<float>(std::exp(double(x[at(i)]) - max) / sum);
    }
  return y;
}

}  // namespace kiln::ref
