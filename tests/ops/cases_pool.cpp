// max_pool2d, avg_pool2d and global_avg_pool cases: the stem pool, ResNet-D's
// 2x2 ceil_mode average (count_include_pad off), Res2Net's 3x3 pass-through
// average, TF "same" asymmetric pads, non-square kernels and strides, ceil_mode
// windows cut at the end padding, 1x1 maps.
#include "op_harness.hpp"

namespace kiln::ops {

namespace {

struct PoolSpec {
  const char* tag;
  int64_t n, c, h, w;
  std::vector<int64_t> kernel, strides, pads;
  bool ceil_mode, count_include_pad;
};

OpCase pool_case(Op op, const PoolSpec& s, DType dt) {
  OpCase c;
  c.name = std::string(op_name(op)) + "_" + s.tag + "_" + dtype_name(dt);
  c.group = op_name(op);
  c.dtype = dt;
  CaseBuilder b(c.name, dt);
  const int x = b.input("x", {s.n, s.c, s.h, s.w});
  Attrs a = {{"kernel", s.kernel}, {"strides", s.strides}, {"pads", s.pads}, {"ceil_mode", int64_t(s.ceil_mode)}};
  if (op == Op::AvgPool2d) a["count_include_pad"] = int64_t(s.count_include_pad);
  c.graph = b.finish(b.node(op, "pool", {x}, a));
  // Max picks one stored value: exact. Average: f32 sums of up to 9 terms of
  // |x| <= 1 (a few 6e-8 roundings) against double here; f16/bf16 round once,
  // so one ulp of the result (2^-10, 2^-7 relative) may flip.
  c.limit = op == Op::MaxPool2d ? Limit{Measure::Exact, 0} : limit_for(Measure::ElemRel, dt, 2e-6, 1e-3, 8e-3);
  return c;
}

}  // namespace

void add_pool_cases(std::vector<OpCase>& out) {
  const PoolSpec max_specs[] = {
      {"stem_3x3s2p1_c13", 1, 13, 9, 9, {3, 3}, {2, 2}, {1, 1, 1, 1}, false, true},
      {"2x2s2_odd_b3", 3, 12, 7, 7, {2, 2}, {2, 2}, {0, 0, 0, 0}, false, true},
      {"2x2s2_odd_ceil", 1, 24, 7, 5, {2, 2}, {2, 2}, {0, 0, 0, 0}, true, true},
      {"3x3s2p1_ceil_b3", 3, 13, 10, 10, {3, 3}, {2, 2}, {1, 1, 1, 1}, true, true},
      {"tfsame_3x3s2", 1, 24, 8, 8, {3, 3}, {2, 2}, {0, 0, 1, 1}, false, true},
      {"3x2_s1x2_asym", 1, 13, 6, 9, {3, 2}, {1, 2}, {1, 0, 2, 1}, false, true},
      {"1x1_on_1x1", 3, 24, 1, 1, {1, 1}, {1, 1}, {0, 0, 0, 0}, false, true},
      {"2x3_p1x1_ceil", 1, 12, 5, 8, {2, 3}, {2, 3}, {1, 1, 0, 0}, true, true},
      {"big_3x3s2p1_c64_b3", 3, 64, 29, 29, {3, 3}, {2, 2}, {1, 1, 1, 1}, false, true},  // planes split over the pool
  };
  const PoolSpec avg_specs[] = {
      {"pass_3x3s1p1_c13", 1, 13, 7, 6, {3, 3}, {1, 1}, {1, 1, 1, 1}, false, true},
      {"pass_3x3s2p1_b3", 3, 24, 9, 8, {3, 3}, {2, 2}, {1, 1, 1, 1}, false, true},
      {"3x3s1p1_nopad_count", 1, 12, 5, 5, {3, 3}, {1, 1}, {1, 1, 1, 1}, false, false},
      {"resnetd_2x2s2_ceil", 3, 13, 7, 9, {2, 2}, {2, 2}, {0, 0, 0, 0}, true, false},
      {"2x2s2_ceil_count_pad", 1, 24, 7, 7, {2, 2}, {2, 2}, {0, 0, 0, 0}, true, true},
      {"3x3s2p1_ceil_count_pad", 1, 12, 8, 8, {3, 3}, {2, 2}, {1, 1, 1, 1}, true, true},
      {"tfsame_3x3s2_nopad_count", 1, 13, 8, 8, {3, 3}, {2, 2}, {0, 0, 1, 1}, false, false},
      {"3x2_s1x2_asym", 3, 12, 6, 9, {3, 2}, {1, 2}, {1, 0, 2, 1}, false, true},
      {"1x1_on_1x1", 1, 24, 1, 1, {1, 1}, {1, 1}, {0, 0, 0, 0}, false, true},
      {"big_3x3s1p1_c64_b3", 3, 64, 21, 21, {3, 3}, {1, 1}, {1, 1, 1, 1}, false, false},  // planes split over the pool
  };
  struct GapSpec {
    const char* tag;
    Shape x;
  };
  const GapSpec gap_specs[] = {
      {"c13_7x7", {1, 13, 7, 7}}, {"c24_1x1_b3", {3, 24, 1, 1}}, {"c12_5x3_b3", {3, 12, 5, 3}}, {"c24_14x14", {1, 24, 14, 14}},
  };
  for (DType dt : kCaseTypes) {
    for (const PoolSpec& s : max_specs) out.push_back(pool_case(Op::MaxPool2d, s, dt));
    for (const PoolSpec& s : avg_specs) out.push_back(pool_case(Op::AvgPool2d, s, dt));
    for (const GapSpec& s : gap_specs) {
      OpCase c;
      c.name = std::string("global_avg_pool_") + s.tag + "_" + dtype_name(dt);
      c.group = "global_avg_pool";
      c.dtype = dt;
      CaseBuilder b(c.name, dt);
      c.graph = b.finish(b.node(Op::GlobalAvgPool, "gap", {b.input("x", s.x)}));
      // A mean of up to 196 values: a backend summing in f32 rounds a partial sum of up to
      // ~15 at every step (~1e-6 each, random signs), so 1e-5 in f32; f16/bf16: one rounding of the result.
      c.limit = limit_for(Measure::ElemRel, dt, 1e-5, 1e-3, 8e-3);
      out.push_back(std::move(c));
    }
  }
}

}  // namespace kiln::ops
