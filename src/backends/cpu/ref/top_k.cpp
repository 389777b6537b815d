// top_k as torch.topk(x, k, dim=axis, largest=largest, sorted=True) defines
// it, plus the two choices torch leaves open (docs/graph-ir.md): equal values
// come out by smaller index first, and NaN ranks above every number
// (largest=1 returns NaNs first, largest=0 last). Row by row: list the row's
// indices, sort them stably by value (stable, so equal values keep index
// order) and keep the first k.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "backends/cpu/ref/ref.hpp"
#include "core/error.hpp"
#include "ir/attrs.hpp"

namespace kiln::ref {

namespace {

// True when a ranks above b: NaN above every number, all NaNs equal.
bool above(float a, float b) {
  if (std::isnan(a)) return !std::isnan(b);
  if (std::isnan(b)) return false;
  return a > b;
}

}  // namespace

std::vector<Buffer> top_k(const OpArgs& a) {
  const TopKAttrs t = top_k_attrs(a.g, a.n);
  // Buffers are floats: an index is exact only up to 2^24.
  if (t.extent > (int64_t{1} << 24))
    fail_input(a.n.name, ": top_k over an axis of ", t.extent, " elements (the reference holds indices as floats, exact to 2^24)");
  const Buffer& x = a.in[0];
  const size_t count = static_cast<size_t>(t.outer * t.k * t.inner);
  Buffer values(count), indices(count);
  std::vector<int64_t> order(static_cast<size_t>(t.extent));
  for (int64_t o = 0; o < t.outer; ++o)
    for (int64_t r = 0; r < t.inner; ++r) {
      auto at = [&](int64_t i) { return x[(o * t.extent + i) * t.inner + r]; };
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int64_t i, int64_t j) {
        return t.largest ? above(at(i), at(j)) : above(at(j), at(i));
      });
      for (int64_t j = 0; j < t.k; ++j) {
        const size_t y = static_cast<size_t>((o * t.k + j) * t.inner + r);
        values[y] = at(order[j]);
        indices[y] = static_cast<float>(order[j]);
      }
    }
  return {std::move(values), std::move(indices)};
}

}  // namespace kiln::ref
