// ms_deform_attn cases: RT-DETR-like 3 levels x 4 points with 4 heads, 1x1
// levels and unequal points per level, one head with an odd D, batch 3, one
// level only; boxes partly outside [0, 1] and offsets up to 8 / points so that
// many samples fall partly or wholly outside their map (zero padding, and the
// clamp of the discrete method); both methods, every storage type. Group
// cases: value and logits as reshapes of row-major tensors (RT-DETR's form),
// offsets and logits as slices of one projection.
#include "op_harness.hpp"

namespace kiln::ops {

namespace {

// Both sides sample the same stored inputs: the reference in double, the CPU
// in f32 (softmax, bilinear weights, sums of at most 12 * 4 terms: a few 1e-7
// relative); f16/bf16 add one rounding of the result. Outputs are weighted
// means of values in [-1, 1], so max|got - ref| / max|ref|.
Limit deform_limit(DType dt) { return limit_for(Measure::MaxRel, dt, 1e-5, 1e-3, 8e-3); }

struct DeformSpec {
  const char* tag;
  int64_t n, q, heads, d;
  std::vector<int64_t> spatial_shapes, points;
  float box_lo, box_hi, off_lim;
  double offset_scale;
};

// RT-DETR's form: value and logits are reshapes of row-major [N, S, heads * D]
// and [N, Q, heads * P] tensors (linear outputs in the model), offsets of
// [N, Q, heads * P * 2]. The CUDA backend reads the row-major bytes in place
// (plan_deform_inputs, ms_deform_attn.cpp); with `also_output` the reshaped
// value is an output too, so it is stored NHWC and read through the
// workspace instead. Both must agree with the reference.
void add_deform_row_cases(std::vector<OpCase>& out) {
  for (DType dt : kCaseTypes)
    for (const char* method : {"default", "discrete"})
      for (bool also_output : {false, true}) {
        const int64_t n = 2, q = 7, heads = 2, d = 8, p = 6;
        const std::vector<int64_t> hw = {6, 5, 3, 3}, points = {4, 2};
        const int64_t s = 6 * 5 + 3 * 3;
        const std::string tag = std::string(method) + (also_output ? "_value_also_output" : "_in_place");
        OpCase c;
        c.name = "group_deform_rows_" + tag + "_" + dtype_name(dt);
        c.group = "group:deform_rows";
        c.dtype = dt;
        c.limit = deform_limit(dt);
        CaseBuilder b(c.name, dt);
        auto reshape = [&](const std::string& name, int x, std::vector<int64_t> shape) {
          return b.node(Op::Reshape, name, {x}, {{"shape", std::move(shape)}});
        };
        const int value = reshape("value.heads", b.input("value", {n, s, heads * d}), {-1, s, heads, d});
        const int ref = b.input("ref", {n, q, 4});
        const int off = reshape("offsets.heads", b.input("offsets", {n, q, heads * p * 2}), {-1, q, heads, p, 2});
        const int logits = reshape("logits.heads", b.input("logits", {n, q, heads * p}), {-1, q, heads, p});
        c.input_range["ref"] = {0.f, 1.f};
        c.input_range["offsets"] = {-3.f, 3.f};
        c.input_range["logits"] = {-3.f, 3.f};
        const int y = b.node(Op::MsDeformAttn, "decoder.layers.0.encoder_attn.core", {value, ref, off, logits},
                             {{"spatial_shapes", hw}, {"points", points}, {"offset_scale", 0.5}, {"method", std::string(method)}});
        c.graph = also_output ? b.finish(std::vector<int>{y, value}) : b.finish(y);
        out.push_back(std::move(c));
      }
}

// RT-DETR's projections merged (merge_parallel_linears): two decoder layers'
// values as slices of one projection of the memory [N, S, 2 * heads * D], and
// each layer's sampling offsets and attention logits as slices of one
// projection of its query [N, Q, heads * P * 3]. CUDA reads every slice in
// place, rows the projection's row length apart (plan_row_windows).
void add_deform_window_cases(std::vector<OpCase>& out) {
  for (DType dt : kCaseTypes) {
    const int64_t n = 2, q = 7, heads = 2, d = 8, p = 6, c = 16, hp = heads * p, hd = heads * d;
    const std::vector<int64_t> hw = {6, 5, 3, 3}, points = {4, 2};
    const int64_t s = 6 * 5 + 3 * 3;
    OpCase oc;
    oc.name = std::string("group_deform_windows_") + dtype_name(dt);
    oc.group = "group:deform_windows";
    oc.dtype = dt;
    oc.limit = deform_limit(dt);
    CaseBuilder b(oc.name, dt);
    auto reshape = [&](const std::string& name, int x, std::vector<int64_t> shape) {
      return b.node(Op::Reshape, name, {x}, {{"shape", std::move(shape)}});
    };
    auto slice = [&](const std::string& name, int x, int64_t start, int64_t end) {
      return b.node(Op::Slice, name, {x}, {{"axis", int64_t{2}}, {"start", start}, {"end", end}});
    };
    auto linear = [&](const std::string& name, int x, int64_t rows) {
      return b.node(Op::Linear, name, {x, b.weight(name + ".weight", {rows, c}, -0.4f, 0.4f), b.weight(name + ".bias", {rows}, -0.5f, 0.5f)});
    };
    const int values = linear("value_proj", b.input("memory", {n, s, c}), 2 * hd);
    const int ref = b.input("ref", {n, q, 4});
    oc.input_range["ref"] = {0.f, 1.f};
    std::vector<int> ys;
    for (int64_t l = 0; l < 2; ++l) {
      const std::string e = "decoder.layers." + std::to_string(l) + ".encoder_attn";
      const int proj = linear(e + ".offsets_and_weights", b.input("query" + std::to_string(l), {n, q, c}), 3 * hp);
      const int value = reshape(e + ".value.heads", slice(e + ".value_proj", values, l * hd, (l + 1) * hd), {-1, s, heads, d});
      const int off = reshape(e + ".offsets", slice(e + ".sampling_offsets", proj, 0, 2 * hp), {-1, q, heads, p, 2});
      const int logits = reshape(e + ".logits", slice(e + ".attention_weights", proj, 2 * hp, 3 * hp), {-1, q, heads, p});
      ys.push_back(b.node(Op::MsDeformAttn, e + ".core", {value, ref, off, logits},
                          {{"spatial_shapes", hw}, {"points", points}, {"offset_scale", 0.5}, {"method", std::string("default")}}));
    }
    oc.graph = b.finish(ys);
    out.push_back(std::move(oc));
  }
}

}  // namespace

void add_deform_cases(std::vector<OpCase>& out) {
  const DeformSpec specs[] = {
      {"rtdetr_3lvl_4pt_h4_d8", 1, 10, 4, 8, {8, 8, 4, 4, 2, 2}, {4, 4, 4}, 0.05f, 0.95f, 2.f, 0.5},
      {"one_by_one_levels_h2_d5_b3", 3, 6, 2, 5, {3, 5, 1, 1}, {2, 3}, 0.f, 1.f, 3.f, 0.5},
      {"h1_d7_one_level_b2", 2, 7, 1, 7, {6, 4}, {5}, 0.f, 1.f, 2.f, 0.5},
      {"outside_maps_h3_d4", 2, 9, 3, 4, {5, 7, 3, 2, 1, 2}, {2, 1, 3}, -0.5f, 1.5f, 8.f, 1.0},
  };
  for (DType dt : kCaseTypes)
    for (const char* method : {"default", "discrete"})
      for (const DeformSpec& s : specs) {
        OpCase c = one_node_case("ms_deform_attn", std::string(s.tag) + "_" + method, dt, deform_limit(dt));
        CaseBuilder b(c.name, dt);
        int64_t seq = 0, p = 0;
        for (size_t l = 0; l < s.points.size(); ++l) seq += s.spatial_shapes[2 * l] * s.spatial_shapes[2 * l + 1], p += s.points[l];
        const int value = b.input("value", {s.n, seq, s.heads, s.d});
        const int ref = b.input("ref", {s.n, s.q, 4});
        const int off = b.input("offsets", {s.n, s.q, s.heads, p, 2});
        const int logits = b.input("logits", {s.n, s.q, s.heads, p});
        c.input_range["ref"] = {s.box_lo, s.box_hi};
        c.input_range["offsets"] = {-s.off_lim, s.off_lim};
        c.input_range["logits"] = {-3.f, 3.f};
        c.graph = b.finish(b.node(Op::MsDeformAttn, "decoder.layers.0.encoder_attn.core", {value, ref, off, logits},
                                  {{"spatial_shapes", s.spatial_shapes},
                                   {"points", s.points},
                                   {"offset_scale", s.offset_scale},
                                   {"method", std::string(method)}}));
        out.push_back(std::move(c));
      }
  add_deform_row_cases(out);
  add_deform_window_cases(out);
}

}  // namespace kiln::ops
