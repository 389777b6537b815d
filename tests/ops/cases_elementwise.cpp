// activation (every kind), add (with each fused activation), inverse_sigmoid,
// mul (channel scale and same shape), add and mul of a constant (per image or
// of equal shape), batch_norm and linear (x of rank 2-5)
// cases; ranks 2-5 where the op takes any rank.
#include <cmath>

#include "op_harness.hpp"

namespace kiln::ops {

namespace {

const char* const kActs[] = {"none", "relu", "relu6", "silu", "sigmoid", "gelu"};
const Shape kShapes[] = {{1, 13, 5, 7}, {3, 24, 1, 1}, {3, 13}, {2, 12, 5}, {1, 3, 2, 3, 4}};

// Elementwise limit: both sides evaluate the same formula on the same stored
// inputs; f32 differs by exp()'s last bits (float vs double), f16/bf16 by one
// rounding of the result (2^-10, 2^-7 relative).
Limit elementwise_limit(DType dt) { return limit_for(Measure::ElemRel, dt, 1e-6, 1e-3, 8e-3); }

OpCase start(const std::string& op, const std::string& tag, DType dt) { return one_node_case(op, tag, dt, {}); }

}  // namespace

void add_elementwise_cases(std::vector<OpCase>& out) {
  for (DType dt : kCaseTypes) {
    for (const char* act : kActs)
      for (const Shape& s : kShapes) {
        OpCase c = start("activation", std::string(act) + "_" + shape_tag(s), dt);
        CaseBuilder b(c.name, dt);
        c.graph = b.finish(b.node(Op::Activation, "act", {b.input("x", s)}, {{"activation", std::string(act)}}));
        c.input_lo = -8.f, c.input_hi = 8.f;  // relu6's clamp at 6 and the sigmoid's tails
        c.limit = elementwise_limit(dt);
        out.push_back(std::move(c));
      }

    const std::pair<Shape, const char*> add_specs[] = {
        {{1, 13, 5, 7}, "none"}, {{3, 24, 4, 4}, "relu"}, {{1, 12, 1, 1}, "silu"},
        {{3, 13}, "relu6"},      {{2, 12, 5}, "sigmoid"}, {{1, 3, 2, 3, 4}, "relu"},
        {{1, 13, 24}, "gelu"},
    };
    for (const auto& [s, act] : add_specs) {
      OpCase c = start("add", std::string(act) + "_" + shape_tag(s), dt);
      CaseBuilder b(c.name, dt);
      Attrs a;
      if (std::string(act) != "none") a["activation"] = std::string(act);
      c.graph = b.finish(b.node(Op::Add, "add", {b.input("a", s), b.input("b", s)}, a));
      c.input_lo = -4.f, c.input_hi = 4.f;
      c.limit = elementwise_limit(dt);
      out.push_back(std::move(c));
    }

    // inverse_sigmoid: inputs past both ends of [0, 1] (the clamp), near 0
    // and near 1 (where eps decides), eps 1e-5 (RT-DETR's) and 1e-2.
    struct InverseSigmoidSpec {
      const char* tag;
      Shape x;
      float lo, hi;
      double eps;
    };
    const InverseSigmoidSpec inverse_sigmoid_specs[] = {
        {"r4_clamped_b1", {1, 13, 5, 7}, -0.2f, 1.2f, 1e-5}, {"r3_boxes_b3", {3, 13, 4}, 0.f, 1.f, 1e-5},
        {"r2_near0_b3", {3, 24}, 0.f, 1e-4f, 1e-5},           {"r4_near1_b3", {3, 24, 1, 1}, 0.999f, 1.f, 1e-5},
        {"r5_eps1e2_b1", {1, 3, 2, 3, 4}, -0.1f, 1.1f, 1e-2}, {"r3_clamped_b3", {3, 12, 5}, -0.2f, 1.2f, 1e-5},
    };
    for (const InverseSigmoidSpec& is : inverse_sigmoid_specs) {
      OpCase c = start("inverse_sigmoid", is.tag, dt);
      CaseBuilder b(c.name, dt);
      c.graph = b.finish(b.node(Op::InverseSigmoid, "bbox.inverse_sigmoid", {b.input("x", is.x)}, {{"eps", is.eps}}));
      c.input_lo = is.lo, c.input_hi = is.hi;
      // A log of a ratio, in f32 (CPU) against double: as the other elementwise ops;
      // |y| is up to 11.5 (log 1e5), the measure is relative there.
      c.limit = elementwise_limit(dt);
      out.push_back(std::move(c));
    }

    struct MulSpec {
      const char* tag;
      Shape x, s;
    };
    const MulSpec mul_specs[] = {
        {"scale_c13", {1, 13, 5, 7}, {1, 13, 1, 1}},
        {"scale_c24_b3", {3, 24, 3, 2}, {3, 24, 1, 1}},
        {"scale_on_1x1_b3", {3, 12, 1, 1}, {3, 12, 1, 1}},
        {"same_c13", {1, 13, 4, 4}, {1, 13, 4, 4}},
        {"same_r2", {3, 13}, {3, 13}},
        {"same_r5", {1, 3, 2, 3, 4}, {1, 3, 2, 3, 4}},
    };
    for (const MulSpec& m : mul_specs) {
      OpCase c = start("mul", m.tag, dt);
      CaseBuilder b(c.name, dt);
      c.graph = b.finish(b.node(Op::Mul, "mul", {b.input("x", m.x), b.input("s", m.s)}));
      c.input_lo = -3.f, c.input_hi = 3.f;
      c.limit = elementwise_limit(dt);
      out.push_back(std::move(c));
    }

    // A constant second operand (add, mul): repeated per image (extent 1 on
    // axis 0 and where it broadcasts: RT-DETR's position embedding [1, L, C],
    // valid mask [1, S, 1] and anchors [1, S, 4]), or of equal shape; 4-D ones
    // are laid out as the NHWC activation they meet (CUDA, elementwise.cpp).
    struct ConstSpec {
      const char* tag;
      Shape x, k;
    };
    const ConstSpec const_specs[] = {
        {"tokens_b2", {2, 12, 8}, {1, 12, 8}},     {"rows_b3", {3, 20, 8}, {1, 20, 1}},
        {"boxes_b2", {2, 7, 4}, {1, 7, 4}},        {"odd_b2", {2, 5, 3}, {1, 1, 3}},
        {"equal_b1", {1, 12, 8}, {1, 12, 8}},      {"map_b2", {2, 13, 3, 5}, {1, 13, 3, 5}},
        {"map_pixels_b2", {2, 13, 3, 5}, {1, 1, 3, 5}}, {"map_equal_b1", {1, 13, 3, 5}, {1, 13, 3, 5}},
        {"map_channels_b3", {3, 16, 2, 2}, {1, 16, 1, 1}}, {"r2_b3", {3, 13}, {1, 13}},
    };
    for (const ConstSpec& k : const_specs)
      for (Op op : {Op::Add, Op::Mul}) {
        OpCase c = start(op_name(op), std::string("const_") + k.tag, dt);
        CaseBuilder b(c.name, dt);
        c.graph = b.finish(b.node(op, "op", {b.input("x", k.x), b.weight("k", k.k, -2.f, 2.f)}));
        c.input_lo = -3.f, c.input_hi = 3.f;
        c.limit = elementwise_limit(dt);
        out.push_back(std::move(c));
      }

    const std::pair<Shape, double> bn_specs[] = {
        {{1, 13, 5, 7}, 1e-5}, {{3, 24, 1, 1}, 1e-5}, {{2, 12, 9, 3}, 1e-3}, {{3, 13}, 1e-5}, {{2, 12, 5}, 1e-5},
        {{1, 3, 2, 3, 4}, 1e-3},
    };
    for (const auto& [s, eps] : bn_specs) {
      OpCase c = start("batch_norm", shape_tag(s) + (eps > 1e-4 ? "_eps1e3" : ""), dt);
      CaseBuilder b(c.name, dt);
      const int64_t ch = s[1];
      std::vector<int> ins = {b.input("x", s), b.weight("scale", {ch}, 0.5f, 1.5f), b.weight("bias", {ch}, -0.5f, 0.5f),
                              b.weight("mean", {ch}, -0.3f, 0.3f), b.weight("var", {ch}, 0.1f, 2.f)};
      c.graph = b.finish(b.node(Op::BatchNorm, "bn", ins, {{"eps", eps}}));
      c.input_lo = -2.f, c.input_hi = 2.f;
      // The CUDA kernel applies a folded x*s + t (s, t in f32): the same value up to
      // a few f32 roundings, so the f32 limit is a little looser than other elementwise ops.
      c.limit = limit_for(Measure::ElemRel, dt, 4e-6, 1e-3, 8e-3);
      if (s.size() != 2 && s.size() != 4) c.cuda = cuda_refuses_batch_norm_rank();
      out.push_back(std::move(c));
    }

    struct LinearSpec {
      const char* tag;
      Shape lead;  // x's dims before K (rank 2: [N])
      int64_t k, m;
      bool bias;
      const char* act;
    };
    const LinearSpec linear_specs[] = {
        {"k13_m24_relu", {1}, 13, 24, true, "relu"}, {"k24_m13_b3", {3}, 24, 13, true, "none"},
        {"k12_m1_nobias_sigmoid", {3}, 12, 1, false, "sigmoid"}, {"k130_m10_relu6_b3", {3}, 130, 10, true, "relu6"},
        {"k64_m12_silu", {1}, 64, 12, true, "silu"}, {"k24_m13_gelu_b3", {3}, 24, 13, true, "gelu"},
        // x[..., K] of rank 3-5: token rows (RT-DETR's projections and FFN, fc1 with GELU).
        {"r3_k24_m13_gelu_b1", {1, 13}, 24, 13, true, "gelu"}, {"r3_k13_m24_b3", {3, 5}, 13, 24, true, "none"},
        {"r4_k12_m7_relu_b3", {2, 3, 4}, 12, 7, true, "relu"}, {"r5_k13_m5_nobias_b1", {1, 2, 3, 2}, 13, 5, false, "none"},
        // One input feature: ones [B, 1, 1] x w [numel, 1] (RT-DETR's batch constants before add and mul took per-image constants).
        {"r3_k1_m300_nobias_b2", {2, 1}, 1, 300, false, "none"},
    };
    for (const LinearSpec& l : linear_specs) {
      OpCase c = start("linear", l.tag, dt);
      CaseBuilder b(c.name, dt);
      const float wr = 1.7f / std::sqrt(static_cast<float>(l.k));
      Shape xs = l.lead;
      xs.push_back(l.k);
      std::vector<int> ins = {b.input("x", xs), b.weight("w", {l.m, l.k}, -wr, wr)};
      if (l.bias) ins.push_back(b.weight("b", {l.m}, -0.5f, 0.5f));
      Attrs a;
      if (std::string(l.act) != "none") a["activation"] = std::string(l.act);
      c.graph = b.finish(b.node(Op::Linear, "fc", ins, a));
      // A dot product of up to 130 terms: as conv2d (cases_conv.cpp).
      c.limit = limit_for(Measure::MaxRel, dt, 1e-4, 5e-3, 3e-2);
      out.push_back(std::move(c));
    }
  }
}

}  // namespace kiln::ops
