// ms_deform_attn on the CPU: the reference's structure (ref/ms_deform_attn.cpp
// says what it computes) in f32, threaded over the N*Q queries. Per (query,
// head) the softmax weights and the bilinear corner weights are folded into
// one factor per corner, so the inner loop is an axpy over the head's D
// contiguous channels of value [n, s, heads, d].
#include <algorithm>
#include <cmath>
#include <vector>

#include "backends/cpu/kernels.hpp"

namespace kiln::cpu {

namespace {

int64_t discrete_index(float loc, int64_t extent) {
  const float f = loc * static_cast<float>(extent) + 0.5f;
  if (!(f >= 1.f)) return 0;  // torch: (int64) truncates; below 1 (and NaN) clamps to 0
  if (f >= static_cast<float>(extent - 1)) return extent - 1;
  return static_cast<int64_t>(f);
}

inline void axpy(int64_t d, float a, const float* x, float* y) {
  for (int64_t i = 0; i < d; ++i) y[i] += a * x[i];
}

}  // namespace

void ms_deform_attn(const DeformAttnParams& pr, const float* value, const float* ref, const float* off,
                    const float* logits, float* y, ThreadPool& pool) {
  const int64_t rows = pr.n * pr.q, hd = pr.heads * pr.d;
  pool.parallel_for(
      rows,
      [&](int64_t begin, int64_t end) {
        std::vector<float> w(static_cast<size_t>(pr.p));
        for (int64_t r = begin; r < end; ++r) {
          const int64_t n = r / pr.q;
          const float* box = ref + r * 4;
          float* out = y + r * hd;
          std::fill(out, out + hd, 0.f);
          for (int64_t h = 0; h < pr.heads; ++h) {
            const int64_t row = r * pr.heads + h;
            const float* lg = logits + row * pr.p;
            const float* of = off + row * pr.p * 2;
            float mx = -INFINITY;
            for (int64_t p = 0; p < pr.p; ++p) mx = std::max(mx, lg[p]);
            float sum = 0;
            for (int64_t p = 0; p < pr.p; ++p) sum += w[p] = std::exp(lg[p] - mx);
            const float inv = 1.f / sum;
            float* o = out + h * pr.d;
            const float* vh = value + (n * pr.s * pr.heads + h) * pr.d;  // row s at vh + s * hd
            int64_t p = 0;
            for (size_t l = 0; l < pr.points.size(); ++l) {
              const int64_t H = pr.level_h[l], W = pr.level_w[l];
              const float* vl = vh + pr.level_start[l] * hd;
              const float scale = 1.0f / static_cast<float>(pr.points[l]);
              for (int64_t k = 0; k < pr.points[l]; ++k, ++p) {
                const float a = w[p] * inv;
                const float lx = box[0] + of[2 * p] * scale * box[2] * pr.offset_scale;
                const float ly = box[1] + of[2 * p + 1] * scale * box[3] * pr.offset_scale;
                if (pr.discrete) {
                  axpy(pr.d, a, vl + (discrete_index(ly, H) * W + discrete_index(lx, W)) * hd, o);
                  continue;
                }
                const float px = lx * static_cast<float>(W) - 0.5f, py = ly * static_cast<float>(H) - 0.5f;
                // Entirely outside (or not finite): every corner is padding.
                if (!(px > -1.f && px < static_cast<float>(W) && py > -1.f && py < static_cast<float>(H))) continue;
                const float x0f = std::floor(px), y0f = std::floor(py);
                const float fx = px - x0f, fy = py - y0f;
                const int64_t x0 = static_cast<int64_t>(x0f), y0 = static_cast<int64_t>(y0f);
                const bool x0_in = x0 >= 0, x1_in = x0 + 1 < W, y0_in = y0 >= 0, y1_in = y0 + 1 < H;
                if (y0_in && x0_in) axpy(pr.d, a * (1 - fy) * (1 - fx), vl + (y0 * W + x0) * hd, o);
                if (y0_in && x1_in) axpy(pr.d, a * (1 - fy) * fx, vl + (y0 * W + x0 + 1) * hd, o);
                if (y1_in && x0_in) axpy(pr.d, a * fy * (1 - fx), vl + ((y0 + 1) * W + x0) * hd, o);
                if (y1_in && x1_in) axpy(pr.d, a * fy * fx, vl + ((y0 + 1) * W + x0 + 1) * hd, o);
              }
            }
          }
        }
      },
      std::max<int64_t>(1, 4096 / std::max<int64_t>(1, pr.heads * pr.p * pr.d)));
}

}  // namespace kiln::cpu
