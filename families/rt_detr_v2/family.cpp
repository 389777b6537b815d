// rt_detr_v2 family: RTDetrV2ForObjectDetection checkpoints in the Hugging
// Face layout (config.json model_type rt_detr_v2, model.safetensors with
// transformers' names). The structure comes from config.json (depths, layer
// type, heads, levels, points, queries, labels) checked against the tensor
// shapes; the input size from preprocessor_config.json (RTDetrImageProcessor's
// size), 640x640 without one. README.md has the whole graph and its contract.
#include <fstream>

#include "core/error.hpp"
#include "families/family.hpp"
#include "families/rt_detr_v2/src/rtdetr_graph.hpp"
#include "tasks/runtime_config.hpp"

namespace kiln {

namespace rtdetr {

namespace {

const nlohmann::json& need(const nlohmann::json& j, const char* key, const std::string& where) {
  if (!j.is_object() || !j.contains(key)) fail_input(where, ": missing config key '", key, "'");
  return j.at(key);
}
template <class T>
T get_or(const nlohmann::json& j, const char* key, T fallback, const std::string& where) {
  if (!j.contains(key) || j.at(key).is_null()) return fallback;
  try {
    return j.at(key).get<T>();
  } catch (const std::exception&) {
    fail_input(where, ": config key '", key, "' has the wrong type: ", j.at(key).dump());
  }
}
Activation act_of(const nlohmann::json& j, const char* key, const char* fallback, const std::string& where) {
  const std::string name = get_or<std::string>(j, key, fallback, where);
  if (name == "relu") return Activation::Relu;
  if (name == "silu" || name == "swish") return Activation::Silu;
  if (name == "gelu") return Activation::Gelu;
  fail_input(where, ": config key '", key, "' = '", name, "' (rt_detr_v2 knows relu, silu, gelu)");
}

}  // namespace

Config parse_config(const nlohmann::json& j, const std::string& path) {
  Config c;
  c.path = path;
  const nlohmann::json& bb = need(j, "backbone_config", path);
  const std::string bpath = path + ": backbone_config";
  c.layer_type = get_or<std::string>(bb, "layer_type", "bottleneck", bpath);
  if (c.layer_type != "basic" && c.layer_type != "bottleneck")
    fail_input(bpath, ": config key 'layer_type' = '", c.layer_type, "' (basic or bottleneck)");
  c.depths = need(bb, "depths", bpath).get<std::vector<int64_t>>();
  c.downsample_in_first_stage = get_or<bool>(bb, "downsample_in_first_stage", false, bpath);
  c.downsample_in_bottleneck = get_or<bool>(bb, "downsample_in_bottleneck", false, bpath);
  c.backbone_act = act_of(bb, "hidden_act", "relu", bpath);
  // out_features "stageK" is the output of encoder stage K-1 ("stem" is not supported).
  for (const auto& f : need(bb, "out_features", bpath)) {
    const std::string s = f.get<std::string>();
    if (s.rfind("stage", 0) != 0 || s.size() < 6)
      fail_input(bpath, ": config key 'out_features' entry '", s, "' (rt_detr_v2 reads stage1..stageN)");
    const int k = std::stoi(s.substr(5));
    if (k < 1 || k > static_cast<int>(c.depths.size()))
      fail_input(bpath, ": config key 'out_features' entry '", s, "' beyond the ", c.depths.size(), " stages of 'depths'");
    c.out_stages.push_back(k - 1);
  }
  c.encoder_hidden_dim = get_or<int64_t>(j, "encoder_hidden_dim", 256, path);
  c.encoder_attention_heads = get_or<int64_t>(j, "encoder_attention_heads", 8, path);
  c.encode_proj_layers = get_or<std::vector<int64_t>>(j, "encode_proj_layers", {2}, path);
  if (get_or<int64_t>(j, "encoder_layers", 1, path) < 0) fail_input(path, ": config key 'encoder_layers' < 0");
  if (get_or<int64_t>(j, "encoder_layers", 1, path) == 0) c.encode_proj_layers.clear();
  c.positional_encoding_temperature = get_or<double>(j, "positional_encoding_temperature", 10000, path);
  c.encoder_act = act_of(j, "encoder_activation_function", "gelu", path);
  c.act = act_of(j, "activation_function", "silu", path);
  c.decoder_act = act_of(j, "decoder_activation_function", "relu", path);
  c.batch_norm_eps = get_or<double>(j, "batch_norm_eps", 1e-5, path);
  c.layer_norm_eps = get_or<double>(j, "layer_norm_eps", 1e-5, path);
  if (get_or<bool>(j, "normalize_before", false, path))
    fail_input(path, ": config key 'normalize_before' = true (pre-norm encoder layers) is not supported by rt_detr_v2");
  if (get_or<bool>(j, "learn_initial_query", false, path))
    fail_input(path, ": config key 'learn_initial_query' = true is not supported by rt_detr_v2");
  if (!get_or<bool>(j, "with_box_refine", true, path))
    fail_input(path, ": config key 'with_box_refine' = false is not supported by rt_detr_v2");
  if (j.contains("anchor_image_size") && !j["anchor_image_size"].is_null()) {
    const auto a = j["anchor_image_size"].get<std::vector<int64_t>>();
    if (a.size() != 2) fail_input(path, ": config key 'anchor_image_size' must be [height, width]");
    c.has_anchor_image_size = true, c.anchor_h = a[0], c.anchor_w = a[1];
  }
  c.feat_strides = get_or<std::vector<int64_t>>(j, "feat_strides", {8, 16, 32}, path);
  c.d_model = get_or<int64_t>(j, "d_model", 256, path);
  c.num_queries = get_or<int64_t>(j, "num_queries", 300, path);
  c.decoder_layers = get_or<int64_t>(j, "decoder_layers", 6, path);
  c.decoder_heads = get_or<int64_t>(j, "decoder_attention_heads", 8, path);
  c.n_levels = get_or<int64_t>(j, "decoder_n_levels", 3, path);
  c.n_points = get_or<int64_t>(j, "decoder_n_points", 4, path);
  c.num_feature_levels = get_or<int64_t>(j, "num_feature_levels", 3, path);
  c.offset_scale = get_or<double>(j, "decoder_offset_scale", 0.5, path);
  c.decoder_method = get_or<std::string>(j, "decoder_method", "default", path);
  if (c.decoder_method != "default" && c.decoder_method != "discrete")
    fail_input(path, ": config key 'decoder_method' = '", c.decoder_method, "' (rt_detr_v2 builds 'default' and 'discrete')");
  if (j.contains("id2label") && j["id2label"].is_object()) c.num_labels = static_cast<int64_t>(j["id2label"].size());
  c.num_labels = get_or<int64_t>(j, "num_labels", c.num_labels, path);
  for (const auto& [key, v] : std::initializer_list<std::pair<const char*, int64_t>>{
           {"d_model", c.d_model}, {"num_queries", c.num_queries}, {"decoder_layers", c.decoder_layers},
           {"decoder_attention_heads", c.decoder_heads}, {"decoder_n_levels", c.n_levels},
           {"decoder_n_points", c.n_points}, {"encoder_hidden_dim", c.encoder_hidden_dim},
           {"encoder_attention_heads", c.encoder_attention_heads}})
    if (v < 1) fail_input(path, ": config key '", key, "' = ", v, " (must be >= 1)");
  if (c.d_model % c.decoder_heads != 0 || c.encoder_hidden_dim % c.encoder_attention_heads != 0)
    fail_input(path, ": config keys 'd_model' / 'encoder_hidden_dim' must divide by their attention heads");
  if (c.num_feature_levels != c.n_levels || c.n_levels != static_cast<int64_t>(c.out_stages.size()))
    fail_input(path, ": config keys 'num_feature_levels' (", c.num_feature_levels, "), 'decoder_n_levels' (", c.n_levels,
               ") and backbone out_features (", c.out_stages.size(), " maps) must agree (extra strided levels are not supported)");
  return c;
}

}  // namespace rtdetr

namespace {

// preprocessor_config.json's size (RTDetrImageProcessor), 640x640 without one.
DetectionPreprocess read_preprocess(const ModelSource& s) {
  DetectionPreprocess p;
  const auto path = s.dir / "preprocessor_config.json";
  std::ifstream f(path);
  if (!f) return p;
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(f);
  } catch (const std::exception& e) {
    fail_input(path.string(), ": not valid JSON: ", e.what());
  }
  const std::string where = path.string();
  if (j.contains("do_normalize") && j["do_normalize"].is_boolean() && j["do_normalize"].get<bool>())
    fail_input(where, ": key 'do_normalize' = true (rt_detr_v2 engines take pixels / 255 without mean/std)");
  if (j.contains("size")) {
    const auto& sz = j["size"];
    if (!sz.contains("height") || !sz.contains("width") || !sz["height"].is_number_integer() ||
        !sz["width"].is_number_integer())
      fail_input(where, ": key 'size' must hold integer 'height' and 'width', got ", sz.dump());
    p.height = sz["height"].get<int>(), p.width = sz["width"].get<int>();
    if (p.height < 32 || p.width < 32 || p.height > 8192 || p.width > 8192)
      fail_input(where, ": key 'size' ", sz.dump(), " out of range (32..8192)");
  }
  if (j.contains("rescale_factor") && j["rescale_factor"].is_number())
    p.rescale = static_cast<float>(j["rescale_factor"].get<double>());
  return p;
}

class RtDetrV2 : public Family {
 public:
  std::string name() const override { return rtdetr::kFamily; }

