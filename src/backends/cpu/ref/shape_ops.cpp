// Ops that move values without arithmetic: flatten (row-major order is kept,
// so a copy), concat and slice along any axis of any rank, and cast (the
// storage rounding run_reference applies to every output is the whole op).
#include "backends/cpu/ref/ref.hpp"

namespace kiln::ref {

namespace {

// A shape seen as [outer, axis, inner] around `axis`.
struct AxisView {
  int64_t outer = 1, len = 1, inner = 1;
};
AxisView around(const Shape& s, int64_t axis) {
  AxisView v;
  for (int64_t d = 0; d < static_cast<int64_t>(s.size()); ++d) {
    if (d < axis) v.outer *= s[d];
    else if (d == axis) v.len = s[d];
    else v.inner *= s[d];
  }
  return v;
}
int64_t axis_of(const OpArgs& a) {
  int64_t axis = a.n.attr_int("axis");
  return axis < 0 ? axis + static_cast<int64_t>(a.in_shape(0).size()) : axis;
}

}  // namespace

Buffer flatten(const OpArgs& a) { return a.in[0]; }

Buffer cast(const OpArgs& a) { return a.in[0]; }

Buffer concat(const OpArgs& a) {
  const int64_t axis = axis_of(a);
  const AxisView out = around(a.out_shape(), axis);
  Buffer y(static_cast<size_t>(out.outer * out.len * out.inner));
  int64_t begin = 0;  // where input k starts along the axis
  for (size_t k = 0; k < a.in.size(); ++k) {
    const AxisView in = around(a.in_shape(k), axis);
    for (int64_t o = 0; o < in.outer; ++o)
      for (int64_t i = 0; i < in.len; ++i)
        for (int64_t r = 0; r < in.inner; ++r)
          y[(o * out.len + begin + i) * out.inner + r] = a.in[k][(o * in.len + i) * in.inner + r];
    begin += in.len;
  }
  return y;
}

Buffer slice(const OpArgs& a) {
  const int64_t axis = axis_of(a);
  const int64_t start = a.n.attr_int("start");
  const AxisView in = around(a.in_shape(0), axis);
  const AxisView out = around(a.out_shape(), axis);
  Buffer y(static_cast<size_t>(out.outer * out.len * out.inner));
  for (int64_t o = 0; o < out.outer; ++o)
    for (int64_t i = 0; i < out.len; ++i)
      for (int64_t r = 0; r < out.inner; ++r)
        y[(o * out.len + i) * out.inner + r] = a.in[0][(o * in.len + start + i) * in.inner + r];
  return y;
}

}  // namespace kiln::ref
