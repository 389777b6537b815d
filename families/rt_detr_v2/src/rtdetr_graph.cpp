// rt_detr_v2: the ResNet-vd backbone (transformers' RTDetrResNetBackbone) and
// the hybrid encoder (RTDetrV2HybridEncoder: input projections, AIFI, FPN, PAN).
#include "families/rt_detr_v2/src/rtdetr_graph.hpp"

#include <algorithm>
#include <cmath>

#include "core/error.hpp"

namespace kiln::rtdetr {

namespace {

constexpr double kBackboneBnEps = 1e-5;  // FrozenBatchNorm2d's fixed eps

int avg_down(Ctx& c, const std::string& name, int x) {  // nn.AvgPool2d(2, 2, 0, ceil_mode=True)
  return c.node(Op::AvgPool2d, name, {x},
                {{"kernel", std::vector<int64_t>{2, 2}},
                 {"strides", std::vector<int64_t>{2, 2}},
                 {"ceil_mode", int64_t{1}},
                 {"count_include_pad", int64_t{0}}});
}

// RTDetrResNetConvLayer: conv (padding k // 2, no bias) + BN + activation.
int conv_layer(Ctx& c, const std::string& p, int x, int stride, Activation a) {
  int y = c.b.batch_norm(p + ".normalization", c.b.conv(p + ".convolution", x, {stride}), kBackboneBnEps);
  return a == Activation::None ? y : c.b.act(p + ".act", y, a);
}

// The block's shortcut, read from its tensors: "shortcut.convolution" (1x1 at
// the block's stride), "shortcut.1.convolution" (AvgPool(2, 2, ceil) then 1x1),
// none (identity, or the bare AvgPool of a stride-2 bottleneck).
int shortcut(Ctx& c, const std::string& p, int x, int stride) {
  if (c.b.has(p + ".shortcut.convolution.weight")) return conv_layer(c, p + ".shortcut", x, stride, Activation::None);
  if (c.b.has(p + ".shortcut.1.convolution.weight"))
    return conv_layer(c, p + ".shortcut.1", avg_down(c, p + ".shortcut.0", x), 1, Activation::None);
  return stride == 2 ? avg_down(c, p + ".shortcut.0", x) : x;
}

int block(Ctx& c, const std::string& p, int x, int stride) {
  const Activation a = c.cfg.backbone_act;
  const int skip = shortcut(c, p, x, stride);
  int y;
  if (c.cfg.layer_type == "basic") {
    y = conv_layer(c, p + ".layer.0", x, stride, a);
    y = conv_layer(c, p + ".layer.1", y, 1, Activation::None);
  } else {
    const bool first = c.cfg.downsample_in_bottleneck;
    y = conv_layer(c, p + ".layer.0", x, first ? stride : 1, a);
    y = conv_layer(c, p + ".layer.1", y, first ? 1 : stride, a);
    y = conv_layer(c, p + ".layer.2", y, 1, Activation::None);
  }
  if (c.shape(y) != c.shape(skip))
    fail_input(kFamily, ": block '", p, "' output ", shape_str(c.shape(y)), " does not match its shortcut ",
               shape_str(c.shape(skip)), " (layer_type '", c.cfg.layer_type, "' in ", c.cfg.path, ", or a missing '", p,
               ".shortcut.*' tensor?)");
  y = c.node(Op::Add, p + ".add", {y, skip});
  return c.b.act(p + ".act", y, a);
}

// RTDetrV2ConvNormLayer: conv (padding (k - 1) / 2) + BN(batch_norm_eps) + activation.
int conv_norm(Ctx& c, const std::string& p, int x, int stride, Activation a) {
  int y = c.b.batch_norm(p + ".norm", c.b.conv(p + ".conv", x, {stride}), c.cfg.batch_norm_eps);
  return a == Activation::None ? y : c.b.act(p + ".act", y, a);
}

// RTDetrV2CSPRepLayer: conv3(bottlenecks(conv1(x)) + conv2(x)); each RepVgg
// bottleneck is act(BN(3x3 a) + BN(1x1 a)) (fold_batchnorm folds each BN; the
// add fuses into the 3x3 as its residual).
int csp_rep(Ctx& c, const std::string& p, int x) {
  const Activation a = c.cfg.act;
  int h1 = conv_norm(c, p + ".conv1", x, 1, a);
  for (int i = 0; c.b.has(cat(p, ".bottlenecks.", i, ".conv1.conv.weight")); ++i) {
    const std::string q = cat(p, ".bottlenecks.", i);
    const int y3 = conv_norm(c, q + ".conv1", h1, 1, Activation::None);
    const int y1 = conv_norm(c, q + ".conv2", h1, 1, Activation::None);
    h1 = c.b.act(q + ".act", c.node(Op::Add, q + ".add", {y3, y1}), a);
  }
  const int h2 = conv_norm(c, p + ".conv2", x, 1, a);
  const int sum = c.node(Op::Add, p + ".add", {h1, h2});
  return c.b.has(p + ".conv3.conv.weight") ? conv_norm(c, p + ".conv3", sum, 1, a) : sum;
}

// build_2d_sinusoidal_position_embedding(h, w, dim, temperature) in double,
// rounded to f32: [h*w, dim], rows y-major, [sin(y w), cos(y w), sin(x w), cos(x w)].
HostTensor sincos_2d(int64_t h, int64_t w, int64_t dim, double temperature) {
  const int64_t q = dim / 4;
  std::vector<float> pe(static_cast<size_t>(h * w * dim));
  for (int64_t y = 0; y < h; ++y)
    for (int64_t x = 0; x < w; ++x) {
      float* row = &pe[static_cast<size_t>((y * w + x) * dim)];
      for (int64_t d = 0; d < q; ++d) {
        const double omega = 1.0 / std::pow(temperature, static_cast<double>(d) / static_cast<double>(q));
        row[d] = static_cast<float>(std::sin(y * omega));
        row[q + d] = static_cast<float>(std::cos(y * omega));
        row[2 * q + d] = static_cast<float>(std::sin(x * omega));
        row[3 * q + d] = static_cast<float>(std::cos(x * omega));
      }
    }
  return HostTensor::from_f32({h * w, dim}, pe);
}

}  // namespace

int Ctx::image_constant(const std::string& name, const HostTensor& c) {
  HostTensor one = c;
  one.shape.insert(one.shape.begin(), 1);
  return b.graph().add_constant(name, std::move(one));
}

// Multi-head self-attention as transformers' RTDetrV2SelfAttention: q, k from
// qk_in, v from x; softmax(q k^T * head_dim^-0.5) v, out_proj. The core is one
// attention node (ops.def): heads split, scores, softmax and the weighted sum
// in one op, read from and written to the [B, L, C] token layout.
int self_attention(Ctx& c, const std::string& p, int x, int qk_in, int64_t heads) {
  const Shape xs = c.shape(x);  // [B, L, C]
  const int64_t hd = xs[2] / heads;
  // transformers scales the projected queries by head_dim^-0.5; the attention op applies it to the scores.
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  const int q = c.b.linear(p + ".q_proj", qk_in);
  const int k = c.b.linear(p + ".k_proj", qk_in);
  const int v = c.b.linear(p + ".v_proj", x);
  const int o = c.node(Op::Attention, p + ".attention", {q, k, v}, {{"heads", heads}, {"scale", scale}});
  return c.b.linear(p + ".out_proj", o);
}

std::map<std::string, std::vector<std::string>> quant_parts() {
  // The study's seven groups (its counts for r18vd with 3 decoder layers in
  // brackets; kiln's graph has what the forward pass computes: the box head
  // of every layer, the class head of the last, the query position head per
  // layer). The convs are the built-in prefix parts (model.backbone,
  // model.encoder, ...).
  return {
      {"aifi", {"model.encoder.encoder.*.layers.*"}},                           // 6: q, k, v, out, fc1, fc2
      {"decoder_self", {"model.decoder.layers.*.self_attn.*_proj"}},            // 12
      {"decoder_value", {"model.decoder.layers.*.encoder_attn.value_proj",      // 6
                         "model.decoder.layers.*.encoder_attn.output_proj"}},
      {"decoder_sampling", {"model.decoder.layers.*.encoder_attn.sampling_offsets",  // 6
                            "model.decoder.layers.*.encoder_attn.attention_weights"}},
      {"decoder_ffn", {"model.decoder.layers.*.fc1", "model.decoder.layers.*.fc2"}},  // 6
      {"query_select", {"model.enc_output.*", "model.enc_score_head", "model.enc_bbox_head.*"}},  // 4 (kiln: 5)
      {"refine", {"model.decoder.layers.*.query_pos.*", "model.decoder.bbox_embed.*", "model.decoder.class_embed.*"}},  // 10
  };
}

int layer_norm(Ctx& c, const std::string& p, int x) {
  return c.node(Op::LayerNorm, p, {x, c.b.weight(p + ".weight"), c.b.weight(p + ".bias")}, {{"eps", c.cfg.layer_norm_eps}});
}

namespace {

// One post-norm RTDetrV2EncoderLayer on tokens x [B, L, C] with position pos.
int encoder_layer(Ctx& c, const std::string& p, int x, int pos) {
  const int qk = c.node(Op::Add, p + ".pos_add", {x, pos});
  int h = c.node(Op::Add, p + ".self_attn.residual",
                 {x, self_attention(c, p + ".self_attn", x, qk, c.cfg.encoder_attention_heads)});
  h = layer_norm(c, p + ".self_attn_layer_norm", h);
  int f = c.g().add_node(Op::Linear, p + ".fc1", {h, c.b.weight(p + ".fc1.weight"), c.b.weight(p + ".fc1.bias")},
                         {{"activation", std::string(activation_name(c.cfg.encoder_act))}});
  f = c.b.linear(p + ".fc2", f);
  return layer_norm(c, p + ".final_layer_norm", c.node(Op::Add, p + ".ffn.residual", {h, f}));
}

// RTDetrV2AIFILayer on map x [B, C, h, w]: tokens y-major, sin-cos position.
int aifi(Ctx& c, const std::string& p, int x) {
  const Shape s = c.shape(x);
  const int64_t C = s[1], h = s[2], w = s[3];
  if (C % 4 != 0) fail_input(kFamily, ": encoder_hidden_dim ", C, " must divide by 4 (2-D sin-cos position embedding)");
  int t = c.transpose(p + ".tokens", c.reshape(p + ".flatten", x, {-1, C, h * w}), {0, 2, 1});
  const int pos = c.image_constant(p + ".position_embedding", sincos_2d(h, w, C, c.cfg.positional_encoding_temperature));
  for (int j = 0; c.b.has(cat(p, ".layers.", j, ".fc1.weight")); ++j) t = encoder_layer(c, cat(p, ".layers.", j), t, pos);
  return c.reshape(p + ".unflatten", c.transpose(p + ".channels", t, {0, 2, 1}), {-1, C, h, w});
}

}  // namespace

std::vector<int> backbone(Ctx& c, int x) {
  const std::string p = "model.backbone.model.";
  for (int i = 0; i < 3; ++i) x = conv_layer(c, cat(p, "embedder.embedder.", i), x, i == 0 ? 2 : 1, c.cfg.backbone_act);
  x = c.node(Op::MaxPool2d, p + "embedder.pooler", {x},
             {{"kernel", std::vector<int64_t>{3, 3}},
              {"strides", std::vector<int64_t>{2, 2}},
              {"pads", std::vector<int64_t>{1, 1, 1, 1}}});
  std::vector<int> stage_out;
  for (size_t s = 0; s < c.cfg.depths.size(); ++s) {
    for (int64_t i = 0; i < c.cfg.depths[s]; ++i) {
      const std::string bp = cat(p, "encoder.stages.", s, ".layers.", i);
      if (!c.b.has(bp + ".layer.0.convolution.weight"))
        fail_input(kFamily, ": missing tensor '", bp, ".layer.0.convolution.weight' (backbone_config.depths ",
                   shape_str(c.cfg.depths), " in ", c.cfg.path, ")");
      const bool down = i == 0 && (s > 0 || c.cfg.downsample_in_first_stage);
      x = block(c, bp, x, down ? 2 : 1);
    }
    stage_out.push_back(x);
  }
  std::vector<int> feats;
  for (int s : c.cfg.out_stages) feats.push_back(stage_out[static_cast<size_t>(s)]);
  return feats;
}

std::vector<int> hybrid_encoder(Ctx& c, const std::vector<int>& feats) {
  const Activation a = c.cfg.act;
  std::vector<int> f;
  for (size_t i = 0; i < feats.size(); ++i) {
    const std::string p = cat("model.encoder_input_proj.", i);
    // nn.BatchNorm2d(encoder_hidden_dim): the default eps, not batch_norm_eps.
    f.push_back(c.b.batch_norm(p + ".1", c.b.conv(p + ".0", feats[i]), 1e-5));
  }
  for (size_t i = 0; i < c.cfg.encode_proj_layers.size(); ++i) {
    const int64_t lvl = c.cfg.encode_proj_layers[i];
    if (lvl < 0 || lvl >= static_cast<int64_t>(f.size()))
      fail_input(c.cfg.path, ": config key 'encode_proj_layers' entry ", lvl, " is not a level (0..", f.size() - 1, ")");
    f[static_cast<size_t>(lvl)] = aifi(c, cat("model.encoder.encoder.", i), f[static_cast<size_t>(lvl)]);
  }
  const size_t stages = f.size() - 1;
  std::vector<int> fpn{f.back()};
  for (size_t i = 0; i < stages; ++i) {
    const int top = conv_norm(c, cat("model.encoder.lateral_convs.", i), fpn.back(), 1, a);
    fpn.back() = top;
    const int up = c.node(Op::UpsampleNearest, cat("model.encoder.fpn_up.", i), {top},
                          {{"scales", std::vector<int64_t>{2, 2}}});
    const int fused = c.node(Op::Concat, cat("model.encoder.fpn_cat.", i), {up, f[stages - i - 1]}, {{"axis", int64_t{1}}});
    fpn.push_back(csp_rep(c, cat("model.encoder.fpn_blocks.", i), fused));
  }
  std::reverse(fpn.begin(), fpn.end());
  std::vector<int> pan{fpn[0]};
  for (size_t i = 0; i < stages; ++i) {
    const int down = conv_norm(c, cat("model.encoder.downsample_convs.", i), pan.back(), 2, a);
    const int fused = c.node(Op::Concat, cat("model.encoder.pan_cat.", i), {down, fpn[i + 1]}, {{"axis", int64_t{1}}});
    pan.push_back(csp_rep(c, cat("model.encoder.pan_blocks.", i), fused));
  }
  return pan;
}

}  // namespace kiln::rtdetr
