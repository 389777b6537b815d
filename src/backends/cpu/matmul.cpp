// Batched matmul for the CPU backend: one OpenBLAS sgemm (f32 accumulation)
// per product and block of rows, the blocks spread over the pool as linear
// spreads its output features (OpenBLAS itself runs single-threaded, see
// linear.cpp). A shared 2-D right operand with a batched left one is one
// GEMM over all the left rows.
#include <cblas.h>

#include <algorithm>

#include "backends/cpu/kernels.hpp"
#include "core/error.hpp"

namespace kiln::cpu {

void matmul(int64_t batch, int64_t m, int64_t k, int64_t n, const float* a, int64_t a_stride, const float* b,
            int64_t b_stride, float* y, ThreadPool& pool) {
  if (batch < 0 || m < 0 || k < 0 || n < 0) fail_runtime("matmul: negative size");
  if (batch == 0 || m == 0 || n == 0) return;
  if (k == 0) {  // an empty sum
    std::fill(y, y + batch * m * n, 0.f);
    return;
  }
  if (b_stride == 0 && a_stride == m * k) m *= batch, batch = 1;  // [batch*m, k] x [k, n]
  use_single_threaded_blas();
  // Row blocks of at least ~64K multiply-adds each.
  const int64_t block = std::max<int64_t>(1, (int64_t{1} << 16) / (k * n));
  const int64_t blocks = (m + block - 1) / block;
  // Small products go several to a chunk, so each chunk also does ~64K multiply-adds.
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 16) / (std::min(block, m) * k * n));
  pool.parallel_for(batch * blocks, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t p = t / blocks, r0 = (t % blocks) * block, rows = std::min(block, m - r0);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(rows), static_cast<int>(n),
                  static_cast<int>(k), 1.f, a + p * a_stride + r0 * k, static_cast<int>(k), b + p * b_stride,
                  static_cast<int>(n), 0.f, y + (p * m + r0) * n, static_cast<int>(n));
    }
  }, grain);
}

}  // namespace kiln::cpu