  bool describe(const ModelSource& s) const override {
    if (!s.config.is_object() || !s.config.contains("model_type") || !s.config["model_type"].is_string()) return false;
    if (s.config["model_type"].get<std::string>() != "rt_detr_v2") return false;
    if (s.config.contains("architectures") && s.config["architectures"].is_array()) {
      for (const auto& a : s.config["architectures"])
        if (a.is_string() && a.get<std::string>() == "RTDetrV2ForObjectDetection") return true;
      return false;
    }
    return true;
  }

  FamilyBuild build(const BuildRequest& req) const override {
    const ModelSource& s = *req.source;
    const rtdetr::Config cfg = rtdetr::parse_config(s.config, s.config_path.string());
    const DetectionPreprocess pre = read_preprocess(s);
    LayerBuilder b(*s.checkpoint, rtdetr::kFamily);
    rtdetr::Ctx c{b, cfg};
    const int x = b.graph().add_input("pixel_values", DType::F32, {req.batch, 3, pre.height, pre.width});
    const std::vector<int> feats = rtdetr::backbone(c, x);
    const std::vector<int> maps = rtdetr::hybrid_encoder(c, feats);
    rtdetr::decoder(c, maps);
    // Training-only and duplicate tensors: the denoising embedding, and the
    // top-level copies of the decoder's heads (ForObjectDetection.class_embed /
    // bbox_embed; the forward pass reads model.decoder.*).
    for (const std::string& name : s.checkpoint->names()) {
      if (name.rfind("class_embed.", 0) == 0 || name.rfind("bbox_embed.", 0) == 0 ||
          name.rfind("model.denoising_class_embed.", 0) == 0)
        b.weight(name);
    }
    b.check_all_used("num_batches_tracked");
    FamilyBuild out;
    out.graph = b.take_graph();
    out.graph.canonicalize();
    out.task = "detection";
    DetectionRuntime rt;
    rt.num_classes = static_cast<int>(cfg.num_labels);
    rt.num_queries = static_cast<int>(cfg.num_queries);
    rt.preprocess = pre;
    out.runtime = to_json(rt);
    out.quant_parts = rtdetr::quant_parts();
    if (s.config.contains("id2label") && s.config["id2label"].is_object()) {
      out.labels.resize(static_cast<size_t>(cfg.num_labels));
      for (const auto& [k, v] : s.config["id2label"].items()) {
        const long idx = std::stol(k);
        if (idx >= 0 && idx < cfg.num_labels && v.is_string()) out.labels[static_cast<size_t>(idx)] = v.get<std::string>();
      }
    }
    return out;
  }

  // The table (node names: README "Graph"). AIFI is the encoder's
  // transformer layer on the top level; "encoder" is the rest of the hybrid
  // encoder (input projections, FPN and PAN); query selection runs from the
  // decoder's input projections to the first decoder layer's inputs; the
  // output casts of 16-bit engines form their own group.
  std::vector<LayerGroup> layer_groups() const override {
    return {{"input", {"pixel_values"}},
            {"backbone", {"model.backbone."}},
            {"AIFI", {"model.encoder.encoder."}},
            {"encoder", {"model.encoder_input_proj.", "model.encoder."}},
            {"query selection",
             {"model.decoder_input_proj.", "model.memory", "model.enc_", "model.topk", "model.reference_points",
              "model.target", "model.decoder.reference_points"}},
            {"decoder", {"model.decoder."}},
            {"output", {"logits", "pred_boxes"}}};
  }
};

}  // namespace

void register_family_rt_detr_v2(FamilyRegistry& r) { r.add(std::make_unique<RtDetrV2>()); }

}  // namespace kiln
