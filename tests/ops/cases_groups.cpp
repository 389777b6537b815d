// Fused groups: the node patterns the backends lower as one unit or with
// shared buffers, each checked end to end against the reference.
//  - conv + bias + act + residual where the residual is another conv's output
//  - the Res2Net chain add fused into the conv that reads it (fusion mark input_add)
//  - a Res2Net block and a stride-2 stage block: slices as channel views,
//    3x3 outputs written in place into the concat, CUDA's window conv (f16/bf16)
//  - squeeze-excitation (GlobalAvgPool -> conv -> act -> conv -> sigmoid -> mul: se_plan.cpp)
//  - slices read back by a concat in another order
//  - flatten -> linear and global pool -> flatten -> linear (CUDA's linear path)
//  - their 8-bit forms (issue 13): the quantize pass over a Res2Net block, a
//    stem pool and a squeeze-excitation gate before a 1x1, so the chain adds,
//    the concat, the max pool and the gate write codes (passes/quantize.cpp)
//  - RT-DETR's post-norm residual add + layer_norm (+ query position, + f32 copy), and its box refinement
//    (cast, inverse_sigmoid, add + sigmoid, cast: one CUDA launch)
//  - RT-DETR's f32 score head reading a widened 16-bit value (CUDA: a 16-bit
//    product with f32 output, plan_wide_linears)
//  - chains of small linears (RT-DETR's query position and box heads; CUDA:
//    one mlp_chain launch, plan_mlp_chains), and a box head, the box
//    refinement and the next query position head with its sum (one launch)
//  - RT-DETR's memory concat and its valid-anchor mask (CUDA: one launch, plan_concat_masks)
//  - a post-norm's one projection with the residual layer norm (CUDA: one
//    small_gemm_norm launch, switch linear_norm)
//  - RT-DETR's FPN upsample read by a concat (CUDA: inside the concat's launch,
//    plan_upsample_concats), and one that is also an output (its own launch)
#include <cmath>
#include <optional>

#include "core/error.hpp"
#include "op_harness.hpp"
#include "passes/pass.hpp"
#include "quant/calibrate.hpp"

