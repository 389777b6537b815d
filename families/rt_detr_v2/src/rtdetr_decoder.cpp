// rt_detr_v2: query selection (RTDetrV2Model.forward after the encoder) and
// the decoder (RTDetrV2Decoder with box refinement), as transformers runs them.
#include <cfloat>
#include <cmath>

#include "core/error.hpp"
#include "families/rt_detr_v2/src/rtdetr_graph.hpp"

namespace kiln::rtdetr {

namespace {

// RTDetrV2MLPPredictionHead: linear layers, ReLU between them. `node` names
// the nodes (the query position head is shared by every decoder layer).
int mlp(Ctx& c, const std::string& p, int x, const std::string& node = "") {
  int n = 0;
  while (c.b.has(cat(p, ".layers.", n, ".weight"))) ++n;
  if (n == 0) fail_input(kFamily, ": missing tensor '", p, ".layers.0.weight'");
  for (int i = 0; i < n; ++i) {
    const std::string l = cat(p, ".layers.", i);
    Attrs a;
    if (i + 1 < n) a["activation"] = std::string("relu");
    x = c.g().add_node(Op::Linear, node.empty() ? l : cat(node, ".", i), {x, c.b.weight(l + ".weight"), c.b.weight(l + ".bias")}, a);
  }
  return x;
}

// Marks the nodes producing `values` (and, through reshapes, what they view)
// as f32 islands of 16-bit engines (set_precision): the anchors with their
// FLT_MAX fill, the encoder's class scores and top-k, and the reference-point
// chain, whose 16-bit rounding moves boxes and top-k picks (README "fp16 engines").
void keep_f32(Ctx& c, std::initializer_list<int> values) {
  for (int v : values) {
    int p = c.g().values[v].producer;
    while (p >= 0) {
      Node& n = c.g().nodes[p];
      n.attrs["precision"] = std::string("f32");
      if (n.op != Op::Reshape) break;
      p = c.g().values[n.inputs[0]].producer;
    }
  }
}

struct Anchors {
  HostTensor logits;  // [S, 4]: log(a / (1 - a)), FLT_MAX where invalid
  HostTensor valid;   // [S, 1]: 1 or 0
  bool all_valid = true;
};

// generate_anchors in f32 as torch computes it: xy = ((i + 0.5) / w, (j + 0.5) / h),
// wh = 0.05 * 2^level, valid = all(0.01 < a < 0.99).
Anchors make_anchors(const std::vector<std::pair<int64_t, int64_t>>& levels) {
  std::vector<float> a, v;
  for (size_t l = 0; l < levels.size(); ++l) {
    const auto [h, w] = levels[l];
    const float wh = 0.05f * std::ldexp(1.0f, static_cast<int>(l));
    for (int64_t j = 0; j < h; ++j)
      for (int64_t i = 0; i < w; ++i) {
        const float box[4] = {(static_cast<float>(i) + 0.5f) / static_cast<float>(w),
                              (static_cast<float>(j) + 0.5f) / static_cast<float>(h), wh, wh};
        bool ok = true;
        for (float f : box) ok = ok && f > 0.01f && f < 0.99f;
        for (float f : box) a.push_back(ok ? std::log(f / (1.0f - f)) : FLT_MAX);
        v.push_back(ok ? 1.f : 0.f);
      }
  }
  Anchors r;
  const int64_t s = static_cast<int64_t>(v.size());
  for (float f : v) r.all_valid = r.all_valid && f == 1.f;
  r.logits = HostTensor::from_f32({s, 4}, a);
  r.valid = HostTensor::from_f32({s, 1}, v);
  return r;
}

}  // namespace

void decoder(Ctx& c, const std::vector<int>& maps) {
  const Config& cfg = c.cfg;
  const int64_t C = cfg.d_model;
  // Decoder input projections, flattened level after level: memory [B, S, C].
  std::vector<int> tokens;
  std::vector<std::pair<int64_t, int64_t>> levels;
  std::vector<int64_t> spatial;
  for (size_t i = 0; i < maps.size(); ++i) {
    const std::string p = cat("model.decoder_input_proj.", i);
    const int m = c.b.batch_norm(p + ".1", c.b.conv(p + ".0", maps[i]), cfg.batch_norm_eps);
    const Shape s = c.shape(m);
    if (s[1] != C)
      fail_input(kFamily, ": '", p, ".0.weight' gives ", s[1], " channels, config key 'd_model' is ", C, " (", cfg.path, ")");
    levels.emplace_back(s[2], s[3]);
    spatial.push_back(s[2]), spatial.push_back(s[3]);
    tokens.push_back(c.transpose(p + ".tokens", c.reshape(p + ".flatten", m, {-1, C, s[2] * s[3]}), {0, 2, 1}));
  }
  if (cfg.has_anchor_image_size)
    for (size_t l = 0; l < levels.size(); ++l) {
      const int64_t s = cfg.feat_strides.at(l);
      if (cfg.anchor_h / s != levels[l].first || cfg.anchor_w / s != levels[l].second)
        fail_input(cfg.path, ": config key 'anchor_image_size' [", cfg.anchor_h, ", ", cfg.anchor_w, "] does not give level ",
                   l, "'s map ", levels[l].first, "x", levels[l].second, " of this input size");
    }
  const int memory = c.node(Op::Concat, "model.memory", tokens, {{"axis", int64_t{1}}});  // [B, S, C]
  const int64_t S = c.shape(memory)[1];
  const Anchors anchors = make_anchors(levels);

  // memory * valid_mask (skipped when every anchor is valid: an identity).
  int masked = memory;
  if (!anchors.all_valid)
    masked = c.node(Op::Mul, "model.memory.masked", {memory, c.image_constant("model.valid_mask", anchors.valid)});
  int out_memory = c.b.linear("model.enc_output.0", masked);
  out_memory = layer_norm(c, "model.enc_output.1", out_memory);
  const int enc_class = c.b.linear("model.enc_score_head", out_memory);  // [B, S, labels]
  if (c.shape(enc_class)[2] != cfg.num_labels)
    fail_input(kFamily, ": 'model.enc_score_head.weight' has ", c.shape(enc_class)[2], " classes, config num_labels is ",
               cfg.num_labels, " (", cfg.path, ")");
  // top-k of the max class logit per anchor; the max is top_k with k = 1.
  const int best = c.g().add_node_multi(Op::TopK, "model.enc_class_max", {enc_class}, {{"k", int64_t{1}}, {"axis", int64_t{-1}}})[0];
  if (cfg.num_queries > S)
    fail_input(cfg.path, ": config key 'num_queries' ", cfg.num_queries, " exceeds the ", S, " anchors of this input size");
  const int best_rows = c.reshape("model.enc_class_max.rows", best, {-1, S});
  const int topk_ind = c.g().add_node_multi(Op::TopK, "model.topk", {best_rows}, {{"k", cfg.num_queries}, {"axis", int64_t{1}}})[1];
  int h = c.node(Op::Gather, "model.target", {out_memory, topk_ind}, {{"axis", int64_t{1}}});
  // transformers computes the box head on every anchor, adds the anchors and
  // gathers the top-k rows; the head is row-wise, so kiln gathers first and
  // runs it on the num_queries picked rows only (the same numbers: 300 rows
  // instead of 8400 at 640x640), then adds the picked anchors (the constant
  // table [1, S, 4] shared by every image).
  const int anchor_logits = c.image_constant("model.anchors", anchors.logits);
  const int picked_anchors = c.node(Op::Gather, "model.enc_topk_anchors", {anchor_logits, topk_ind}, {{"axis", int64_t{1}}});
  const int picked = c.node(Op::Add, "model.enc_bbox_head.anchors", {mlp(c, "model.enc_bbox_head", h), picked_anchors});
  int ref = c.b.act("model.decoder.reference_points.sigmoid", picked, Activation::Sigmoid);
  keep_f32(c, {enc_class, best_rows, topk_ind, picked_anchors, picked, ref});  // the anchors: a constant only f32 nodes read

  // Decoder layers.
  const int64_t heads = cfg.decoder_heads, hd = C / heads, Q = cfg.num_queries;
  std::vector<int64_t> points(levels.size(), cfg.n_points);
  const int64_t P = cfg.n_points * static_cast<int64_t>(levels.size());
  if (!c.b.has("model.decoder.layers.0.self_attn.q_proj.weight"))
    fail_input(kFamily, ": missing tensor 'model.decoder.layers.0.self_attn.q_proj.weight'");
  if (c.b.has(cat("model.decoder.layers.", cfg.decoder_layers, ".fc1.weight")) ||
      !c.b.has(cat("model.decoder.layers.", cfg.decoder_layers - 1, ".fc1.weight")))
    fail_input(kFamily, ": config key 'decoder_layers' = ", cfg.decoder_layers, " disagrees with the checkpoint's model.decoder.layers.* (",
               cfg.path, ")");
  int logits = -1;
  for (int64_t i = 0; i < cfg.decoder_layers; ++i) {
    const std::string p = cat("model.decoder.layers.", i);
    const int pos = mlp(c, "model.decoder.query_pos_head", ref, p + ".query_pos");
    // self-attention, post-norm
    const int qk = c.node(Op::Add, p + ".self_attn.pos_add", {h, pos});
    h = c.node(Op::Add, p + ".self_attn.residual", {h, self_attention(c, p + ".self_attn", h, qk, heads)});
    h = layer_norm(c, p + ".self_attn_layer_norm", h);
    // multi-scale deformable attention
    const std::string e = p + ".encoder_attn";
    const std::string nps = e + ".n_points_scale";
    if (c.b.has(nps)) {  // transformers' buffer: 1 / n_points per point; the op computes it from `points`
      const std::vector<float> v = c.g().values[c.b.weight(nps)].constant->to_f32();
      bool ok = static_cast<int64_t>(v.size()) == P;
      for (size_t k = 0; ok && k < v.size(); ++k) ok = v[k] == 1.0f / static_cast<float>(cfg.n_points);
      if (!ok) fail_input(kFamily, ": tensor '", nps, "' is not 1/decoder_n_points (", cfg.n_points, ") for each of ", P, " points");
    }
    const int q2 = c.node(Op::Add, e + ".pos_add", {h, pos});
    const int value = c.reshape(e + ".value.heads", c.b.linear(e + ".value_proj", memory), {-1, S, heads, hd});
    const int off = c.b.linear(e + ".sampling_offsets", q2);
    const int lg = c.b.linear(e + ".attention_weights", q2);
    if (c.shape(off)[2] != heads * P * 2 || c.shape(lg)[2] != heads * P)
      fail_input(kFamily, ": '", e, ".sampling_offsets.weight' / '.attention_weights.weight' give ", c.shape(off)[2], " / ",
                 c.shape(lg)[2], " outputs; heads ", heads, " x levels ", levels.size(), " x points ", cfg.n_points,
                 " needs ", heads * P * 2, " / ", heads * P, " (", cfg.path, ")");
    int att = c.node(Op::MsDeformAttn, e + ".core",
                     {value, ref, c.reshape(e + ".offsets", off, {-1, Q, heads, P, 2}),
                      c.reshape(e + ".logits", lg, {-1, Q, heads, P})},
                     {{"spatial_shapes", spatial},
                      {"points", points},
                      {"offset_scale", cfg.offset_scale},
                      {"method", cfg.decoder_method}});
    att = c.b.linear(e + ".output_proj", att);
    h = layer_norm(c, p + ".encoder_attn_layer_norm", c.node(Op::Add, e + ".residual", {h, att}));
    // FFN
    int f = c.g().add_node(Op::Linear, p + ".fc1", {h, c.b.weight(p + ".fc1.weight"), c.b.weight(p + ".fc1.bias")},
                           {{"activation", std::string(activation_name(cfg.decoder_act))}});
    f = c.b.linear(p + ".fc2", f);
    h = layer_norm(c, p + ".final_layer_norm", c.node(Op::Add, p + ".ffn.residual", {h, f}));
    // box refinement: ref = sigmoid(bbox_embed[i](h) + inverse_sigmoid(ref))
    const std::string bb = cat("model.decoder.bbox_embed.", i);
    const int inv = c.node(Op::InverseSigmoid, bb + ".inverse_sigmoid", {ref}, {{"eps", 1e-5}});
    const int sum = c.node(Op::Add, bb + ".add", {mlp(c, bb, h), inv});
    ref = c.b.act(bb + ".sigmoid", sum, Activation::Sigmoid);
    keep_f32(c, {inv, sum, ref});
    if (i + 1 == cfg.decoder_layers) logits = c.b.linear(cat("model.decoder.class_embed.", i), h);
  }
  // Intermediate class heads are training outputs: marked used, not built.
  for (int64_t i = 0; i + 1 < cfg.decoder_layers; ++i)
    for (const char* part : {".weight", ".bias"}) c.b.weight(cat("model.decoder.class_embed.", i, part));
  c.g().values[logits].name = "logits";
  c.g().values[ref].name = "pred_boxes";
  c.g().mark_output(logits);
  c.g().mark_output(ref);
}

}  // namespace kiln::rtdetr
