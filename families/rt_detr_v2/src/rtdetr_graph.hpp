// Graph pieces of the rt_detr_v2 family (families/rt_detr_v2/README.md):
// the config it reads, and builders for the backbone, hybrid encoder, query
// selection and decoder, each naming tensors as transformers saves them.
#pragma once
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/layer_builder.hpp"

namespace kiln::rtdetr {

inline constexpr const char* kFamily = "rt_detr_v2";

// The structure keys of config.json (RTDetrV2Config and its backbone_config).
struct Config {
  std::string path;  // config.json, for messages
  // backbone (RTDetrResNetConfig)
  std::string layer_type = "basic";
  std::vector<int64_t> depths;
  std::vector<int> out_stages;  // encoder stage indices (0-based) feeding the encoder
  bool downsample_in_first_stage = false, downsample_in_bottleneck = false;
  Activation backbone_act = Activation::Relu;
  // encoder
  int64_t encoder_hidden_dim = 256, encoder_attention_heads = 8;
  std::vector<int64_t> encode_proj_layers;
  double positional_encoding_temperature = 10000;
  Activation encoder_act = Activation::Gelu, act = Activation::Silu;
  double batch_norm_eps = 1e-5, layer_norm_eps = 1e-5;
  bool has_anchor_image_size = false;
  int64_t anchor_h = 0, anchor_w = 0;
  std::vector<int64_t> feat_strides;
  // decoder
  int64_t d_model = 256, num_queries = 300, decoder_layers = 6, decoder_heads = 8, n_levels = 3, n_points = 4;
  int64_t num_labels = 80, num_feature_levels = 3;
  double offset_scale = 0.5;
  std::string decoder_method = "default";
  Activation decoder_act = Activation::Relu;
};
Config parse_config(const nlohmann::json& j, const std::string& path);

// Shared state of one build: the layer builder and the config.
struct Ctx {
  LayerBuilder& b;
  const Config& cfg;
  Graph& g() { return b.graph(); }
  const Shape& shape(int v) { return b.graph().values[v].shape; }
  int node(Op op, const std::string& name, const std::vector<int>& in, Attrs attrs = {}) {
    return b.graph().add_node(op, name, in, std::move(attrs));
  }
  int reshape(const std::string& name, int x, std::vector<int64_t> shape) {
    return node(Op::Reshape, name, {x}, {{"shape", std::move(shape)}});
  }
  int transpose(const std::string& name, int x, std::vector<int64_t> perm) {
    return node(Op::Transpose, name, {x}, {{"perm", std::move(perm)}});
  }
  // The constant c (no batch axis) as one image, [1, c.shape...]: add and mul
  // repeat it over the batch (core/broadcast.hpp).
  int image_constant(const std::string& name, const HostTensor& c);
};

// The linear groups of the published RT-DETR v2 FP8 study (FIELD-NOTES §4) as
// recipe parts (quant::PartTable: part -> node-name globs of this graph).
std::map<std::string, std::vector<std::string>> quant_parts();

// Multi-head self-attention (q_proj, k_proj from qk_in; v_proj from x [B, L, C]; out_proj).
int self_attention(Ctx& c, const std::string& prefix, int x, int qk_in, int64_t heads);
int layer_norm(Ctx& c, const std::string& prefix, int x);

// The ResNet-vd backbone: the feature maps of cfg.out_stages, in order.
std::vector<int> backbone(Ctx& c, int pixels);
// Input projections, AIFI, FPN and PAN: one map per level, encoder_hidden_dim channels.
std::vector<int> hybrid_encoder(Ctx& c, const std::vector<int>& feats);
// Query selection and decoder; marks the outputs "logits" and "pred_boxes".
void decoder(Ctx& c, const std::vector<int>& maps);

}  // namespace kiln::rtdetr
