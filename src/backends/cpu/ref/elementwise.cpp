// activation, add (with its fused activation), mul (same shapes, or a
// per-channel scale [N,C,1,1] broadcast over the pixels of a 4-D x) and
// inverse_sigmoid. add and mul also take a constant repeated per image.
#include <algorithm>
#include <cmath>

#include "backends/cpu/ref/ref.hpp"
#include "core/broadcast.hpp"
#include "core/error.hpp"

namespace kiln::ref {

Buffer activation(const OpArgs& a) {
  const Activation act = a.n.activation();
  Buffer y(a.in[0].size());
  for (size_t i = 0; i < y.size(); ++i) y[i] = static_cast<float>(activate(act, a.in[0][i]));
  return y;
}

namespace {

// Input 1 as y's shape would index it: itself, or one image of a constant
// repeated per image (core/broadcast.hpp), read at i modulo its size.
Buffer second_operand(const OpArgs& a) {
  if (a.in_shape(1) == a.in_shape(0)) return a.in[1];
  return broadcast_one_image(a.in[1], a.in_shape(1), a.in_shape(0));
}

}  // namespace

Buffer add(const OpArgs& a) {
  if (a.in_shape(0) != a.in_shape(1) && !broadcasts_per_image(a.in_shape(1), a.in_shape(0)))
    fail_runtime(a.n.name, ": reference add needs equal shapes or a per-image operand");
  const Activation act = a.n.activation();
  const Buffer b = second_operand(a);
  Buffer y(a.in[0].size());
  for (size_t i = 0; i < y.size(); ++i) y[i] = static_cast<float>(activate(act, double(a.in[0][i]) + b[i % b.size()]));
  return y;
}

Buffer mul(const OpArgs& a) {
  const Shape& xs = a.in_shape(0);
  const Buffer& x = a.in[0];
  Buffer y(x.size());
  if (a.in_shape(1) == xs || broadcasts_per_image(a.in_shape(1), xs)) {
    const Buffer b = second_operand(a);
    for (size_t i = 0; i < y.size(); ++i) y[i] = static_cast<float>(double(x[i]) * b[i % b.size()]);
    return y;
  }
  const Buffer& s = a.in[1];
  // [N,C,H,W] * [N,C,1,1]: one factor per (image, channel).
  const int64_t planes = xs[0] * xs[1], hw = xs[2] * xs[3];
  for (int64_t p = 0; p < planes; ++p)
    for (int64_t i = 0; i < hw; ++i) y[p * hw + i] = static_cast<float>(double(x[p * hw + i]) * s[p]);
  return y;
}

// transformers' inverse_sigmoid (RT-DETR's box refinement): x clamped to
// [0, 1], then log(max(x, eps) / max(1 - x, eps)); NaN stays NaN.
Buffer inverse_sigmoid(const OpArgs& a) {
  const double eps = a.n.attr_float("eps", 1e-5);
  Buffer y(a.in[0].size());
  for (size_t i = 0; i < y.size(); ++i) {
    const double x = a.in[0][i];
    if (std::isnan(x)) {
      y[i] = a.in[0][i];
      continue;
    }
    const double c = std::clamp(x, 0.0, 1.0);
    y[i] = static_cast<float>(std::log(std::max(c, eps) / std::max(1 - c, eps)));
  }
  return y;
}

}  // namespace kiln::ref
