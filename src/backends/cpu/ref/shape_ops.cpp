// Ops that move values without arithmetic: flatten and reshape (row-major
// order is kept, so a copy), transpose, concat and slice along any axis of
// any rank, and cast (the storage rounding run_reference applies to every
// output is the whole op).
#include "backends/cpu/ref/ref.hpp"
#include "ir/attrs.hpp"

namespace kiln::ref {

namespace {

int64_t axis_of(const OpArgs& a) { return axis_attr(a.n, a.in_shape(0).size(), 0); }

}  // namespace

Buffer flatten(const OpArgs& a) { return a.in[0]; }

Buffer cast(const OpArgs& a) { return a.in[0]; }

Buffer reshape(const OpArgs& a) { return a.in[0]; }

// y[i_0, ..., i_r-1] = x[j] where x's index has i_d on axis perm[d]: walk the
// output in order, keeping the input offset from the input's strides.
Buffer transpose(const OpArgs& a) {
  const Shape& xs = a.in_shape(0);
  const Shape& ys = a.out_shape();
  const std::vector<int64_t> perm = a.n.attr_ints("perm");
  const size_t rank = xs.size();
  std::vector<int64_t> x_stride(rank, 1);
  for (size_t d = rank - 1; d > 0; --d) x_stride[d - 1] = x_stride[d] * xs[d];
  Buffer y(a.in[0].size());
  std::vector<int64_t> at(rank, 0);  // the output index
  for (size_t i = 0; i < y.size(); ++i) {
    int64_t from = 0;
    for (size_t d = 0; d < rank; ++d) from += at[d] * x_stride[perm[d]];
    y[i] = a.in[0][static_cast<size_t>(from)];
    for (size_t d = rank; d-- > 0;) {  // next output index, last axis fastest
      if (++at[d] < ys[d]) break;
      at[d] = 0;
    }
  }
  return y;
}

Buffer concat(const OpArgs& a) {
  const int64_t axis = axis_of(a);
  const AxisSplit out = split_at(a.out_shape(), axis);
  Buffer y(static_cast<size_t>(out.outer * out.extent * out.inner));
  int64_t begin = 0;  // where input k starts along the axis
  for (size_t k = 0; k < a.in.size(); ++k) {
    const AxisSplit in = split_at(a.in_shape(k), axis);
    for (int64_t o = 0; o < in.outer; ++o)
      for (int64_t i = 0; i < in.extent; ++i)
        for (int64_t r = 0; r < in.inner; ++r)
          y[(o * out.extent + begin + i) * out.inner + r] = a.in[k][(o * in.extent + i) * in.inner + r];
    begin += in.extent;
  }
  return y;
}

Buffer slice(const OpArgs& a) {
  const int64_t axis = axis_of(a);
  const int64_t start = a.n.attr_int("start");
  const AxisSplit in = split_at(a.in_shape(0), axis);
  const AxisSplit out = split_at(a.out_shape(), axis);
  Buffer y(static_cast<size_t>(out.outer * out.extent * out.inner));
  for (int64_t o = 0; o < out.outer; ++o)
    for (int64_t i = 0; i < out.extent; ++i)
      for (int64_t r = 0; r < out.inner; ++r)
        y[(o * out.extent + i) * out.inner + r] = a.in[0][(o * in.extent + start + i) * in.inner + r];
  return y;
}

}  // namespace kiln::ref
