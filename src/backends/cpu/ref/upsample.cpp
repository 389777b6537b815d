// upsample_nearest with integer factors: every input pixel becomes an sh x sw
// block, y[n, c, i, j] = x[n, c, i / sh, j / sw]: F.interpolate(x,
// scale_factor=s, mode="nearest") for RT-DETR's s = 2 exactly (torch takes
// dst >> 1 there) and for every power of two (its floor(dst * float(1/s)) is
// exact). For other integers kiln defines the index as dst / s; torch's float
// product can land one pixel lower where it rounds below an integer.
#include "backends/cpu/ref/ref.hpp"
#include "ir/attrs.hpp"

namespace kiln::ref {

Buffer upsample_nearest(const OpArgs& a) {
  const Shape& xs = a.in_shape(0);
  const UpsampleAttrs s = upsample_attrs(a.n);
  const int64_t planes = xs[0] * xs[1], h = xs[2], w = xs[3], oh = h * s.sh, ow = w * s.sw;
  Buffer y(static_cast<size_t>(planes * oh * ow));
  for (int64_t p = 0; p < planes; ++p)
    for (int64_t i = 0; i < oh; ++i)
      for (int64_t j = 0; j < ow; ++j) y[(p * oh + i) * ow + j] = a.in[0][(p * h + i / s.sh) * w + j / s.sw];
  return y;
}

}  // namespace kiln::ref
