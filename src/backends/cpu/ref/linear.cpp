// linear: y[n, m] = act(sum_k x[n, k] * w[m, k] + bias[m]), in double.
#include "backends/cpu/ref/ref.hpp"

namespace kiln::ref {

Buffer linear(const OpArgs& a) {
  const int64_t rows = a.in_shape(0)[0], k_len = a.in_shape(0)[1], m_len = a.in_shape(1)[0];
  const Buffer &x = a.in[0], &w = a.in[1];
  const Buffer* bias = a.has_input(2) ? &a.in[2] : nullptr;
  const Activation act = a.n.activation();
  Buffer y(static_cast<size_t>(rows * m_len));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t m = 0; m < m_len; ++m) {
      double sum = bias ? (*bias)[m] : 0.0;
      for (int64_t k = 0; k < k_len; ++k) sum += double(x[r * k_len + k]) * w[m * k_len + k];
      y[r * m_len + m] = static_cast<float>(activate(act, sum));
    }
  return y;
}

}  // namespace kiln::ref