namespace kiln::ops {

namespace {

// Two to five rounded stages: about twice the one-node limits (cases_conv.cpp).
Limit group_limit(DType dt) { return limit_for(Measure::MaxRel, dt, 2e-4, 1e-2, 6e-2); }

struct Group {
  OpCase c;
  CaseBuilder b;
  Group(const std::string& what, const std::string& tag, DType dt)
      : c(), b(what + "_" + tag + "_" + dtype_name(dt), dt) {
    c.name = "group_" + what + "_" + tag + "_" + dtype_name(dt);
    c.group = "group:" + what;
    c.dtype = dt;
    c.limit = group_limit(dt);
  }
  // conv2d with weights of ~1/sqrt(fan_in) and a bias; pads p on every side.
  int conv(const std::string& name, int x, int64_t c_in, int64_t c_out, int64_t k, int64_t stride, int64_t pad,
           const char* act, int residual = -1, int64_t groups = 1) {
    const float wr = 1.7f / std::sqrt(static_cast<float>(c_in / groups * k * k));
    std::vector<int> ins = {x, b.weight(name + ".w", {c_out, c_in / groups, k, k}, -wr, wr),
                            b.weight(name + ".b", {c_out}, -0.3f, 0.3f)};
    if (residual >= 0) ins.push_back(residual);
    Attrs a = {{"strides", std::vector<int64_t>{stride, stride}}, {"pads", std::vector<int64_t>{pad, pad, pad, pad}},
               {"groups", groups}};
    if (std::string(act) != "none") a["activation"] = std::string(act);
    return b.node(Op::Conv2d, name, ins, a);
  }
  int slice(const std::string& name, int x, int64_t start, int64_t end) {
    return b.node(Op::Slice, name, {x}, {{"axis", int64_t(1)}, {"start", start}, {"end", end}});
  }
  // The fusion-mark passes run as in a build, so the backends lower the
  // group as one unit where they can (the marks are what they read). With a
  // code type, the quantize pass runs first as a build's does (quantized()).
  OpCase done(int out, std::optional<DType> code = std::nullopt, const char* keep_wide = nullptr) {
    c.graph = b.finish(out);
    if (code) quantized(*code, keep_wide);
    mark_fusions(c.graph, FusionOptions{});
    return std::move(c);
  }
  // Every conv whose name does not start with keep_wide becomes an 8-bit
  // layer, every scale from amax 3 (the values are O(1): some saturate). The
  // CPU runs the reference's arithmetic (Exact when every conv is 8-bit), as
  // CUDA's INT8 layers (exact int32 sums, none/ReLU) and code-writing producers do; CUDA's FP8 layers
  // sum in their engines' order and precision, and a layer reading codes
  // another layer wrote may see one code step (1/8 of a value) apart from the
  // reference: MaxRel 0.25 over the chain, far below a wrong scale or layout.
  void quantized(DType code, const char* keep_wide) {
    Graph& g = c.graph;
    std::vector<int> convs;
    for (size_t i = 0; i < g.nodes.size(); ++i)
      if (g.nodes[i].op == Op::Conv2d && !(keep_wide && g.nodes[i].name.rfind(keep_wide, 0) == 0)) convs.push_back(int(i));
    quant::ActivationScales s;
    s.precision = code;
    for (int v : quant::calibrated_values(g, convs)) s.amax[g.values[v].name] = 3.f;
    quantize_layers(g, convs, s);
    // A conv kept wide sums in the backend's order: its stored value may round
    // apart from the reference's, and the codes read after it one step apart.
    c.limit = keep_wide ? Limit{Measure::MaxRel, 0.25} : Limit{Measure::Exact, 0};
    if (code == DType::F8E4M3)
      c.cuda.limit = Limit{Measure::MaxRel, 0.25},
      c.cuda.why = "chained FP8 layers: engine sums, then codes one step apart (Group::quantized, cases_groups.cpp)";
  }
};

const char* code_tag(std::optional<DType> code) { return !code ? "" : *code == DType::I8 ? "_i8" : "_f8"; }

// Res2Net bottleneck, scale 4, width w: 1x1 -> 4 chunks -> 3x3 convs with the
// chain adds (y_i = conv(y_{i-1} + x_i)) -> concat with the last chunk -> 1x1
// with the block input as residual. stage: the first block of a stage, with
// stride 2, no chain adds and the last chunk through a 3x3 average pool.
// Width 13 as in no real model (awkward: CUDA copies the chunks); width 16
// (a multiple of 8, as pad_channels makes Res2Net's 26) lets CUDA's window
// conv take the block in f16/bf16.
OpCase res2net(DType dt, int64_t n, bool stage, int64_t w, std::optional<DType> code = std::nullopt) {
  const int64_t c = 24, hw = stage ? 8 : 6;
  Group gr(cat(code ? "q8_" : "", stage ? "res2net_stage" : "res2net_block"),
           cat("w", w, "_b", n, code_tag(code)), dt);
  const int x = gr.b.input("x", {n, c, hw, hw});
  const int t = gr.conv("conv1", x, c, 4 * w, 1, 1, 0, "relu");
  std::vector<int> parts;
  int prev = -1;
  for (int64_t i = 0; i < 3; ++i) {
    int s = gr.slice("split" + std::to_string(i), t, i * w, (i + 1) * w);
    if (!stage && prev >= 0) s = gr.b.node(Op::Add, "chain" + std::to_string(i), {prev, s});
    prev = gr.conv("convs." + std::to_string(i), s, w, w, 3, stage ? 2 : 1, 1, "relu");
    parts.push_back(prev);
  }
  int last = gr.slice("split3", t, 3 * w, 4 * w);
  if (stage)
    last = gr.b.node(Op::AvgPool2d, "pool", {last},
                     {{"kernel", std::vector<int64_t>{3, 3}}, {"strides", std::vector<int64_t>{2, 2}},
                      {"pads", std::vector<int64_t>{1, 1, 1, 1}}, {"count_include_pad", int64_t(1)}});
  parts.push_back(last);
  const int cat = gr.b.node(Op::Concat, "cat", parts, {{"axis", int64_t(1)}});
  return gr.done(gr.conv("conv3", cat, 4 * w, c, 1, 1, 0, stage ? "none" : "relu", stage ? -1 : x), code);
}

// The 8-bit groups whose 16-bit producers write codes: a stem (3x3 conv kept
// wide, max pool read by two 8-bit convs) and a squeeze-excitation gate read
// by an 8-bit 1x1 (the SE convs kept wide, as the recipe's "pooled" default).
void add_code_writer_groups(std::vector<OpCase>& out, DType dt, int64_t n, DType code) {
  const std::string bt = cat("b", n, code_tag(code));
  for (int64_t c : {int64_t(13), int64_t(32)}) {
    Group gr("q8_stem_pool", cat("c", c, "_", bt), dt);
    const int stem = gr.conv("stem", gr.b.input("x", {n, 3, 18, 18}), 3, c, 3, 2, 1, "relu");
    const int pool = gr.b.node(Op::MaxPool2d, "maxpool", {stem},
                               {{"kernel", std::vector<int64_t>{3, 3}}, {"strides", std::vector<int64_t>{2, 2}},
                                {"pads", std::vector<int64_t>{1, 1, 1, 1}}});
    const int a = gr.conv("conv_a", pool, c, 16, 1, 1, 0, "relu"), b = gr.conv("conv_b", pool, c, 16, 3, 1, 1, "none");
    out.push_back(gr.done(gr.b.node(Op::Add, "sum", {a, b}), code, "stem"));
    Group se("q8_se_project", cat("c", c, "_", bt), dt);
    const int x = se.b.input("x", {n, c, 5, 4});
    const int hidden = se.conv("se.conv_reduce", se.b.node(Op::GlobalAvgPool, "se.pool", {x}), c, 4, 1, 1, 0, "silu");
    const int gate = se.conv("se.conv_expand", hidden, 4, c, 1, 1, 0, "sigmoid");
    const int gated = se.b.node(Op::Mul, "se.gate", {x, gate});
    out.push_back(se.done(se.conv("conv_pwl", gated, c, 24, 1, 1, 0, "none"), code, "se."));
  }
}

}  // namespace

void add_group_cases(std::vector<OpCase>& out) {
  for (DType dt : kCaseTypes)
    for (int64_t n : {int64_t(1), int64_t(3)}) {
      const std::string bt = "b" + std::to_string(n);
      for (int64_t stride : {int64_t(1), int64_t(2)}) {  // residual from another conv: the shortcut of a bottleneck
        Group gr("conv_bias_act_residual", bt + "_s" + std::to_string(stride), dt);
        const int x = gr.b.input("x", {n, 13, 7, 6});
        const int skip = gr.conv("downsample", x, 13, 24, 1, stride, 0, "none");
        out.push_back(gr.done(gr.conv("conv", x, 13, 24, 3, stride, 1, "relu", skip)));
      }
      struct AddConv {
        const char* tag;
        int64_t k, groups;
      };
      for (const AddConv& ac : {AddConv{"3x3", 3, 1}, AddConv{"1x1", 1, 1}, AddConv{"dw3x3", 3, 13}}) {
        Group gr("conv_input_add", std::string(ac.tag) + "_" + bt, dt);
        const int sum = gr.b.node(Op::Add, "add", {gr.b.input("a", {n, 13, 6, 5}), gr.b.input("b", {n, 13, 6, 5})});
        out.push_back(gr.done(gr.conv("conv", sum, 13, 13, ac.k, 1, ac.k / 2, "relu", -1, ac.groups)));
      }
      for (int64_t w : {int64_t(13), int64_t(16)}) {
        out.push_back(res2net(dt, n, false, w));
        out.push_back(res2net(dt, n, true, w));
        for (DType code : {DType::F8E4M3, DType::I8}) {
          out.push_back(res2net(dt, n, false, w, code));
          out.push_back(res2net(dt, n, true, w, code));
        }
      }
      for (DType code : {DType::F8E4M3, DType::I8}) add_code_writer_groups(out, dt, n, code);
      // RT-DETR's post-norm residual, layer_norm(x + r), and its query +
      // position after the norm: CUDA runs both adds inside the layer norm's
      // launch (plan_norm_adds); rows of 256 as r18vd's.
      for (const Shape& s : {Shape{n, 300, 256}, Shape{n, 5, 13}, Shape{n, 24}})
        for (bool with_pos : {false, true}) {
          Group gr(with_pos ? "residual_layer_norm_pos" : "residual_layer_norm", shape_tag(s), dt);
          const int64_t ch = s.back();
          const int sum = gr.b.node(Op::Add, "residual", {gr.b.input("x", s), gr.b.input("r", s)});
          gr.c.input_lo = 1.f, gr.c.input_hi = 2.f;  // the sum's mean 3: the mean subtraction matters
          const int y = gr.b.node(Op::LayerNorm, "norm", {sum, gr.b.weight("weight", {ch}, 0.5f, 1.5f),
                                                           gr.b.weight("bias", {ch}, -0.5f, 0.5f)},
                                  {{"eps", 1e-5}});
          if (!with_pos) {
            out.push_back(gr.done(y));
            continue;
          }
          const int query = gr.b.node(Op::Add, "pos_add", {y, gr.b.input("pos", s)});
          gr.c.graph = gr.b.finish(std::vector<int>{y, query});
          mark_fusions(gr.c.graph, FusionOptions{});
          out.push_back(std::move(gr.c));
        }
      // RT-DETR's encoder output: a 16-bit layer norm read as it is and as an
      // f32 copy (the score head's f32 island): CUDA writes both in one launch.
      if (dt != DType::F32) {
        Group gr("layer_norm_widen", bt, dt);
        const Shape s{n, 40, 24};
        const int y = gr.b.node(Op::LayerNorm, "enc_output.1", {gr.b.input("x", s), gr.b.weight("weight", {24}, 0.5f, 1.5f),
                                                               gr.b.weight("bias", {24}, -0.5f, 0.5f)},
                                {{"eps", 1e-5}});
        const int wide = gr.b.node(Op::Cast, "enc_output.1.to_f32", {y}, {{"dtype", std::string("f32")}});
        gr.c.graph = gr.b.finish(std::vector<int>{y, wide});
        mark_fusions(gr.c.graph, FusionOptions{});
        out.push_back(std::move(gr.c));
      }
      // RT-DETR's FPN: nearest 2x upsample of the lateral map, concatenated with
      // the backbone level. 16 + 8 channels move as 16-byte words; 3 + 5
      // channels one element at a time, the upsampled input second, 2x1.
      struct UpCat {
        const char* tag;
        int64_t c_up, c_other, sh, sw;
        bool up_first, up_is_output;
      };
      for (const UpCat& u : {UpCat{"c16_c8", 16, 8, 2, 2, true, false}, UpCat{"c5_c3_2x1", 3, 5, 2, 1, false, false},
                             UpCat{"c16_c8_kept", 16, 8, 2, 2, true, true}}) {
        Group gr("upsample_concat", std::string(u.tag) + "_" + bt, dt);
        const int small = gr.b.input("lateral", {n, u.c_up, 3, 4});
        const int up = gr.b.node(Op::UpsampleNearest, "fpn_up", {small}, {{"scales", std::vector<int64_t>{u.sh, u.sw}}});
        const int level = gr.b.input("level", {n, u.c_other, 3 * u.sh, 4 * u.sw});
        const std::vector<int> ins = u.up_first ? std::vector<int>{up, level} : std::vector<int>{level, up};
        const int cat = gr.b.node(Op::Concat, "fpn_cat", ins, {{"axis", int64_t(1)}});
        if (!u.up_is_output) {
          out.push_back(gr.done(cat));
          continue;
        }
        gr.c.graph = gr.b.finish(std::vector<int>{cat, up});
        mark_fusions(gr.c.graph, FusionOptions{});
        out.push_back(std::move(gr.c));
      }
      // Chains of small linears, each read by the next alone: RT-DETR's query
      // position head (4 -> 64 -> 32 here) and box head (32 -> 32 -> 32 -> 4),
      // odd widths (20 -> 50 -> 12), and widths past one batch of k pairs and
      // past one tile per warp of a 4-block cluster (288 -> 320 -> 256 -> 8).
      // CUDA runs each chain as one mlp_chain launch (plan_mlp_chains, 16-bit).
      struct Chain {
        const char* tag;
        int64_t rows;
        std::vector<int64_t> widths;
      };
      for (const Chain& ch : {Chain{"query_pos", 30, {4, 64, 32}}, Chain{"box_head", 30, {32, 32, 32, 4}},
                              Chain{"odd", 21, {20, 50, 12}}, Chain{"wide", 37, {288, 320, 256, 8}},
                              Chain{"rows400", 400, {32, 64, 8}}}) {
        Group gr("mlp_chain", std::string(ch.tag) + "_" + bt, dt);
        int x = gr.b.input("x", {n, ch.rows, ch.widths[0]});
        for (size_t l = 0; l + 1 < ch.widths.size(); ++l) {
          const int64_t k = ch.widths[l], m = ch.widths[l + 1];
          const float wr = 1.7f / std::sqrt(static_cast<float>(k));
          Attrs a;
          if (l + 2 < ch.widths.size()) a["activation"] = std::string("relu");
          x = gr.b.node(Op::Linear, "layers." + std::to_string(l),
                        {x, gr.b.weight("w" + std::to_string(l), {m, k}, -wr, wr), gr.b.weight("b" + std::to_string(l), {m}, -0.3f, 0.3f)},
                        a);
        }
        out.push_back(gr.done(x));
      }
      // The same chains ending in RT-DETR's post-norm residual: y = layer_norm(h
      // + L(x)) with the query + position after it (an out_proj), and the FFN
      // fc1 (ReLU; AIFI's GELU) -> fc2 with the residual and an f32 copy of y;
      // widths as r18vd's (256, FFN 1024) and odd ones. CUDA runs each as one
      // mlp_chain launch with the norm inside (plan_norm_adds, plan_mlp_chains).
      struct NormChain {
        const char* tag;
        int64_t rows;
        std::vector<int64_t> widths;
        bool pos, widen;
      };
      for (const NormChain& ch : {NormChain{"out_proj", 30, {256, 256}, true, false},
                                  NormChain{"ffn", 19, {256, 1024, 256}, false, true},
                                  NormChain{"ffn_gelu", 19, {32, 64, 32}, false, false},
                                  NormChain{"odd", 21, {20, 50, 12}, true, true},
                                  // more rows than one block-cluster per 16 rows fills: clusters of 2
                                  // (600 rows at batch 3) and none (1200), as RT-DETR at batch 8
                                  NormChain{"rows200", 200, {64, 32}, true, false},
                                  NormChain{"rows400", 400, {64, 128, 32}, false, true}}) {
        Group gr("mlp_chain_norm", std::string(ch.tag) + "_" + bt, dt);
        const int64_t c = ch.widths.back();
        int x = gr.b.input("x", {n, ch.rows, ch.widths[0]});
        for (size_t l = 0; l + 1 < ch.widths.size(); ++l) {
          const int64_t k = ch.widths[l], m = ch.widths[l + 1];
          const float wr = 1.7f / std::sqrt(static_cast<float>(k));
          Attrs a;
          if (l + 2 < ch.widths.size()) a["activation"] = std::string(std::string(ch.tag) == "ffn_gelu" ? "gelu" : "relu");
          x = gr.b.node(Op::Linear, "layers." + std::to_string(l),
                        {x, gr.b.weight("w" + std::to_string(l), {m, k}, -wr, wr), gr.b.weight("b" + std::to_string(l), {m}, -0.3f, 0.3f)},
                        a);
        }
        const int sum = gr.b.node(Op::Add, "residual", {gr.b.input("h", {n, ch.rows, c}), x});
        const int y = gr.b.node(Op::LayerNorm, "norm", {sum, gr.b.weight("ln.w", {c}, 0.5f, 1.5f), gr.b.weight("ln.b", {c}, -0.5f, 0.5f)},
                                {{"eps", 1e-5}});
        std::vector<int> outs = {y};
        if (ch.pos) outs.push_back(gr.b.node(Op::Add, "pos_add", {y, gr.b.input("pos", {n, ch.rows, c})}));
        if (ch.widen && dt != DType::F32) outs.push_back(gr.b.node(Op::Cast, "norm.to_f32", {y}, {{"dtype", std::string("f32")}}));
        gr.c.graph = gr.b.finish(outs);
        mark_fusions(gr.c.graph, FusionOptions{});
        out.push_back(std::move(gr.c));
      }
      // RT-DETR's memory: the token rows of three levels concatenated, and the
      // concat times a per-token constant (the valid-anchor mask); both are
      // outputs. CUDA: one concat_rows_masked launch (plan_concat_masks), 16-byte
      // words at c 256, single elements at c 12.
      for (int64_t c : {int64_t(256), int64_t(12)}) {
        Group gr("concat_mask", "c" + std::to_string(c) + "_" + bt, dt);
        const int cat = gr.b.node(Op::Concat, "memory",
                                  {gr.b.input("level0", {n, 20, c}), gr.b.input("level1", {n, 6, c}), gr.b.input("level2", {n, 3, c})},
                                  {{"axis", int64_t(1)}});
        const int masked = gr.b.node(Op::Mul, "memory.masked", {cat, gr.b.weight("mask", {1, 29, 1}, -1.f, 1.f)});
        gr.c.graph = gr.b.finish(std::vector<int>{cat, masked});
        mark_fusions(gr.c.graph, FusionOptions{});
        out.push_back(std::move(gr.c));
      }
      // A post-norm's one projection: y = layer_norm(h + L(x)) (+ query
      // position, + f32 copy) at r18vd's widths (300 decoder queries, 400 AIFI
      // tokens) and a narrow one with ReLU. CUDA (16-bit, switch linear_norm on
      // in the harness): one small_gemm_norm launch (small_gemm.cu).
      struct LinearNorm {
        const char* tag;
        int64_t rows, k, c;
        bool relu, pos, widen;
      };
      for (const LinearNorm& ln : {LinearNorm{"out_proj", 300, 256, 256, false, true, false},
                                   LinearNorm{"aifi", 400, 256, 256, false, false, true},
                                   LinearNorm{"narrow_relu", 33, 64, 48, true, true, true}}) {
        Group gr("linear_norm", std::string(ln.tag) + "_" + bt, dt);
        const float wr = 1.7f / std::sqrt(static_cast<float>(ln.k));
        Attrs a;
        if (ln.relu) a["activation"] = std::string("relu");
        const int proj = gr.b.node(Op::Linear, "out_proj",
                                   {gr.b.input("x", {n, ln.rows, ln.k}), gr.b.weight("w", {ln.c, ln.k}, -wr, wr),
                                    gr.b.weight("b", {ln.c}, -0.3f, 0.3f)},
                                   a);
        const int sum = gr.b.node(Op::Add, "residual", {gr.b.input("h", {n, ln.rows, ln.c}), proj});
        const int y = gr.b.node(Op::LayerNorm, "norm",
                                {sum, gr.b.weight("ln.w", {ln.c}, 0.5f, 1.5f), gr.b.weight("ln.b", {ln.c}, -0.5f, 0.5f)},
                                {{"eps", 1e-5}});
        std::vector<int> outs = {y};
        if (ln.pos) outs.push_back(gr.b.node(Op::Add, "pos_add", {y, gr.b.input("pos", {n, ln.rows, ln.c})}));
        if (ln.widen && dt != DType::F32) outs.push_back(gr.b.node(Op::Cast, "norm.to_f32", {y}, {{"dtype", std::string("f32")}}));
        gr.c.graph = gr.b.finish(outs);
        mark_fusions(gr.c.graph, FusionOptions{});
        out.push_back(std::move(gr.c));
      }
      // RT-DETR's score head: an f32-island linear (f32 weights and bias) reading
      // a 16-bit value widened; CUDA fuses the cast away and runs a 16-bit
      // product with f32 output, its weights rounded to 16 bits (the error the
      // group limit allows). With ReLU: the epilogue on an f32 output.
      if (dt != DType::F32)
        for (const char* act : {"none", "relu"}) {
          Group gr("wide_linear", std::string(act) + "_" + bt, dt);
          // The 16-bit value comes from a node, as the encoder output's layer norm (an engine
          // input's widening cast is folded into the input copy instead).
          const int y = gr.b.node(Op::LayerNorm, "enc_output.1", {gr.b.input("x", {n, 40, 32}), gr.b.weight("ln.w", {32}, 0.5f, 1.5f),
                                                                 gr.b.weight("ln.b", {32}, -0.5f, 0.5f)},
                                  {{"eps", 1e-5}});
          const int wide = gr.b.node(Op::Cast, "enc_output.1.to_f32", {y}, {{"dtype", std::string("f32")}});
          const float wr = 1.7f / std::sqrt(32.f);
          Attrs a;
          if (std::string(act) != "none") a["activation"] = std::string(act);
          out.push_back(gr.done(gr.b.node(Op::Linear, "enc_score_head",
                                          {wide, gr.b.weight_as("w", DType::F32, {24, 32}, -wr, wr),
                                           gr.b.weight_as("b", DType::F32, {24}, -0.5f, 0.5f)},
                                          a)));
        }
      // The reference points before the first layer: sigmoid in f32 and its
      // narrowing cast, one box_refine launch on CUDA (no inverse_sigmoid term).
      if (dt != DType::F32) {
        Group gr("sigmoid_narrow", bt, dt);
        const int y = gr.b.node(Op::Activation, "reference_points.sigmoid", {gr.b.input_as("picked", DType::F32, {n, 30, 4})},
                                {{"activation", std::string("sigmoid")}});
        const int narrow = gr.b.node(Op::Cast, "reference_points.sigmoid.to_narrow", {y}, {{"dtype", std::string(dtype_name(dt))}});
        gr.c.input_range["picked"] = {-6.f, 6.f};
        gr.c.graph = gr.b.finish(std::vector<int>{y, narrow});
        mark_fusions(gr.c.graph, FusionOptions{});
        out.push_back(std::move(gr.c));
      }
      // RT-DETR's decoder between layers: box head chain (32 -> 32 -> 32 -> 4)
      // -> box refinement in f32 (inverse_sigmoid of the old reference, or the
      // picked anchors' logits added as they are before the first layer) ->
      // narrowed -> query position chain (4 -> 64 -> 32) -> query + position.
      // CUDA (16-bit) runs it all as one mlp_chain launch (plan_mlp_chains' links).
      if (dt != DType::F32)
        for (const char* form : {"inverse", "anchors"}) {
          Group gr("mlp_chain_refine", std::string(form) + "_" + bt, dt);
          const Shape boxes{n, 30, 4};
          const int h = gr.b.input("h", {n, 30, 32});
          auto linear = [&](const std::string& name, int x, int64_t k, int64_t m, bool relu) {
            const float wr = 1.7f / std::sqrt(static_cast<float>(k));
            Attrs a;
            if (relu) a["activation"] = std::string("relu");
            return gr.b.node(Op::Linear, name, {x, gr.b.weight(name + ".w", {m, k}, -wr, wr), gr.b.weight(name + ".b", {m}, -0.3f, 0.3f)}, a);
          };
          int d = linear("bbox.0", h, 32, 32, true);
          d = linear("bbox.1", d, 32, 32, true);
          d = linear("bbox.2", d, 32, 4, false);
          const int wide = gr.b.node(Op::Cast, "bbox.to_f32", {d}, {{"dtype", std::string("f32")}});
          const int ref = gr.b.input_as("ref", DType::F32, boxes);
          const bool inverse = std::string(form) == "inverse";
          const int term = inverse ? gr.b.node(Op::InverseSigmoid, "inverse_sigmoid", {ref}, {{"eps", 1e-5}}) : ref;
          const int y = gr.b.node(Op::Add, "refine", {wide, term}, {{"activation", std::string("sigmoid")}});
          const int narrow = gr.b.node(Op::Cast, "refine.to_narrow", {y}, {{"dtype", std::string(dtype_name(dt))}});
          int pos = linear("query_pos.0", narrow, 4, 64, true);
          pos = linear("query_pos.1", pos, 64, 32, false);
          const int qk = gr.b.node(Op::Add, "pos_add", {h, pos});
          gr.c.input_range["ref"] = inverse ? std::pair<float, float>{-0.05f, 1.05f} : std::pair<float, float>{-4.f, 4.f};
          gr.c.graph = gr.b.finish(std::vector<int>{narrow, pos, qk});
          mark_fusions(gr.c.graph, FusionOptions{});
          out.push_back(std::move(gr.c));
        }
      // RT-DETR's box refinement in its f32 island: ref' = sigmoid(f32(delta) +
      // inverse_sigmoid(ref)), and ref' narrowed for the next layer in 16-bit
      // graphs; CUDA runs the four nodes as one box_refine launch
      // (plan_box_refines). ref spills past [0, 1] (the clamp).
      for (const char* act : {"sigmoid", "none"}) {
        Group gr("box_refine", std::string(act) + "_" + bt, dt);
        const Shape s{n, 30, 4};
        int delta = gr.b.input("delta", s);
        if (dt != DType::F32) delta = gr.b.node(Op::Cast, "delta.to_f32", {delta}, {{"dtype", std::string("f32")}});
        const int ref = gr.b.input_as("ref", DType::F32, s);
        const int inv = gr.b.node(Op::InverseSigmoid, "inverse_sigmoid", {ref}, {{"eps", 1e-5}});
        Attrs a;
        if (std::string(act) != "none") a["activation"] = std::string(act);
        const int y = gr.b.node(Op::Add, "refine", {delta, inv}, a);
        gr.c.input_range["delta"] = {-3.f, 3.f};
        gr.c.input_range["ref"] = {-0.05f, 1.05f};
        if (dt == DType::F32) {
          out.push_back(gr.done(y));
          continue;
        }
        const int narrow = gr.b.node(Op::Cast, "refine.to_narrow", {y}, {{"dtype", std::string(dtype_name(dt))}});
        gr.c.graph = gr.b.finish(std::vector<int>{y, narrow});
        mark_fusions(gr.c.graph, FusionOptions{});
        out.push_back(std::move(gr.c));
      }
      struct Se {
        const char* tag;
        int64_t c, cr;
        const char* act;
      };
      for (const Se& s : {Se{"c24_r6_silu", 24, 6, "silu"}, Se{"c13_r3_relu", 13, 3, "relu"}}) {
        Group gr("squeeze_excitation", std::string(s.tag) + "_" + bt, dt);
        const int x = gr.b.input("x", {n, s.c, 5, 4});
        const int pooled = gr.b.node(Op::GlobalAvgPool, "se.pool", {x});
        const int hidden = gr.conv("se.conv_reduce", pooled, s.c, s.cr, 1, 1, 0, s.act);
        const int gate = gr.conv("se.conv_expand", hidden, s.cr, s.c, 1, 1, 0, "sigmoid");
        out.push_back(gr.done(gr.b.node(Op::Mul, "se.gate", {x, gate})));
      }
      {
        Group gr("slice_concat_views", "swap_" + bt, dt);
        const int t = gr.conv("conv1", gr.b.input("x", {n, 24, 5, 5}), 24, 26, 1, 1, 0, "relu");
        const int cat = gr.b.node(Op::Concat, "cat", {gr.slice("hi", t, 13, 26), gr.slice("lo", t, 0, 13)}, {{"axis", int64_t(1)}});
        out.push_back(gr.done(gr.conv("conv2", cat, 26, 12, 3, 1, 1, "none")));
      }
      for (int64_t k : {int64_t(13), int64_t(24)}) {
        Group gr("flatten_linear", "k" + std::to_string(k) + "_" + bt, dt);
        const int flat = gr.b.node(Op::Flatten, "flatten", {gr.b.input("x", {n, k, 1, 1})});
        const float wr = 1.7f / std::sqrt(static_cast<float>(k));
        std::vector<int> ins = {flat, gr.b.weight("fc.w", {37 - k, k}, -wr, wr)};
        Attrs a;
        if (k == 13) ins.push_back(gr.b.weight("fc.b", {37 - k}, -0.5f, 0.5f)), a["activation"] = std::string("relu");
        out.push_back(gr.done(gr.b.node(Op::Linear, "fc", ins, a)));
      }
      {
        Group gr("classifier_head", bt, dt);
        const int pooled = gr.b.node(Op::GlobalAvgPool, "pool", {gr.b.input("x", {n, 24, 3, 3})});
        const int flat = gr.b.node(Op::Flatten, "flatten", {pooled});
        const float wr = 1.7f / std::sqrt(24.f);
        out.push_back(gr.done(gr.b.node(Op::Linear, "fc", {flat, gr.b.weight("fc.w", {10, 24}, -wr, wr), gr.b.weight("fc.b", {10}, -0.5f, 0.5f)})));
      }
    }
}

}  // namespace kiln::ops
