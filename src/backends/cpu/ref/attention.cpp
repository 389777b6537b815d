// attention: per image n, head h and query i, in double:
//   s_j = scale * sum_c q[n,i,h*D+c] * k[n,j,h*D+c],  p = softmax_j(s),
//   y[n,i,h*Dv+c] = sum_j p_j * v[n,j,h*Dv+c].
#include <cmath>

#include "backends/cpu/ref/ref.hpp"
#include "ir/attrs.hpp"

namespace kiln::ref {

Buffer attention(const OpArgs& a) {
  const AttentionDims d = attention_dims(a.g, a.n);
  const Buffer &q = a.in[0], &k = a.in[1], &v = a.in[2];
  const int64_t cq = d.heads * d.d, cv = d.heads * d.dv;
  Buffer y(static_cast<size_t>(d.n * d.lq * cv), 0.f);
  std::vector<double> s(static_cast<size_t>(d.lk));
  for (int64_t n = 0; n < d.n; ++n)
    for (int64_t h = 0; h < d.heads; ++h)
      for (int64_t i = 0; i < d.lq; ++i) {
        double mx = -INFINITY;
        for (int64_t j = 0; j < d.lk; ++j) {
          double acc = 0;
          for (int64_t c = 0; c < d.d; ++c)
            acc += static_cast<double>(q[(n * d.lq + i) * cq + h * d.d + c]) * k[(n * d.lk + j) * cq + h * d.d + c];
          s[j] = d.scale * acc;
          mx = std::max(mx, s[j]);
        }
        double sum = 0;
        for (int64_t j = 0; j < d.lk; ++j) sum += s[j] = std::exp(s[j] - mx);
        for (int64_t c = 0; c < d.dv; ++c) {
          double acc = 0;
          for (int64_t j = 0; j < d.lk; ++j) acc += s[j] * v[(n * d.lk + j) * cv + h * d.dv + c];
          y[(n * d.lq + i) * cv + h * d.dv + c] = static_cast<float>(acc / sum);
        }
      }
  return y;
}

}  // namespace kiln::ref
