// flatten, concat, slice and cast cases: channel axis of 4-D tensors (what
// the backends lower), other axes and ranks 2-5 (what the IR allows), one
// input concats, slices of one channel, casts between every float type.
// All exact: these ops move or round values, they compute nothing.
#include "op_harness.hpp"

namespace kiln::ops {

namespace {

OpCase start(const std::string& op, const std::string& tag, DType dt) {
  OpCase c = one_node_case(op, tag, dt, {Measure::Exact, 0});
  c.input_lo = -5.f, c.input_hi = 5.f;
  return c;
}

// What the backends lower of concat and slice: the CPU any axis (row-major),
// CUDA any axis of row-major values (ranks other than 4) and the channel axis
// of 4-D maps (stored NHWC).
void axes_lowered(OpCase& c, int64_t axis, size_t rank) {
  if (rank == 4 && axis != 1) c.cuda = cuda_refuses_non_channel_axis();
}

}  // namespace

void add_shape_cases(std::vector<OpCase>& out) {
  for (DType dt : kCaseTypes) {
    const Shape flatten_specs[] = {{3, 24, 1, 1}, {1, 13, 1, 1}, {2, 1, 3, 3}, {3, 12, 2, 2}, {1, 13, 3, 5}, {2, 3, 5}, {2, 3, 1, 2, 2}};
    for (const Shape& s : flatten_specs) {
      OpCase c = start("flatten", shape_tag(s), dt);
      CaseBuilder b(c.name, dt);
      c.graph = b.finish(b.node(Op::Flatten, "flatten", {b.input("x", s)}));
      // CUDA: a byte alias on 1x1 maps, one channel and non-4-D values (row-major),
      // else an NHWC -> NCHW transpose (layout assignment, src/backends/cuda/lower.hpp).
      out.push_back(std::move(c));
    }

    struct ConcatSpec {
      const char* tag;
      std::vector<Shape> ins;
      int64_t axis;
    };
    const ConcatSpec concat_specs[] = {
        {"c13_12_1", {{1, 13, 5, 7}, {1, 12, 5, 7}, {1, 1, 5, 7}}, 1},
        {"c24_13_b3", {{3, 24, 2, 2}, {3, 13, 2, 2}}, 1},
        {"c12_1x1_b3", {{3, 12, 1, 1}, {3, 13, 1, 1}}, 1},
        {"one_input", {{1, 12, 3, 3}}, 1},
        {"axis2", {{1, 3, 2, 4}, {1, 3, 5, 4}}, 2},
        {"axis_neg1_r4", {{2, 3, 2, 4}, {2, 3, 2, 3}}, -1},
        {"r2_axis1", {{3, 13}, {3, 12}}, 1},
        {"r3_axis2", {{2, 3, 5}, {2, 3, 1}}, 2},
        {"r5_axis2", {{1, 2, 3, 2, 2}, {1, 2, 1, 2, 2}}, 2},
        // Token rows (RT-DETR's memory: three levels along axis 1), 16-byte words and odd ones.
        {"r3_tokens_b2", {{2, 20, 8}, {2, 5, 8}, {2, 3, 8}}, 1},
        {"r3_tokens_odd_b1", {{1, 7, 3}, {1, 2, 3}}, 1},
    };
    for (const ConcatSpec& s : concat_specs) {
      OpCase c = start("concat", s.tag, dt);
      CaseBuilder b(c.name, dt);
      std::vector<int> ins;
      for (size_t k = 0; k < s.ins.size(); ++k) ins.push_back(b.input("x" + std::to_string(k), s.ins[k]));
      c.graph = b.finish(b.node(Op::Concat, "concat", ins, {{"axis", s.axis}}));
      axes_lowered(c, s.axis, s.ins[0].size());
      out.push_back(std::move(c));
    }

    struct SliceSpec {
      const char* tag;
      Shape x;
      int64_t axis, start, end;
    };
    const SliceSpec slice_specs[] = {
        {"c24_first13", {1, 24, 5, 7}, 1, 0, 13},   {"c24_last11_b3", {3, 24, 3, 3}, 1, 13, 24},
        {"c13_one_1x1", {1, 13, 1, 1}, 1, 12, 13},  {"c26_middle_b3", {3, 26, 2, 3}, 1, 5, 18},
        {"axis2", {1, 3, 6, 4}, 2, 1, 4},
        {"axis3", {2, 3, 2, 7}, 3, 2, 7},           {"r2_axis1", {3, 13}, 1, 2, 9},
        {"r3_axis_neg1", {2, 3, 5}, -1, 1, 4},      {"r5_axis4", {1, 2, 3, 2, 4}, 4, 0, 3},
        // RT-DETR's merged projections: the sampling offsets and logits, q and k.
        {"r3_offsets_b2", {2, 7, 36}, 2, 0, 24},    {"r3_logits_b2", {2, 7, 36}, 2, 24, 36},
        {"r3_axis1_b3", {3, 6, 5}, 1, 2, 5},
    };
    for (const SliceSpec& s : slice_specs) {
      OpCase c = start("slice", s.tag, dt);
      CaseBuilder b(c.name, dt);
      c.graph = b.finish(b.node(Op::Slice, "slice", {b.input("x", s.x)}, {{"axis", s.axis}, {"start", s.start}, {"end", s.end}}));
      axes_lowered(c, s.axis, s.x.size());
      out.push_back(std::move(c));
    }

    // Casts, by the non-f32 side's type: f32 -> dt and dt -> f32 (f32: the
    // identity cast), plus between the two narrow types.
    struct CastSpec {
      const char* tag;
      DType from, to;
      Shape x;
    };
    const DType other = dt == DType::F16 ? DType::BF16 : DType::F16;
    const CastSpec cast_specs[] = {
        {"from_f32", DType::F32, dt, {1, 13, 5, 7}}, {"to_f32_b3", dt, DType::F32, {3, 24, 1, 1}},
        {"from_f32_r2", DType::F32, dt, {3, 13}},    {"narrow_to_other", dt == DType::F32 ? DType::F16 : dt, other, {1, 12, 3, 3}},
    };
    for (const CastSpec& s : cast_specs) {
      OpCase c = start("cast", s.tag, dt);
      CaseBuilder b(c.name, dt);
      c.graph = b.finish(b.node(Op::Cast, "cast", {b.input_as("x", s.from, s.x)}, {{"dtype", std::string(dtype_name(s.to))}}));
      c.input_lo = -3000.f, c.input_hi = 3000.f;  // wide enough that rounding to bf16 (8 bits) and f16 (11 bits) shows
      out.push_back(std::move(c));
    }
  }
}

}  // namespace kiln::ops
