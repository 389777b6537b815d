// Fused groups: the node patterns the backends lower as one unit or with
// shared buffers, each checked end to end against the reference.
//  - conv + bias + act + residual where the residual is another conv's output
//  - the Res2Net chain add fused into the conv that reads it (fusion mark input_add)
//  - a Res2Net block and a stride-2 stage block: slices as channel views,
//    3x3 outputs written in place into the concat, CUDA's window conv (f16/bf16)
//  - squeeze-excitation (GlobalAvgPool -> conv -> act -> conv -> sigmoid -> mul: se_plan.cpp)
//  - slices read back by a concat in another order
//  - flatten -> linear and global pool -> flatten -> linear (CUDA's linear path)
#include <cmath>

#include "op_harness.hpp"
#include "passes/pass.hpp"

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
  // group as one unit where they can (the marks are what they read).
  OpCase done(int out) {
    c.graph = b.finish(out);
    mark_fusions(c.graph, FusionOptions{});
    return std::move(c);
  }
};

// Res2Net bottleneck, scale 4, width w: 1x1 -> 4 chunks -> 3x3 convs with the
// chain adds (y_i = conv(y_{i-1} + x_i)) -> concat with the last chunk -> 1x1
// with the block input as residual. stage: the first block of a stage, with
// stride 2, no chain adds and the last chunk through a 3x3 average pool.
// Width 13 as in no real model (awkward: CUDA copies the chunks); width 16
// (a multiple of 8, as pad_channels makes Res2Net's 26) lets CUDA's window
// conv take the block in f16/bf16.
OpCase res2net(DType dt, int64_t n, bool stage, int64_t w) {
  const int64_t c = 24, hw = stage ? 8 : 6;
  Group gr(stage ? "res2net_stage" : "res2net_block", "w" + std::to_string(w) + "_b" + std::to_string(n), dt);
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
  return gr.done(gr.conv("conv3", cat, 4 * w, c, 1, 1, 0, stage ? "none" : "relu", stage ? -1 : x));
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
