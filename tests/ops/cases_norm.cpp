// layer_norm and softmax cases: ranks 2-5, the normalized extent 13, 24 and
// 1 (a single element), batches 1 and 3; layer_norm with weight and bias,
// weight only and neither, eps 1e-5 and 1e-3, inputs off zero (mean 3) so the
// mean subtraction matters; softmax along the last, a middle and the second
// axis, and logits in [80, 100] (exp overflows f32 without the max subtracted).
#include "op_harness.hpp"

namespace kiln::ops {

namespace {

// Both sides normalize the same stored inputs: f32 differs by the f32
// statistics (sums of at most 24 terms, one sqrt, one exp per element: a few
// 1e-7), f16/bf16 by one rounding of the result (2^-10, 2^-7 relative); the
// outputs are O(1) (softmax: at most 1), so the elementwise measure.
Limit norm_limit(DType dt) { return limit_for(Measure::ElemRel, dt, 1e-5, 1e-3, 8e-3); }

}  // namespace

void add_norm_cases(std::vector<OpCase>& out) {
  struct LayerNormSpec {
    const char* tag;
    Shape x;
    int params;  // 0: neither, 1: weight, 2: weight and bias
    double eps;
  };
  const LayerNormSpec ln_specs[] = {
      {"r3_c24_b1", {1, 13, 24}, 2, 1e-5},     {"r3_c13_b3", {3, 24, 13}, 2, 1e-5},
      {"r2_c24_b3", {3, 24}, 2, 1e-5},         {"r2_c13_weight_only_b1", {1, 13}, 1, 1e-5},
      {"r4_c24_eps1e3_b3", {3, 2, 5, 24}, 2, 1e-3}, {"r5_c13_b1", {1, 2, 3, 2, 13}, 2, 1e-5},
      {"r3_c13_no_params_b3", {3, 5, 13}, 0, 1e-5}, {"r3_c1_b3", {3, 4, 1}, 2, 1e-5},
      {"r4_c13_b1", {1, 3, 4, 13}, 2, 1e-5},    {"rtdetr_r3_c256_b1", {1, 300, 256}, 2, 1e-5},
      // CUDA's register path (c a multiple of 8 16-bit / 4 f32 values, up to 8
      // vectors a lane) with rows part of a lane's vectors, every lane's 8, and
      // c past it (f32 c = 2048, 16-bit c = 260: the scalar kernel).
      {"r3_c1000_b1", {1, 7, 1000}, 2, 1e-5},  {"r2_c2048_b3", {3, 2048}, 2, 1e-5},
      {"r3_c260_no_params_b1", {1, 5, 260}, 0, 1e-5}, {"r2_c8_weight_only_b3", {3, 8}, 1, 1e-5},
  };
  // The last two: attention rows of 300 keys, along the last and a middle axis.
  const Shape softmax_shapes[] = {{3, 13},          {1, 24},  {1, 2, 13, 13}, {3, 13, 4}, {2, 3, 5, 24},
                                  {1, 2, 3, 2, 12}, {3, 5, 1}, {1, 8, 300},    {2, 300, 8}};
  const int64_t softmax_axes[] = {-1, 1, -1, 1, 2, -1, -1, -1, 1};
  for (DType dt : kCaseTypes) {
    for (const LayerNormSpec& s : ln_specs) {
      OpCase c = one_node_case("layer_norm", s.tag, dt, norm_limit(dt));
      CaseBuilder b(c.name, dt);
      const int64_t ch = s.x.back();
      std::vector<int> ins = {b.input("x", s.x)};
      if (s.params >= 1) ins.push_back(b.weight("weight", {ch}, 0.5f, 1.5f));
      if (s.params >= 2) ins.push_back(b.weight("bias", {ch}, -0.5f, 0.5f));
      c.graph = b.finish(b.node(Op::LayerNorm, "norm", ins, {{"eps", s.eps}}));
      c.input_lo = 2.f, c.input_hi = 4.f;  // mean 3, spread 1
      out.push_back(std::move(c));
    }
    for (size_t i = 0; i < std::size(softmax_shapes); ++i) {
      const Shape& s = softmax_shapes[i];
      const std::string axis = softmax_axes[i] < 0 ? "neg" + std::to_string(-softmax_axes[i]) : std::to_string(softmax_axes[i]);
      OpCase c = one_node_case("softmax", shape_tag(s) + "_axis" + axis, dt, norm_limit(dt));
      CaseBuilder b(c.name, dt);
      c.graph = b.finish(b.node(Op::Softmax, "attn.softmax", {b.input("x", s)}, {{"axis", softmax_axes[i]}}));
      c.input_lo = -8.f, c.input_hi = 8.f;
      out.push_back(std::move(c));
    }
    OpCase c = one_node_case("softmax", "large_logits_r3_3_4_24", dt, norm_limit(dt));
    CaseBuilder b(c.name, dt);
    c.graph = b.finish(b.node(Op::Softmax, "attn.softmax", {b.input("x", {3, 4, 24})}, {{"axis", int64_t{-1}}}));
    c.input_lo = 80.f, c.input_hi = 100.f;
    out.push_back(std::move(c));
  }
}

}  // namespace kiln::ops
