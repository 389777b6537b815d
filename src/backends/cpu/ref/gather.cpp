// gather along an axis by a per-row index: x as [outer, extent, inner]
// around the axis, index as [outer, k]: y[o, j, r] = x[o, index[o, j], r].
// That is torch.gather(x, axis, index[..., None, ...].expand(...)) with the
// index repeated over x's trailing dims, as RT-DETR's query selection writes
// it; x with leading dims of 1 is shared by every index row (x_row). An
// index outside [0, extent) (torch.gather refuses negatives too) is an input
// error naming the node. Indices arrive as floats holding integers.
#include <cmath>

#include "backends/cpu/ref/ref.hpp"
#include "core/error.hpp"
#include "ir/attrs.hpp"

namespace kiln::ref {

Buffer gather(const OpArgs& a) {
  const GatherDims d = gather_dims(a.g, a.n);
  const Buffer &x = a.in[0], &index = a.in[1];
  Buffer y(static_cast<size_t>(d.outer * d.k * d.inner));
  for (int64_t o = 0; o < d.outer; ++o)
    for (int64_t j = 0; j < d.k; ++j) {
      const float f = index[o * d.k + j];
      if (!(f >= 0 && f < float(d.extent)) || f != std::floor(f))
        fail_input(a.n.name, ": gather index ", f, " (row ", o, ", position ", j, ") is not an integer in [0, ", d.extent, ")");
      const int64_t i = static_cast<int64_t>(f);
      for (int64_t r = 0; r < d.inner; ++r) y[(o * d.k + j) * d.inner + r] = x[(d.x_row(o) * d.extent + i) * d.inner + r];
    }
  return y;
}

}  // namespace kiln::ref
