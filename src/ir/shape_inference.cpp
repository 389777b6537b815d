// Shape and dtype rules, one per op. Errors name the node and the offending
// input so a family bug shows up as "layer3.0.conv2: ..." rather than a crash.
#include <algorithm>
#include <cmath>

#include "core/broadcast.hpp"
#include "core/error.hpp"
#include "core/window.hpp"
#include "ir/graph.hpp"
#include "ir/quant_form.hpp"

namespace kiln {

namespace {

// Validates one axis of a window op, then applies the shared size rule.
int64_t checked_out_dim(const Node& n, int64_t in, int64_t k, int64_t stride, int64_t pad_begin, int64_t pad_end,
                        int64_t dilation, bool ceil_mode) {
  if (stride <= 0 || k <= 0 || dilation <= 0) fail_input(n.name, ": kernel, stride and dilation must be positive");
  // Graphs loaded from a bundle carry any integers; bounding every term keeps
  // the window arithmetic below (and the kernels' index math) inside int64.
  constexpr int64_t kMax = int64_t{1} << 31;
  if (pad_begin < 0 || pad_end < 0) fail_input(n.name, ": pads must be non-negative, got ", pad_begin, " and ", pad_end);
  if (in > kMax || k > kMax || stride > kMax || dilation > kMax || pad_begin > kMax || pad_end > kMax)
    fail_input(n.name, ": kernel, stride, dilation or pad larger than 2^31");
  if (in + pad_begin + pad_end - dilation * (k - 1) - 1 < 0)
    fail_input(n.name, ": window ", k, " larger than padded input ", in + pad_begin + pad_end);
  return window_out_dim(in, k, stride, pad_begin, pad_end, dilation, ceil_mode);
}

const Value& input(const Graph& g, const Node& n, size_t i) { return g.values.at(n.inputs.at(i)); }

void expect_rank(const Node& n, const Value& v, size_t rank) {
  if (v.shape.size() != rank)
    fail_input(n.name, ": input '", v.name, "' has shape ", shape_str(v.shape), ", expected rank ", rank);
}

std::vector<int64_t> ints_or(const Node& n, const char* key, std::vector<int64_t> fallback, size_t len) {
  std::vector<int64_t> v = n.has_attr(key) ? n.attr_ints(key) : fallback;
  if (v.size() != len) fail_input(n.name, ": attribute '", key, "' must have ", len, " values");
  return v;
}

Shape infer_conv(const Graph& g, const Node& n) {
  const Value& x = input(g, n, 0);
  const Value& w = input(g, n, 1);
  expect_rank(n, x, 4);
  expect_rank(n, w, 4);
  auto s = ints_or(n, "strides", {1, 1}, 2);
  auto p = ints_or(n, "pads", {0, 0, 0, 0}, 4);
  auto d = ints_or(n, "dilations", {1, 1}, 2);
  int64_t groups = n.attr_int("groups", 1);
  if (groups <= 0 || x.shape[1] % groups || w.shape[0] % groups || w.shape[1] * groups != x.shape[1])
    fail_input(n.name, ": weight ", shape_str(w.shape), " does not fit input ", shape_str(x.shape), " with groups=", groups);
  Shape y = {x.shape[0], w.shape[0], checked_out_dim(n, x.shape[2], w.shape[2], s[0], p[0], p[2], d[0], false),
             checked_out_dim(n, x.shape[3], w.shape[3], s[1], p[1], p[3], d[1], false)};
  if (n.inputs.size() > 2) {
    const Value& b = input(g, n, 2);
    if (b.shape != Shape{w.shape[0]}) fail_input(n.name, ": bias shape ", shape_str(b.shape), " != [", w.shape[0], "]");
  }
  if (n.inputs.size() > 3 && input(g, n, 3).shape != y)
    fail_input(n.name, ": residual shape ", shape_str(input(g, n, 3).shape), " != output ", shape_str(y));
  return y;
}

Shape infer_pool(const Graph& g, const Node& n) {
  const Value& x = input(g, n, 0);
  expect_rank(n, x, 4);
  auto k = ints_or(n, "kernel", {}, 2);
  auto s = ints_or(n, "strides", k, 2);
  auto p = ints_or(n, "pads", {0, 0, 0, 0}, 4);
  bool ceil_mode = n.attr_int("ceil_mode", 0) != 0;
  return {x.shape[0], x.shape[1], checked_out_dim(n, x.shape[2], k[0], s[0], p[0], p[2], 1, ceil_mode),
          checked_out_dim(n, x.shape[3], k[1], s[1], p[1], p[3], 1, ceil_mode)};
}

Shape infer_batch_norm(const Graph& g, const Node& n) {
  const Value& x = input(g, n, 0);
  if (x.shape.size() < 2) fail_input(n.name, ": batch_norm needs a channel dimension");
  for (size_t i = 1; i < 5; ++i)
    if (input(g, n, i).shape != Shape{x.shape[1]})
      fail_input(n.name, ": parameter '", input(g, n, i).name, "' has shape ", shape_str(input(g, n, i).shape),
                 ", expected [", x.shape[1], "]");
  return x.shape;
}

void expect_min_rank(const Node& n, const Value& v, size_t rank) {
  if (v.shape.size() < rank)
    fail_input(n.name, ": input '", v.name, "' has shape ", shape_str(v.shape), ", expected rank >= ", rank);
}

// linear on the last axis: x[..., K] -> [..., M] (rank 2 is the classifier's [N, K]).
Shape infer_linear(const Graph& g, const Node& n) {
  const Value& x = input(g, n, 0);
  const Value& w = input(g, n, 1);
  expect_min_rank(n, x, 2);
  expect_rank(n, w, 2);
  if (w.shape[1] != x.shape.back())
    fail_input(n.name, ": weight ", shape_str(w.shape), " does not fit input ", shape_str(x.shape));
  if (n.inputs.size() > 2 && input(g, n, 2).shape != Shape{w.shape[0]})
    fail_input(n.name, ": bias shape ", shape_str(input(g, n, 2).shape), " != [", w.shape[0], "]");
  Shape y = x.shape;
  y.back() = w.shape[0];
  return y;
}

// Ops that combine activations elementwise need one dtype: the output takes
// input 0's, so an i32 + f32 add would silently reinterpret.
void expect_same_dtype(const Graph& g, const Node& n) {
  for (size_t i = 1; i < n.inputs.size(); ++i)
    if (input(g, n, i).dtype != input(g, n, 0).dtype)
      fail_input(n.name, ": input '", input(g, n, i).name, "' is ", dtype_name(input(g, n, i).dtype), ", input '",
                 input(g, n, 0).name, "' is ", dtype_name(input(g, n, 0).dtype));
}

Shape infer_binary(const Graph& g, const Node& n) {
  const Value& a = input(g, n, 0);
  const Value& b = input(g, n, 1);
  expect_same_dtype(g, n);
  if (a.shape == b.shape) return a.shape;
  // mul also allows a per-channel scale [N,C,1,1] (squeeze-excitation).
  if (n.op == Op::Mul && a.shape.size() == 4 && b.shape == Shape{a.shape[0], a.shape[1], 1, 1}) return a.shape;
  // A constant second operand may repeat per image (core/broadcast.hpp).
  if (b.constant && broadcasts_per_image(b.shape, a.shape)) return a.shape;
  fail_input(n.name, ": shapes ", shape_str(a.shape), " and ", shape_str(b.shape), " do not match",
             b.constant ? " (a constant operand broadcasts over the batch only with extent 1 on axis 0 and on each other axis 1 or the input's)" : "");
}

int64_t norm_axis(const Node& n, int64_t axis, size_t rank) {
  const int64_t given = axis;
  if (axis < 0) axis += static_cast<int64_t>(rank);
  if (axis < 0 || axis >= static_cast<int64_t>(rank))
    fail_input(n.name, ": axis ", given, " out of range for rank ", rank);
  return axis;
}

int64_t non_batch_axis(const Node& n, int64_t axis, size_t rank) {
  const int64_t a = norm_axis(n, axis, rank);
  if (a == 0)
    fail_input(n.name, ": ", op_name(n.op), " along axis 0, the batch axis, is not supported (images of a batch are "
               "independent); axis ", axis, " of rank ", rank);
  return a;
}

Shape infer_concat(const Graph& g, const Node& n) {
  expect_same_dtype(g, n);
  Shape y = input(g, n, 0).shape;
  // Axis 0 is the batch: only a concat of constants (no batch) may join along it.
  bool constants = true;
  for (int in : n.inputs) constants &= g.is_constant(in);
  int64_t axis = constants ? norm_axis(n, n.attr_int("axis"), y.size()) : non_batch_axis(n, n.attr_int("axis"), y.size());
  for (size_t i = 1; i < n.inputs.size(); ++i) {
    const Shape& s = input(g, n, i).shape;
    bool ok = s.size() == y.size();
    for (size_t d = 0; ok && d < s.size(); ++d) ok = static_cast<int64_t>(d) == axis || s[d] == y[d];
    if (!ok) fail_input(n.name, ": input ", i, " shape ", shape_str(s), " does not concat with ", shape_str(y));
    y[axis] += s[axis];
  }
  return y;
}

Shape infer_slice(const Graph& g, const Node& n) {
  Shape y = input(g, n, 0).shape;
  // Axis 0 is the batch: only a constant (no batch) may be sliced along it.
  int64_t axis = g.is_constant(n.inputs.at(0)) ? norm_axis(n, n.attr_int("axis"), y.size())
                                               : non_batch_axis(n, n.attr_int("axis"), y.size());
  int64_t start = n.attr_int("start"), end = n.attr_int("end");
  if (start < 0 || end > y[axis] || start >= end) fail_input(n.name, ": slice [", start, ",", end, ") out of range");
  y[axis] = end - start;
  return y;
}

// top_k: values (x's dtype) and indices (i64), both x's shape with extent k
// along the axis.
std::vector<ValueType> infer_top_k(const Graph& g, const Node& n) {
  const Value& x = input(g, n, 0);
  if (x.shape.empty()) fail_input(n.name, ": top_k of rank-0 input '", x.name, "'");
  const int64_t axis = norm_axis(n, n.attr_int("axis", -1), x.shape.size());
  const int64_t k = n.attr_int("k"), extent = x.shape[axis];
  if (k < 1) fail_input(n.name, ": top_k needs k >= 1, got k = ", k);
  if (k > extent)
    fail_input(n.name, ": k = ", k, " is larger than the extent ", extent, " of axis ", axis, " of input '", x.name, "' ",
               shape_str(x.shape));
  for (const char* flag : {"largest", "sorted"}) {
    const int64_t v = n.attr_int(flag, 1);
    if (v != 0 && v != 1) fail_input(n.name, ": attribute '", flag, "' must be 0 or 1, got ", v);
  }
  // torch.topk(sorted=False) leaves the order to the kernel; kiln has no
  // kernel that gains from it yet, and an unspecified order would make
  // backends disagree, so it is refused rather than silently sorted.
  if (n.attr_int("sorted", 1) == 0)
    fail_input(n.name, ": top_k with sorted=0 is not supported (results are always sorted; set sorted=1)");
  Shape y = x.shape;
  y[axis] = k;
  return {{x.dtype, y}, {DType::I64, y}};
}

// A finite, non-negative float attribute (eps).
double eps_attr(const Node& n, double fallback) {
  const double eps = n.attr_float("eps", fallback);
  if (!(eps >= 0) || !std::isfinite(eps)) fail_input(n.name, ": attribute 'eps' must be finite and >= 0, got ", eps);
  return eps;
}

std::vector<int64_t> required_ints(const Node& n, const char* key) {
  if (!n.has_attr(key)) fail_input(n.name, ": ", op_name(n.op), " needs attribute '", key, "'");
  return n.attr_ints(key);
}

// The batch is axis 0 of every value; an op that reduces or gathers along an
// axis may not take it (one image's result would depend on the others').

Shape infer_layer_norm(const Graph& g, const Node& n) {
  const Value& x = input(g, n, 0);
  // Rank 1 would normalize over the batch axis.
  expect_min_rank(n, x, 2);
  const int64_t c = x.shape.back();
  if (c < 1) fail_input(n.name, ": layer_norm over an empty last axis of '", x.name, "' ", shape_str(x.shape));
  for (size_t i = 1; i < n.inputs.size(); ++i)
    if (input(g, n, i).shape != Shape{c})
      fail_input(n.name, ": ", i == 1 ? "weight" : "bias", " '", input(g, n, i).name, "' has shape ",
                 shape_str(input(g, n, i).shape), ", expected [", c, "] (the last axis of ", shape_str(x.shape), ")");
  eps_attr(n, 1e-5);
  return x.shape;
}

Shape infer_softmax(const Graph& g, const Node& n) {
  const Value& x = input(g, n, 0);
  non_batch_axis(n, n.attr_int("axis", -1), x.shape.size());
  return x.shape;
}

// [..., M, K] x [..., K, N]: equal leading dims, or a 2-D operand shared by all.
Shape infer_matmul(const Graph& g, const Node& n) {
  const Value& a = input(g, n, 0);
  const Value& b = input(g, n, 1);
  expect_same_dtype(g, n);
  expect_min_rank(n, a, 2);
  expect_min_rank(n, b, 2);
  const size_t ra = a.shape.size(), rb = b.shape.size();
  if (a.shape[ra - 1] != b.shape[rb - 2])
    fail_input(n.name, ": matmul of ", shape_str(a.shape), " and ", shape_str(b.shape), ": inner extents ", a.shape[ra - 1],
               " and ", b.shape[rb - 2], " differ");
  const Shape lead_a(a.shape.begin(), a.shape.end() - 2), lead_b(b.shape.begin(), b.shape.end() - 2);
  if (!lead_a.empty() && !lead_b.empty() && lead_a != lead_b)
    fail_input(n.name, ": matmul of ", shape_str(a.shape), " and ", shape_str(b.shape), ": leading dims ",
               shape_str(lead_a), " and ", shape_str(lead_b),
               " differ (matmul takes equal leading dims, or a 2-D operand shared by every leading index; "
               "broadcast explicitly otherwise)");
  Shape y = lead_a.empty() ? lead_b : lead_a;
  y.push_back(a.shape[ra - 2]);
  y.push_back(b.shape[rb - 1]);
  return y;
}

Shape infer_transpose(const Graph& g, const Node& n) {
  const Value& x = input(g, n, 0);
  const std::vector<int64_t> perm = required_ints(n, "perm");
  if (x.shape.empty()) fail_input(n.name, ": transpose of rank-0 input '", x.name, "'");
  std::vector<char> seen(x.shape.size(), 0);
  bool ok = perm.size() == x.shape.size();
  for (size_t i = 0; ok && i < perm.size(); ++i) {
    ok = perm[i] >= 0 && perm[i] < static_cast<int64_t>(perm.size()) && !seen[perm[i]];
    if (ok) seen[perm[i]] = 1;
  }
  if (!ok) fail_input(n.name, ": perm ", shape_str(perm), " is not a permutation of the ", x.shape.size(), " axes of ", shape_str(x.shape));
  if (perm[0] != 0)
    fail_input(n.name, ": perm ", shape_str(perm), " moves axis 0, the batch axis (perm[0] must be 0: graphs are "
               "re-shaped per batch along axis 0)");
  Shape y(perm.size());
  for (size_t i = 0; i < perm.size(); ++i) y[i] = x.shape[perm[i]];
  return y;
}

// shape[0] = -1 is the batch (x's axis 0); shape[1:] lays out each image's
// elements, with at most one -1 inferred.
Shape infer_reshape(const Graph& g, const Node& n) {
  const Value& x = input(g, n, 0);
  const std::vector<int64_t> shape = required_ints(n, "shape");
  if (x.shape.empty()) fail_input(n.name, ": reshape of rank-0 input '", x.name, "' (it has no batch axis)");
  if (shape.empty() || shape.size() > kMaxRank)
    fail_input(n.name, ": reshape target ", shape_str(shape), " must have rank 1..", kMaxRank);
  if (shape[0] != -1)
    fail_input(n.name, ": reshape target ", shape_str(shape), ": shape[0] must be -1, which stands for the batch (axis 0 "
               "is kept: graphs are re-shaped per batch), got ", shape[0]);
  int64_t per_image = 1;
  for (size_t d = 1; d < x.shape.size(); ++d) per_image *= x.shape[d];
  int64_t known = 1, infer_at = -1;
  for (size_t d = 1; d < shape.size(); ++d) {
    if (shape[d] == -1) {
      if (infer_at >= 0) fail_input(n.name, ": reshape target ", shape_str(shape), " has more than one -1 after the batch");
      infer_at = static_cast<int64_t>(d);
    } else if (shape[d] < 0) {
      fail_input(n.name, ": reshape target ", shape_str(shape), " has extent ", shape[d]);
    } else {
      known *= shape[d];
    }
  }
  Shape y = shape;
  y[0] = x.shape[0];
  if (infer_at >= 0) {
    if (known == 0 || per_image % known != 0)
      fail_input(n.name, ": reshape of ", shape_str(x.shape), " to ", shape_str(shape), ": ", per_image,
                 " elements per image do not fill the known extents (", known, ")");
    y[infer_at] = per_image / known;
  } else if (known != per_image) {
    fail_input(n.name, ": reshape of ", shape_str(x.shape), " to ", shape_str(shape), ": ", per_image,
               " elements per image, the target holds ", known);
  }
  return y;
}

Shape infer_upsample_nearest(const Graph& g, const Node& n) {
  const Value& x = input(g, n, 0);
  expect_rank(n, x, 4);
  const std::vector<int64_t> s = required_ints(n, "scales");
  constexpr int64_t kMax = int64_t{1} << 31;
  if (s.size() != 2 || s[0] < 1 || s[1] < 1 || s[0] > kMax || s[1] > kMax)
    fail_input(n.name, ": attribute 'scales' must be two integers >= 1 (height, width), got ", shape_str(s));
  if (x.shape[2] * s[0] > kMax || x.shape[3] * s[1] > kMax) fail_input(n.name, ": upsampled size above 2^31");
  return {x.shape[0], x.shape[1], x.shape[2] * s[0], x.shape[3] * s[1]};
}

Shape infer_gather(const Graph& g, const Node& n) {
  const Value& x = input(g, n, 0);
  const Value& index = input(g, n, 1);
  expect_min_rank(n, x, 2);
  const int64_t axis = non_batch_axis(n, n.attr_int("axis", 1), x.shape.size());
  if (index.dtype != DType::I64 && index.dtype != DType::I32)
    fail_input(n.name, ": index '", index.name, "' is ", dtype_name(index.dtype), ", expected i64 or i32");
  Shape want(x.shape.begin(), x.shape.begin() + axis);  // index: x.shape[:axis] + [K]
  // ... or any leading dims when x's are all 1: x shared by every index row (a constant table, e.g. RT-DETR's anchors).
  const bool shared = std::all_of(want.begin(), want.end(), [](int64_t d) { return d == 1; });
  const bool ok = index.shape.size() == static_cast<size_t>(axis) + 1 &&
                  (shared || std::equal(want.begin(), want.end(), index.shape.begin()));
  if (!ok) {
    want.push_back(-1);
    fail_input(n.name, ": index '", index.name, "' has shape ", shape_str(index.shape), "; gather along axis ", axis,
               " of ", shape_str(x.shape), " takes an index of shape ", shape_str(want), " (-1: any count)");
  }
  Shape y = index.shape;
  y.insert(y.end(), x.shape.begin() + axis + 1, x.shape.end());
  return y;
}

// ms_deform_attn: value [N,S,H,D], ref [N,Q,4], offsets [N,Q,H,P,2], logits
// [N,Q,H,P] -> [N,Q,H*D]; S must be the sum of the levels' h*w and P the sum of
// the points, so a checkpoint whose config disagrees with its tensors is named.
Shape infer_attention(const Graph& g, const Node& n) {
  const Value& q = input(g, n, 0);
  const Value& k = input(g, n, 1);
  const Value& v = input(g, n, 2);
  expect_same_dtype(g, n);
  if (!dtype_is_float(q.dtype)) fail_input(n.name, ": attention takes float tokens, '", q.name, "' is ", dtype_name(q.dtype));
  expect_rank(n, q, 3);
  expect_rank(n, k, 3);
  expect_rank(n, v, 3);
  if (!n.has_attr("heads")) fail_input(n.name, ": attention needs attribute 'heads'");
  const int64_t heads = n.attr_int("heads");
  if (heads < 1 || heads > 4096) fail_input(n.name, ": attribute 'heads' ", heads, " (must be 1..4096)");
  if (k.shape[0] != q.shape[0] || v.shape[0] != q.shape[0] || v.shape[1] != k.shape[1])
    fail_input(n.name, ": q ", shape_str(q.shape), ", k ", shape_str(k.shape), ", v ", shape_str(v.shape),
               " (want q [N, Lq, H*D], k [N, Lk, H*D], v [N, Lk, H*Dv])");
  if (q.shape[2] % heads != 0 || v.shape[2] % heads != 0 || k.shape[2] != q.shape[2])
    fail_input(n.name, ": q '", q.name, "' ", shape_str(q.shape), ", k '", k.name, "' ", shape_str(k.shape), " and v '", v.name,
               "' ", shape_str(v.shape), " do not split into ", heads, " heads of one width");
  if (q.shape[1] < 1 || k.shape[1] < 1 || q.shape[2] < 1 || v.shape[2] < 1)
    fail_input(n.name, ": attention over an empty axis (q ", shape_str(q.shape), ", k ", shape_str(k.shape), ")");
  const double scale = n.attr_float("scale", 1.0);
  if (!std::isfinite(scale)) fail_input(n.name, ": attribute 'scale' must be finite, got ", scale);
  return {q.shape[0], q.shape[1], v.shape[2]};
}

Shape infer_ms_deform_attn(const Graph& g, const Node& n) {
  const Value& v = input(g, n, 0);
  const Value& r = input(g, n, 1);
  const Value& off = input(g, n, 2);
  const Value& w = input(g, n, 3);
  expect_same_dtype(g, n);
  if (!dtype_is_float(v.dtype)) fail_input(n.name, ": ms_deform_attn takes float values, '", v.name, "' is ", dtype_name(v.dtype));
  expect_rank(n, v, 4);
  expect_rank(n, r, 3);
  expect_rank(n, off, 5);
  expect_rank(n, w, 4);
  const std::vector<int64_t> hw = required_ints(n, "spatial_shapes");
  const std::vector<int64_t> points = required_ints(n, "points");
  if (hw.empty() || hw.size() % 2 != 0)
    fail_input(n.name, ": attribute 'spatial_shapes' must hold (h, w) per level, got ", shape_str(hw));
  if (points.size() * 2 != hw.size())
    fail_input(n.name, ": attribute 'points' ", shape_str(points), " must give one count per level of 'spatial_shapes' ",
               shape_str(hw));
  constexpr int64_t kMax = int64_t{1} << 31;
  int64_t s = 0, p = 0;
  for (int64_t e : hw) {
    if (e < 1 || e > kMax) fail_input(n.name, ": level extent ", e, " in 'spatial_shapes' ", shape_str(hw), " (must be 1..2^31)");
  }
  for (size_t l = 0; l < points.size(); ++l) {
    if (points[l] < 1 || points[l] > 4096) fail_input(n.name, ": points ", points[l], " of level ", l, " (must be 1..4096)");
    s += hw[2 * l] * hw[2 * l + 1];
    p += points[l];
  }
  const int64_t batch = v.shape[0], heads = v.shape[2], q = r.shape[1];
  if (v.shape[1] != s)
    fail_input(n.name, ": value '", v.name, "' ", shape_str(v.shape), " has ", v.shape[1], " positions, the levels ",
               shape_str(hw), " hold ", s);
  if (r.shape != Shape{batch, q, 4})
    fail_input(n.name, ": reference boxes '", r.name, "' ", shape_str(r.shape), ", expected [", batch, ", Q, 4]");
  if (off.shape != Shape{batch, q, heads, p, 2})
    fail_input(n.name, ": offsets '", off.name, "' ", shape_str(off.shape), ", expected ",
               shape_str(Shape{batch, q, heads, p, 2}), " (N, Q, heads, points, 2)");
  if (w.shape != Shape{batch, q, heads, p})
    fail_input(n.name, ": attention logits '", w.name, "' ", shape_str(w.shape), ", expected ",
               shape_str(Shape{batch, q, heads, p}), " (N, Q, heads, points)");
  const double os = n.attr_float("offset_scale", 0.5);
  if (!std::isfinite(os)) fail_input(n.name, ": attribute 'offset_scale' must be finite, got ", os);
  if (n.has_attr("method") && n.attr_str("method") != "default" && n.attr_str("method") != "discrete")
    fail_input(n.name, ": method '", n.attr_str("method"), "' (ms_deform_attn knows 'default' and 'discrete')");
  return {batch, q, heads * v.shape[3]};
}

// conv2d / linear output dtype. A quantized layer (x 8-bit) takes a weight of
// x's code type and names its output type in out_dtype: a wide float, or x's
// code type when the output quantize is folded into the layer.
DType layer_dtype(const Graph& g, const Node& n) {
  const Value& x = input(g, n, 0);
  const Value& w = input(g, n, 1);
  if (!is_8bit(x.dtype)) {
    if (is_8bit(w.dtype))
      fail_input(n.name, ": weight '", w.name, "' is ", dtype_name(w.dtype), " but input '", x.name, "' is ", dtype_name(x.dtype),
                 " (an 8-bit layer reads an 8-bit input)");
    if (n.has_attr("out_dtype")) fail_input(n.name, ": out_dtype is only for quantized layers (8-bit input)");
    return x.dtype;
  }
  if (w.dtype != x.dtype)
    fail_input(n.name, ": quantized layer input '", x.name, "' is ", dtype_name(x.dtype), " but weight '", w.name, "' is ",
               dtype_name(w.dtype));
  if (!n.has_attr("out_dtype")) fail_input(n.name, ": quantized layer without attribute out_dtype");
  const auto t = dtype_from_name(n.attr_str("out_dtype"));
  if (!t || !(is_wide_float(*t) || *t == x.dtype))
    fail_input(n.name, ": out_dtype '", n.attr_str("out_dtype"), "' must be f32, f16, bf16 or ", dtype_name(x.dtype));
  return *t;
}

// max_pool2d / mul / add / concat / slice: the input type, or with attr out_dtype the
// code type they write (ir/quant_form.hpp can_write_codes) from wide inputs.
DType producer_dtype(const Node& n, DType in) {
  if (!n.has_attr("out_dtype")) return in;
  const auto t = dtype_from_name(n.attr_str("out_dtype"));
  if (!t || !is_8bit(*t))
    fail_input(n.name, ": out_dtype '", n.attr_str("out_dtype"), "' of a ", op_name(n.op),
               " must be f8e4m3 or i8 (the codes it writes; without it the output has the inputs' type)");
  if (!is_wide_float(in))
    fail_input(n.name, ": a ", op_name(n.op), " writing ", dtype_name(*t), " codes reads f32, f16 or bf16, not ", dtype_name(in));
  return *t;
}

// quantize (wide -> codes) and dequantize (codes -> wide): the dtype attr.
DType qdq_dtype(const Graph& g, const Node& n) {
  const Value& x = input(g, n, 0);
  const auto t = dtype_from_name(n.attr_str("dtype"));
  if (n.op == Op::Quantize) {
    if (!is_wide_float(x.dtype)) fail_input(n.name, ": quantize input '", x.name, "' is ", dtype_name(x.dtype), " (f32, f16 or bf16)");
    if (!t || !is_8bit(*t)) fail_input(n.name, ": quantize dtype '", n.attr_str("dtype"), "' must be f8e4m3 or i8");
  } else {
    if (!is_8bit(x.dtype)) fail_input(n.name, ": dequantize input '", x.name, "' is ", dtype_name(x.dtype), " (f8e4m3 or i8)");
    if (!t || !is_wide_float(*t)) fail_input(n.name, ": dequantize dtype '", n.attr_str("dtype"), "' must be f32, f16 or bf16");
  }
  return *t;
}

std::vector<ValueType> op_rule(const Graph& g, const Node& n) {
  const Value& x = input(g, n, 0);
  ValueType one{x.dtype, {}};  // ops with one output: x's dtype unless the rule says otherwise
  switch (n.op) {
    case Op::TopK: return infer_top_k(g, n);
    case Op::Conv2d:
      one.shape = infer_conv(g, n);
      one.dtype = layer_dtype(g, n);
      break;
    case Op::BatchNorm: one.shape = infer_batch_norm(g, n); break;
    case Op::Activation: one.shape = x.shape; break;
    case Op::Add:
    case Op::Mul: one.shape = infer_binary(g, n); break;
    case Op::MaxPool2d:
    case Op::AvgPool2d: one.shape = infer_pool(g, n); break;
    case Op::GlobalAvgPool:
      expect_rank(n, x, 4);
      one.shape = {x.shape[0], x.shape[1], 1, 1};
      break;
    case Op::Flatten:
      // [N, ...] -> [N, prod(...)]; rank 1 gives [N, 1]. A rank-0 value has no batch axis.
      if (x.shape.empty()) fail_input(n.name, ": flatten of rank-0 input '", x.name, "'");
      one.shape = {x.shape[0], x.shape[0] == 0 ? 0 : shape_numel(x.shape) / x.shape[0]};
      break;
    case Op::Linear:
      one.shape = infer_linear(g, n);
      one.dtype = layer_dtype(g, n);
      break;
    case Op::Quantize:
    case Op::Dequantize:
      one.dtype = qdq_dtype(g, n);
      one.shape = x.shape;
      break;
    case Op::Concat: one.shape = infer_concat(g, n); break;
    case Op::Slice: one.shape = infer_slice(g, n); break;
    case Op::Cast: {
      auto t = dtype_from_name(n.attr_str("dtype"));
      if (!t) fail_input(n.name, ": unknown dtype '", n.attr_str("dtype"), "'");
      one.dtype = *t;
      one.shape = x.shape;
      break;
    }
    case Op::LayerNorm: one.shape = infer_layer_norm(g, n); break;
    case Op::Softmax: one.shape = infer_softmax(g, n); break;
    case Op::MatMul: one.shape = infer_matmul(g, n); break;
    case Op::Transpose: one.shape = infer_transpose(g, n); break;
    case Op::Reshape: one.shape = infer_reshape(g, n); break;
    case Op::UpsampleNearest: one.shape = infer_upsample_nearest(g, n); break;
    case Op::Gather: one.shape = infer_gather(g, n); break;
    case Op::MsDeformAttn: one.shape = infer_ms_deform_attn(g, n); break;
    case Op::Attention: one.shape = infer_attention(g, n); break;
    case Op::InverseSigmoid:
      eps_attr(n, 1e-5);
      one.shape = x.shape;
      break;
    default: fail_input(n.name, ": no shape rule for op ", op_name(n.op));
  }
  if (can_write_codes(n.op)) one.dtype = producer_dtype(n, x.dtype);
  return {one};
}

}  // namespace

std::vector<ValueType> infer_outputs(const Graph& g, const Node& n) {
  if (const std::string why = input_count_problem(n.op, n.inputs.size()); !why.empty()) fail_input(n.name, ": ", why);
  std::vector<ValueType> types = op_rule(g, n);
  // A rule that disagrees with ops.def is a kiln bug, not a bad graph.
  if (const std::string why = output_count_problem(n.op, types.size()); !why.empty())
    fail_runtime(n.name, ": the shape rule disagrees with ops.def: ", why);
  return types;
}

}  // namespace kiln
