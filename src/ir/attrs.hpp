// Typed views of op attributes (defaults applied), so backends do not each
// re-parse "strides"/"pads"/"dilations" or top_k's axis.
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
  a.axis = n.attr_int("axis", -1);
  if (a.axis < 0) a.axis += static_cast<int64_t>(x.size());
  a.k = n.attr_int("k");
  a.largest = n.attr_int("largest", 1) != 0;
  for (int64_t d = 0; d < static_cast<int64_t>(x.size()); ++d) {
    if (d < a.axis) a.outer *= x[d];
    else if (d == a.axis) a.extent = x[d];
    else a.inner *= x[d];
  }
  return a;
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
