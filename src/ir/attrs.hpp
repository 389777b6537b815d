// Typed views of op attributes (defaults applied), so backends do not each
// re-parse "strides"/"pads"/"dilations", axes or matmul/gather layouts.
#pragma once
#include "ir/graph.hpp"

namespace kiln {

struct ConvAttrs {
  int stride_h = 1, stride_w = 1;
  int pad_t = 0, pad_l = 0, pad_b = 0, pad_r = 0;
  int dil_h = 1, dil_w = 1;
  int groups = 1;
};

struct PoolAttrs {
  int kh = 1, kw = 1, stride_h = 1, stride_w = 1;
  int pad_t = 0, pad_l = 0, pad_b = 0, pad_r = 0;
  bool ceil_mode = false, count_include_pad = true;
};

// A shape seen as [outer, extent, inner] around one axis (0 <= axis < rank).
struct AxisSplit {
  int64_t outer = 1, extent = 1, inner = 1;
};
inline AxisSplit split_at(const Shape& s, int64_t axis) {
  AxisSplit a;
  for (int64_t d = 0; d < static_cast<int64_t>(s.size()); ++d) {
    if (d < axis) a.outer *= s[d];
    else if (d == axis) a.extent = s[d];
    else a.inner *= s[d];
  }
  return a;
}
// An "axis" attribute with negative values counted from the end (unchecked:
// shape rules check the range and name the node).
inline int64_t axis_attr(const Node& n, size_t rank, int64_t fallback) {
  const int64_t axis = n.attr_int("axis", fallback);
  return axis < 0 ? axis + static_cast<int64_t>(rank) : axis;
}

// top_k on x seen as [outer, extent, inner] around its (normalized) axis;
// the shape rule has checked k and the axis.
struct TopKAttrs {
  int64_t axis = 0, k = 1;
  int64_t outer = 1, extent = 1, inner = 1;
  bool largest = true;
};

inline TopKAttrs top_k_attrs(const Graph& g, const Node& n) {
  const Shape& x = g.values.at(n.inputs.at(0)).shape;
  TopKAttrs a;
  a.axis = axis_attr(n, x.size(), -1);
  a.k = n.attr_int("k");
  a.largest = n.attr_int("largest", 1) != 0;
  const AxisSplit s = split_at(x, a.axis);
  a.outer = s.outer, a.extent = s.extent, a.inner = s.inner;
  return a;
}

// softmax on x seen as [outer, extent, inner] around its axis.
inline AxisSplit softmax_split(const Graph& g, const Node& n) {
  const Shape& x = g.values.at(n.inputs.at(0)).shape;
  return split_at(x, axis_attr(n, x.size(), -1));
}

// matmul as `batch` products [m, k] x [k, n]; an operand that is 2-D is
// shared by every product (its stride between products is 0).
struct MatMulDims {
  int64_t batch = 1, m = 1, k = 1, n = 1;
  bool a_shared = false, b_shared = false;
  int64_t a_stride() const { return a_shared ? 0 : m * k; }
  int64_t b_stride() const { return b_shared ? 0 : k * n; }
};
inline MatMulDims matmul_dims(const Graph& g, const Node& n) {
  const Shape& a = g.values.at(n.inputs.at(0)).shape;
  const Shape& b = g.values.at(n.inputs.at(1)).shape;
  const Shape& y = g.values.at(n.outputs.at(0)).shape;
  MatMulDims d;
  d.m = a[a.size() - 2], d.k = a.back(), d.n = b.back();
  for (size_t i = 0; i + 2 < y.size(); ++i) d.batch *= y[i];
  d.a_shared = a.size() == 2 && y.size() > 2;
  d.b_shared = b.size() == 2 && y.size() > 2;
  return d;
}

// gather: x as [outer, extent, inner] around the axis, index as [outer, k].
// gather's extents: the index's rows (outer, each of k), x's rows around the
// axis; x_outer is 1 when x is shared by every index row (x.shape[:axis] all
// 1, the shape rule), else outer. Row o of the index reads x's row x_row(o).
struct GatherDims {
  int64_t outer = 1, extent = 1, inner = 1, k = 1, x_outer = 1;
  bool shared_x() const { return x_outer != outer; }
  int64_t x_row(int64_t o) const { return shared_x() ? 0 : o; }
};
inline GatherDims gather_dims(const Graph& g, const Node& n) {
  const Shape& x = g.values.at(n.inputs.at(0)).shape;
  const Shape& index = g.values.at(n.inputs.at(1)).shape;
  const int64_t axis = axis_attr(n, x.size(), 1);
  const AxisSplit s = split_at(x, axis);
  const AxisSplit is = split_at(index, axis);
  return {is.outer, s.extent, s.inner, index.at(static_cast<size_t>(axis)), s.outer};
}

// ms_deform_attn's extents and attributes (checked by the shape rule):
// value [n, s, heads, d], queries q, p sampling points per head, levels
// (h, w) with their first row in value's S axis.
struct DeformAttnDims {
  int64_t n = 1, s = 1, heads = 1, d = 1, q = 1, p = 1;
  std::vector<int64_t> level_h, level_w, level_start, points;
  double offset_scale = 0.5;
  bool discrete = false;
};
inline DeformAttnDims deform_attn_dims(const Graph& g, const Node& n) {
  const Shape& v = g.values.at(n.inputs.at(0)).shape;
  const Shape& r = g.values.at(n.inputs.at(1)).shape;
  DeformAttnDims d;
  d.n = v.at(0), d.s = v.at(1), d.heads = v.at(2), d.d = v.at(3), d.q = r.at(1);
  const std::vector<int64_t> hw = n.attr_ints("spatial_shapes");
  d.points = n.attr_ints("points");
  int64_t start = 0;
  d.p = 0;
  for (size_t l = 0; l + 1 < hw.size(); l += 2) {
    d.level_h.push_back(hw[l]);
    d.level_w.push_back(hw[l + 1]);
    d.level_start.push_back(start);
    start += hw[l] * hw[l + 1];
  }
  for (int64_t pl : d.points) d.p += pl;
  d.offset_scale = n.attr_float("offset_scale", 0.5);
  d.discrete = n.has_attr("method") && n.attr_str("method") == "discrete";
  return d;
}

// attention's extents (checked by the shape rule): q [n, lq, heads * d],
// k [n, lk, heads * d], v [n, lk, heads * dv].
struct AttentionDims {
  int64_t n = 1, lq = 1, lk = 1, heads = 1, d = 1, dv = 1;
  double scale = 1.0;
};
inline AttentionDims attention_dims(const Graph& g, const Node& n) {
  const Shape& q = g.values.at(n.inputs.at(0)).shape;
  const Shape& k = g.values.at(n.inputs.at(1)).shape;
  const Shape& v = g.values.at(n.inputs.at(2)).shape;
  AttentionDims a;
  a.heads = n.attr_int("heads");
  a.n = q.at(0), a.lq = q.at(1), a.lk = k.at(1), a.d = q.at(2) / a.heads, a.dv = v.at(2) / a.heads;
  a.scale = n.attr_float("scale", 1.0);
  return a;
}

// upsample_nearest's integer factors (checked by the shape rule).
struct UpsampleAttrs {
  int64_t sh = 1, sw = 1;
};
inline UpsampleAttrs upsample_attrs(const Node& n) {
  const auto s = n.attr_ints("scales");
  return {s.at(0), s.at(1)};
}

inline ConvAttrs conv_attrs(const Node& n) {
  auto s = n.has_attr("strides") ? n.attr_ints("strides") : std::vector<int64_t>{1, 1};
  auto p = n.has_attr("pads") ? n.attr_ints("pads") : std::vector<int64_t>{0, 0, 0, 0};
  auto d = n.has_attr("dilations") ? n.attr_ints("dilations") : std::vector<int64_t>{1, 1};
  ConvAttrs a;
  a.stride_h = static_cast<int>(s.at(0)), a.stride_w = static_cast<int>(s.at(1));
  a.pad_t = static_cast<int>(p.at(0)), a.pad_l = static_cast<int>(p.at(1));
  a.pad_b = static_cast<int>(p.at(2)), a.pad_r = static_cast<int>(p.at(3));
  a.dil_h = static_cast<int>(d.at(0)), a.dil_w = static_cast<int>(d.at(1));
  a.groups = static_cast<int>(n.attr_int("groups", 1));
  return a;
}

inline PoolAttrs pool_attrs(const Node& n) {
  auto k = n.attr_ints("kernel");
  auto s = n.has_attr("strides") ? n.attr_ints("strides") : k;
  auto p = n.has_attr("pads") ? n.attr_ints("pads") : std::vector<int64_t>{0, 0, 0, 0};
  PoolAttrs a;
  a.kh = static_cast<int>(k.at(0)), a.kw = static_cast<int>(k.at(1));
  a.stride_h = static_cast<int>(s.at(0)), a.stride_w = static_cast<int>(s.at(1));
  a.pad_t = static_cast<int>(p.at(0)), a.pad_l = static_cast<int>(p.at(1));
  a.pad_b = static_cast<int>(p.at(2)), a.pad_r = static_cast<int>(p.at(3));
  a.ceil_mode = n.attr_int("ceil_mode", 0) != 0;
  a.count_include_pad = n.attr_int("count_include_pad", 1) != 0;
  return a;
}

}  // namespace kiln
