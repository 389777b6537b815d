// linear on the last axis: y[r, m] = act(sum_k x[r, k] * w[m, k] + bias[m])
// for every row r of x[..., K] (x as [rows, K]), in double.
#include "backends/cpu/ref/ref.hpp"
#include "ir/quant_form.hpp"
#include "quant/layer.hpp"

namespace kiln::ref {

Buffer linear(const OpArgs& a) {
  const int64_t k_len = a.in_shape(1)[1], m_len = a.in_shape(1)[0];
  const int64_t rows = k_len == 0 ? 0 : static_cast<int64_t>(a.in[0].size()) / k_len;
  const Buffer &x = a.in[0], &w = a.in[1];
  const Buffer* bias = a.has_input(2) ? &a.in[2] : nullptr;
  const Activation act = a.n.activation();
  Buffer y(static_cast<size_t>(rows * m_len));
  if (is_quantized_layer(a.g, a.n)) {  // codes in x and w: the exact sum, then the layer's epilogue (quant/layer.hpp)
    const quant::LayerEpilogue ep = quant::layer_epilogue(a.g, a.n, bias ? bias->data() : nullptr);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t m = 0; m < m_len; ++m) {
        double sum = 0;
        for (int64_t k = 0; k < k_len; ++k) sum += double(x[r * k_len + k]) * w[m * k_len + k];
        y[r * m_len + m] = ep.apply(m, sum, nullptr);
      }
    return y;
  }
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t m = 0; m < m_len; ++m) {
      double sum = bias ? (*bias)[m] : 0.0;
      for (int64_t k = 0; k < k_len; ++k) sum += double(x[r * k_len + k]) * w[m * k_len + k];
      y[r * m_len + m] = static_cast<float>(activate(act, sum));
    }
  return y;
}

}  // namespace kiln::ref
