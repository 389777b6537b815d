// Multi-head attention for the CPU backend (ops.def `attention`): per image,
// head and block of query rows, one OpenBLAS sgemm for the scores (q_h k_h^T,
// scaled), a softmax per row in f32, one sgemm for the weighted sum of v_h.
// The heads are read in place (column offsets and leading dimensions of the
// [N, L, H*D] tokens), so no split/merge copies are made. The blocks spread
// over the pool; OpenBLAS itself runs single-threaded (see linear.cpp).
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "backends/cpu/kernels.hpp"
#include "core/error.hpp"

namespace kiln::cpu {

void attention(const AttentionParams& p, const float* q, const float* k, const float* v, float* y, ThreadPool& pool) {
  if (p.n < 0 || p.lq < 1 || p.lk < 1 || p.heads < 1 || p.d < 1 || p.dv < 1) fail_runtime("attention: invalid sizes");
  use_single_threaded_blas();
  const int64_t cq = p.heads * p.d, cv = p.heads * p.dv;
  // Query blocks of at most 64 rows and ~64K multiply-adds each.
  const int64_t rows = std::clamp<int64_t>((int64_t{1} << 16) / (p.lk * (p.d + p.dv)), 1, 64);
  const int64_t blocks = (p.lq + rows - 1) / rows;
  pool.parallel_for(p.n * p.heads * blocks, [&](int64_t t0, int64_t t1) {
    std::vector<float> s(static_cast<size_t>(rows * p.lk));
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t n = t / (p.heads * blocks), h = (t / blocks) % p.heads, r0 = (t % blocks) * rows;
      const int64_t m = std::min(rows, p.lq - r0);
      const float* qb = q + (n * p.lq + r0) * cq + h * p.d;
      const float* kb = k + n * p.lk * cq + h * p.d;
      const float* vb = v + n * p.lk * cv + h * p.dv;
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(m), static_cast<int>(p.lk), static_cast<int>(p.d),
                  p.scale, qb, static_cast<int>(cq), kb, static_cast<int>(cq), 0.f, s.data(), static_cast<int>(p.lk));
      for (int64_t i = 0; i < m; ++i) {
        float* r = s.data() + i * p.lk;
        float mx = -std::numeric_limits<float>::infinity();
        for (int64_t j = 0; j < p.lk; ++j) mx = std::max(mx, r[j]);
        float sum = 0.f;
        for (int64_t j = 0; j < p.lk; ++j) sum += (r[j] = std::exp(r[j] - mx));
        const float inv = 1.f / sum;
        for (int64_t j = 0; j < p.lk; ++j) r[j] *= inv;
      }
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(m), static_cast<int>(p.dv), static_cast<int>(p.lk),
                  1.f, s.data(), static_cast<int>(p.lk), vb, static_cast<int>(cv), 0.f, y + (n * p.lq + r0) * cv + h * p.dv,
                  static_cast<int>(cv));
    }
  }, 1);
}

}  // namespace kiln::cpu
