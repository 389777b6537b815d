// top_k for the CPU backend. Each element of a row becomes one 64-bit key
// that sorts in output order: its value's rank in the high 32 bits (a
// monotone map of the float, NaN on top, -0 with +0), its index in the low
// 32 bits, so equal values fall back to index order without a second
// comparison. One std::partial_sort over integers per row, O(extent log k);
// rows run in parallel. The values written are the input's own elements.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "backends/cpu/kernels.hpp"
#include "core/error.hpp"

namespace kiln::cpu {

namespace {

// Unsigned key, increasing with the float: negative numbers flip all bits,
// non-negative ones set the sign bit. All NaNs map to the top; -0 to +0's key.
uint32_t rank_key(float v) {
  if (std::isnan(v)) return 0xFFFFFFFFu;
  if (v == 0.f) v = 0.f;
  uint32_t b;
  std::memcpy(&b, &v, sizeof b);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

}  // namespace

void top_k(int64_t outer, int64_t extent, int64_t inner, int64_t k, bool largest, const float* x, float* values,
           float* indices, ThreadPool& pool) {
  if (outer < 0 || inner < 0 || extent < 1 || k < 1 || k > extent)
    fail_runtime("top_k: invalid sizes (outer ", outer, ", extent ", extent, ", inner ", inner, ", k ", k, ")");
  if (extent > (int64_t{1} << 24)) fail_runtime("top_k: axis extent ", extent, " above 2^24 (indices are stored as f32)");
  const int64_t rows = outer * inner;
  const int64_t grain = std::max<int64_t>(1, 16384 / extent);
  pool.parallel_for(rows, [&](int64_t begin, int64_t end) {
    std::vector<uint64_t> keys(static_cast<size_t>(extent));
    for (int64_t row = begin; row < end; ++row) {
      const int64_t o = row / inner, r = row % inner;
      const float* xr = x + o * extent * inner + r;  // element i at xr[i * inner]
      for (int64_t i = 0; i < extent; ++i) {
        // Ascending keys = output order: largest puts high ranks first by complementing them.
        const uint32_t rank = rank_key(xr[i * inner]);
        keys[i] = (uint64_t{largest ? ~rank : rank} << 32) | static_cast<uint64_t>(i);
      }
      std::partial_sort(keys.begin(), keys.begin() + k, keys.end());
      float* vr = values + o * k * inner + r;
      float* ir = indices + o * k * inner + r;
      for (int64_t j = 0; j < k; ++j) {
        const int64_t i = static_cast<int64_t>(keys[j] & 0xFFFFFFFFu);
        vr[j * inner] = xr[i * inner];
        ir[j * inner] = static_cast<float>(i);
      }
    }
  }, grain);
}

}  // namespace kiln::cpu
