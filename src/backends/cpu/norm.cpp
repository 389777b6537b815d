// layer_norm and softmax for the CPU backend: row reductions in f32 for every
// storage type (the values of an f16/bf16 graph arrive widened to f32; only
// the result is rounded to storage, by the backend after the kernel). Rows
// run in parallel; each row is read from memory once per pass.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "backends/cpu/kernels.hpp"
#include "core/error.hpp"

namespace kiln::cpu {

namespace {

// sum of f(i) for i < n in f32, over 8 interleaved partial sums (a loop the
// compiler vectorizes; one running sum would be a serial dependency chain).
template <typename F>
float lane_sum(int64_t n, F f) {
  float acc[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int l = 0; l < 8; ++l) acc[l] += f(i + l);
  for (; i < n; ++i) acc[0] += f(i);
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

}  // namespace

void layer_norm(int64_t rows, int64_t c, const float* x, const float* weight, const float* bias, float eps, float* y,
                ThreadPool& pool) {
  if (rows < 0 || c < 1) fail_runtime("layer_norm: invalid sizes (rows ", rows, ", c ", c, ")");
  pool.parallel_for(rows, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = x + r * c;
      float* yr = y + r * c;
      // Two passes (mean, then the mean square of x - mean): no cancellation
      // when |mean| is large against the spread, as sum(x^2) - n*mean^2 has.
      const float mean = lane_sum(c, [xr](int64_t i) { return xr[i]; }) / static_cast<float>(c);
      const float sq = lane_sum(c, [xr, mean](int64_t i) { return (xr[i] - mean) * (xr[i] - mean); });
      const float inv_std = 1.f / std::sqrt(sq / static_cast<float>(c) + eps);
      if (weight && bias) {
        for (int64_t i = 0; i < c; ++i) yr[i] = (xr[i] - mean) * inv_std * weight[i] + bias[i];
      } else if (weight) {
        for (int64_t i = 0; i < c; ++i) yr[i] = (xr[i] - mean) * inv_std * weight[i];
      } else {
        for (int64_t i = 0; i < c; ++i) yr[i] = (xr[i] - mean) * inv_std;
      }
    }
  }, std::max<int64_t>(1, 16384 / c));
}

void softmax(int64_t outer, int64_t extent, int64_t inner, const float* x, float* y, ThreadPool& pool) {
  if (outer < 0 || inner < 0 || extent < 0)
    fail_runtime("softmax: invalid sizes (outer ", outer, ", extent ", extent, ", inner ", inner, ")");
  if (outer == 0 || inner == 0 || extent == 0) return;  // nothing to write
  if (inner == 1) {  // the last axis: contiguous rows
    pool.parallel_for(outer, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const float* xr = x + r * extent;
        float* yr = y + r * extent;
        float max = -std::numeric_limits<float>::infinity();
        for (int64_t i = 0; i < extent; ++i) max = std::max(max, xr[i]);
        float sum = 0.f;
        for (int64_t i = 0; i < extent; ++i) sum += (yr[i] = std::exp(xr[i] - max));
        const float inv = 1.f / sum;
        for (int64_t i = 0; i < extent; ++i) yr[i] *= inv;
      }
    }, std::max<int64_t>(1, 4096 / extent));
    return;
  }
  // Another axis: per outer index, the inner positions side by side (a
  // running max, sum and scale over `inner` lanes keep the reads contiguous).
  pool.parallel_for(outer, [&](int64_t o0, int64_t o1) {
    std::vector<float> max(static_cast<size_t>(inner)), sum(static_cast<size_t>(inner));
    for (int64_t o = o0; o < o1; ++o) {
      const float* xo = x + o * extent * inner;
      float* yo = y + o * extent * inner;
      std::fill(max.begin(), max.end(), -std::numeric_limits<float>::infinity());
      std::fill(sum.begin(), sum.end(), 0.f);
      for (int64_t i = 0; i < extent; ++i)
        for (int64_t r = 0; r < inner; ++r) max[r] = std::max(max[r], xo[i * inner + r]);
      for (int64_t i = 0; i < extent; ++i)
        for (int64_t r = 0; r < inner; ++r) sum[r] += (yo[i * inner + r] = std::exp(xo[i * inner + r] - max[r]));
      for (int64_t r = 0; r < inner; ++r) sum[r] = 1.f / sum[r];
      for (int64_t i = 0; i < extent; ++i)
        for (int64_t r = 0; r < inner; ++r) yo[i * inner + r] *= sum[r];
    }
  }, std::max<int64_t>(1, 4096 / (extent * inner)));
}

}  // namespace kiln::cpu
