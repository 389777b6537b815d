// matmul, torch.matmul for the shapes kiln takes: a[..., M, K] x b[..., K, N]
// with equal leading dims, or one 2-D operand used for every leading index.
// y[p, i, j] = sum_k a[p, i, k] * b[p, k, j], in double.
#include "backends/cpu/ref/ref.hpp"
#include "ir/attrs.hpp"

namespace kiln::ref {

Buffer matmul(const OpArgs& a) {
  const MatMulDims d = matmul_dims(a.g, a.n);
  const Buffer &x = a.in[0], &w = a.in[1];
  Buffer y(static_cast<size_t>(d.batch * d.m * d.n));
  for (int64_t p = 0; p < d.batch; ++p) {
    const float* ap = x.data() + p * d.a_stride();
    const float* bp = w.data() + p * d.b_stride();
    for (int64_t i = 0; i < d.m; ++i)
      for (int64_t j = 0; j < d.n; ++j) {
        double sum = 0;
        for (int64_t k = 0; k < d.k; ++k) sum += double(ap[i * d.k + k]) * bp[k * d.n + j];
        y[(p * d.m + i) * d.n + j] = static_cast<float>(sum);
      }
  }
  return y;
}

}  // namespace kiln::ref
