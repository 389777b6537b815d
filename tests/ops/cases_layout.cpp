// transpose, reshape, upsample_nearest and gather cases: ranks 2-5, extents
// 13 and 24 and 1, batches 1 and 3. transpose: NCHW <-> NHWC, tokens <->
// channels, heads ([B, L, H, D] -> [B, H, L, D]), rank 5, extent-1 axes, the
// identity, one larger than the CPU kernel's 32 x 32 tiles. reshape: splitting
// and merging heads, flatten(2), an inferred extent, rank 5. upsample_nearest:
// 2x (RT-DETR's FPN), 3x1, 2x3 on 1x1 maps, 1x1. gather: RT-DETR's query
// selection ([B, S, C] by [B, K] along axis 1), K = extent (repeats), K = 1,
// the last axis, a middle axis of rank 5, i32 and constant indices. All exact:
// these ops move values, they compute nothing.
#include "op_harness.hpp"

namespace kiln::ops {

void add_layout_cases(std::vector<OpCase>& out) {
  const std::pair<Shape, std::vector<int64_t>> transpose_specs[] = {
      {{1, 13, 5, 7}, {0, 2, 3, 1}},  // NCHW -> NHWC
      {{3, 5, 7, 13}, {0, 3, 1, 2}},        {{1, 13, 24}, {0, 2, 1}},
      {{3, 24, 13}, {0, 2, 1}},             {{1, 13, 8, 24}, {0, 2, 1, 3}},
      {{3, 2, 13, 3, 4}, {0, 3, 1, 4, 2}},  {{1, 1, 13, 1}, {0, 3, 2, 1}},
      {{3, 13}, {0, 1}},                    {{3, 40, 37}, {0, 2, 1}},  // past one 32 x 32 tile both ways
  };
  struct ReshapeSpec {
    const char* tag;
    Shape x;
    std::vector<int64_t> shape;
  };
  const ReshapeSpec reshape_specs[] = {
      {"split_heads_b1", {1, 13, 24}, {-1, 13, 2, 12}},  {"merge_heads_b3", {3, 13, 2, 12}, {-1, 13, 24}},
      {"flatten2_b3", {3, 24, 5, 7}, {-1, 24, 35}},       {"flatten_inferred_b1", {1, 13, 5}, {-1, -1}},
      {"r5_to_r5_b3", {3, 2, 3, 4, 5}, {-1, 5, 4, 3, 2}}, {"inferred_middle_b3", {3, 12}, {-1, 3, -1}},
      {"to_1x1_maps_b1", {1, 24}, {-1, 24, 1, 1}},
  };
  struct UpsampleSpec {
    const char* tag;
    Shape x;
    int64_t sh, sw;
  };
  const UpsampleSpec upsample_specs[] = {
      {"2x_c13_b1", {1, 13, 5, 7}, 2, 2}, {"2x_c24_b3", {3, 24, 4, 4}, 2, 2}, {"3x1_b1", {1, 3, 5, 7}, 3, 1},
      {"2x3_1x1_b3", {3, 2, 1, 1}, 2, 3}, {"1x1_b1", {1, 13, 1, 6}, 1, 1},
  };
  struct GatherSpec {
    const char* tag;
    Shape x;
    int64_t axis, k;
    DType index_dtype = DType::I64;
    bool constant = false;
    int64_t table_batch = 0;  // > 0: x a constant [1, ...] shared by every image of this batch
  };
  const GatherSpec gather_specs[] = {
      {"r4_last_axis_b1", {1, 3, 5, 13}, 3, 4},
      {"queries_b1", {1, 24, 13}, 1, 5},
      {"queries_k_extent_b3", {3, 24, 13}, 1, 24},
      {"r2_last_axis_b3", {3, 13}, -1, 7},
      {"r3_axis2_b3", {3, 4, 13}, 2, 6},
      {"r5_axis2_b1", {1, 2, 13, 3, 2}, 2, 7},
      {"k1_b3", {3, 13, 24}, 1, 1},
      {"i32_index_b3", {3, 13, 2}, 1, 4, DType::I32},
      {"constant_index_b1", {1, 24, 4}, 1, 5, DType::I64, true},
      // RT-DETR's anchors [1, S, 4] picked by each image's indices (x shared by the batch).
      {"shared_table_b3", {1, 24, 4}, 1, 5, DType::I64, false, 3},
      {"shared_table_b1", {1, 13, 6}, 1, 13, DType::I32, false, 1},
  };
  for (DType dt : kCaseTypes) {
    for (const auto& [x, perm] : transpose_specs) {
      std::string tag = shape_tag(x) + "_perm";
      for (int64_t p : perm) tag += std::to_string(p);
      OpCase c = one_node_case("transpose", tag, dt, {Measure::Exact, 0});
      CaseBuilder b(c.name, dt);
      c.graph = b.finish(b.node(Op::Transpose, "tokens.transpose", {b.input("x", x)}, {{"perm", perm}}));
      out.push_back(std::move(c));
    }
    for (const ReshapeSpec& s : reshape_specs) {
      OpCase c = one_node_case("reshape", s.tag, dt, {Measure::Exact, 0});
      CaseBuilder b(c.name, dt);
      c.graph = b.finish(b.node(Op::Reshape, "heads.reshape", {b.input("x", s.x)}, {{"shape", s.shape}}));
      out.push_back(std::move(c));
    }
    for (const UpsampleSpec& s : upsample_specs) {
      OpCase c = one_node_case("upsample_nearest", s.tag, dt, {Measure::Exact, 0});
      CaseBuilder b(c.name, dt);
      c.graph = b.finish(b.node(Op::UpsampleNearest, "fpn.upsample", {b.input("x", s.x)},
                                {{"scales", std::vector<int64_t>{s.sh, s.sw}}}));
      out.push_back(std::move(c));
    }
    for (const GatherSpec& s : gather_specs) {
      OpCase c = one_node_case("gather", s.tag, dt, {Measure::Exact, 0});
      c.input_lo = -5.f, c.input_hi = 5.f;
      CaseBuilder b(c.name, dt);
      const int64_t axis = s.axis < 0 ? s.axis + static_cast<int64_t>(s.x.size()) : s.axis;
      Shape index_shape(s.x.begin(), s.x.begin() + axis);
      index_shape.push_back(s.k);
      if (s.table_batch > 0) index_shape[0] = s.table_batch;
      const int x = s.table_batch > 0 ? b.weight("x", s.x, -5.f, 5.f) : b.input("x", s.x);
      const int index = s.constant ? b.index_constant("index", s.index_dtype, index_shape, 0, s.x[axis])
                                   : b.input_as("index", s.index_dtype, index_shape);
      c.input_range["index"] = {0.f, static_cast<float>(s.x[axis])};
      c.graph = b.finish(b.node(Op::Gather, "query_select.gather", {x, index}, {{"axis", s.axis}}));
      out.push_back(std::move(c));
    }
  }
}

}  // namespace kiln::ops
