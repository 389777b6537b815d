// linear (fully connected) via OpenBLAS, plus the helper that keeps
// OpenBLAS's own threading in line with the pool's thread budget.
#include <cblas.h>

#include <algorithm>
#include <atomic>

#include "backends/cpu/kernels.hpp"
#include "core/error.hpp"

namespace kiln::cpu {

void set_blas_threads(int threads) {
  // openblas_set_num_threads is process-global and, in the pthread build,
  // may (re)start its worker threads; calling it only on change keeps the
  // per-kernel cost at one atomic load.
  static std::atomic<int> current{0};
  threads = std::max(1, threads);
  if (current.exchange(threads, std::memory_order_relaxed) != threads) openblas_set_num_threads(threads);
}

void linear(int n, int in, int out, const float* x, const float* w, const float* bias, Activation act, float* y,
            ThreadPool& pool) {
  if (n < 1 || in < 1 || out < 1) fail_runtime("linear: non-positive size (n=", n, " in=", in, " out=", out, ")");
  set_blas_threads(pool.threads());
  if (n == 1) {
    // A single row is a matrix-vector product; sgemv avoids GEMM packing.
    cblas_sgemv(CblasRowMajor, CblasNoTrans, out, in, 1.f, w, in, x, 1, 0.f, y, 1);
  } else {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, out, in, 1.f, x, in, w, in, 0.f, y, out);
  }
  if (!bias && act == Activation::None) return;
  pool.parallel_for(n, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      float* row = y + r * out;
      if (bias)
        for (int i = 0; i < out; ++i) row[i] += bias[i];
      if (act != Activation::None) activation(out, row, act, row);
    }
  }, std::max<int64_t>(1, 16384 / out));
}

}  // namespace kiln::cpu
