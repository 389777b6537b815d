// linear (fully connected) via OpenBLAS, plus the helper that keeps
// OpenBLAS's own threading in line with the pool's thread budget.
#include <cblas.h>

#include <algorithm>
#include <mutex>

#include "backends/cpu/kernels.hpp"
#include "core/error.hpp"

namespace kiln::cpu {

void use_single_threaded_blas() {
  // openblas_set_num_threads is process-global and not safe to call while
  // another thread is inside OpenBLAS; and OpenBLAS's result bits depend on
  // its thread count. So it is set once to one thread, and kiln's pool
  // splits the GEMMs (by output rows, the same split whether the chunks run
  // in parallel or, with the pool busy with another context, one by one).
  static std::once_flag once;
  std::call_once(once, [] { openblas_set_num_threads(1); });
}

void linear(int n, int in, int out, const float* x, const float* w, const float* bias, Activation act, float* y,
            ThreadPool& pool) {
  if (n < 1 || in < 1 || out < 1) fail_runtime("linear: non-positive size (n=", n, " in=", in, " out=", out, ")");
  use_single_threaded_blas();
  // Chunks of output features, each at least ~64K multiply-adds.
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 16) / (int64_t{n} * in));
  pool.parallel_for(out, [&](int64_t o0, int64_t o1) {
    const int rows = static_cast<int>(o1 - o0);
    if (n == 1) {
      // A single row is a matrix-vector product; sgemv avoids GEMM packing.
      cblas_sgemv(CblasRowMajor, CblasNoTrans, rows, in, 1.f, w + o0 * in, in, x, 1, 0.f, y + o0, 1);
    } else {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, rows, in, 1.f, x, in, w + o0 * in, in, 0.f, y + o0, out);
    }
  }, grain);
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
