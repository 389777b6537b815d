// Shape and dtype rules, one per op. Errors name the node and the offending
// input so a family bug shows up as "layer3.0.conv2: ..." rather than a crash.
#include <algorithm>

#include "core/error.hpp"
#include "core/window.hpp"
#include "ir/graph.hpp"

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

Shape infer_linear(const Graph& g, const Node& n) {
  const Value& x = input(g, n, 0);
  const Value& w = input(g, n, 1);
  expect_rank(n, x, 2);
  expect_rank(n, w, 2);
  if (w.shape[1] != x.shape[1])
    fail_input(n.name, ": weight ", shape_str(w.shape), " does not fit input ", shape_str(x.shape));
  if (n.inputs.size() > 2 && input(g, n, 2).shape != Shape{w.shape[0]})
    fail_input(n.name, ": bias shape ", shape_str(input(g, n, 2).shape), " != [", w.shape[0], "]");
  return {x.shape[0], w.shape[0]};
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
  fail_input(n.name, ": shapes ", shape_str(a.shape), " and ", shape_str(b.shape), " do not match");
}

int64_t norm_axis(const Node& n, int64_t axis, size_t rank) {
  const int64_t given = axis;
  if (axis < 0) axis += static_cast<int64_t>(rank);
  if (axis < 0 || axis >= static_cast<int64_t>(rank))
    fail_input(n.name, ": axis ", given, " out of range for rank ", rank);
  return axis;
}

Shape infer_concat(const Graph& g, const Node& n) {
  expect_same_dtype(g, n);
  Shape y = input(g, n, 0).shape;
  int64_t axis = norm_axis(n, n.attr_int("axis"), y.size());
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
  int64_t axis = norm_axis(n, n.attr_int("axis"), y.size());
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

std::vector<ValueType> op_rule(const Graph& g, const Node& n) {
  const Value& x = input(g, n, 0);
  ValueType one{x.dtype, {}};  // ops with one output: x's dtype unless the rule says otherwise
  switch (n.op) {
    case Op::TopK: return infer_top_k(g, n);
    case Op::Conv2d: one.shape = infer_conv(g, n); break;
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
    case Op::Linear: one.shape = infer_linear(g, n); break;
    case Op::Concat: one.shape = infer_concat(g, n); break;
    case Op::Slice: one.shape = infer_slice(g, n); break;
    case Op::Cast: {
      auto t = dtype_from_name(n.attr_str("dtype"));
      if (!t) fail_input(n.name, ": unknown dtype '", n.attr_str("dtype"), "'");
      one.dtype = *t;
      one.shape = x.shape;
      break;
    }
    default: fail_input(n.name, ": no shape rule for op ", op_name(n.op));
  }
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
