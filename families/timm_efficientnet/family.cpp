// timm EfficientNet family: EfficientNet B0-B8/L2, EfficientNet-Lite0-4 and
// EfficientNetV2 (S/M/L/XL, B0-B3, rw_t/s/m), each in timm's PyTorch-padding
// form and as tf_ ports (TensorFlow "same" padding, BatchNorm eps 1e-3).
// Block kinds, kernel sizes, channels, expansion and squeeze-excitation are
// read from tensor names and shapes. Two things the tensors cannot say are
// taken from config.json's "architecture": the activation (SiLU, or ReLU6 for
// Lite) and the padding/eps style (tf_ prefix). Strides follow the stage
// pattern every timm EfficientNet arch def shares (README: "Strides").
#include <regex>

#include "checkpoint/timm_common.hpp"
#include "core/error.hpp"
#include "families/family.hpp"
#include "src/effnet_blocks.hpp"

namespace kiln {

namespace {

// Stride of the first block of stage s (later blocks: 1), for every timm
// EfficientNet/Lite/V2 arch def; 6-stage nets (V2-S, V2-B*) use the prefix.
constexpr int kStageStrides[] = {1, 2, 2, 2, 1, 2, 1};
constexpr int kMinStages = 6, kMaxStages = 7;
constexpr int kStemStride = 2;
constexpr double kBnEpsTorch = 1e-5;  // nn.BatchNorm2d default
constexpr double kBnEpsTf = 1e-3;     // timm's BN_EPS_TF_DEFAULT for tf_ ports

// B0-B8, L2, Lite0-4 and V2 in timm's own and tf_ forms. Not: _gn/_evos (other
// norms), _es/_em/_el (EdgeTPU, ReLU), _cc (CondConv), _x/_h, mixnet, mnasnet,
// mobilenetv3, whose tensors can look alike but whose act/norm/strides differ.
const std::regex kArchitecture(R"(^(tf_)?(efficientnet_(b[0-8]|l2|lite[0-4])|efficientnetv2_(rw_[tsm]|[sml]|xl|b[0-3]))$)");

bool is_efficientnet_architecture(const nlohmann::json& config) {
  if (!config.is_object() || !config.contains("architecture") || !config["architecture"].is_string()) return false;
  return std::regex_match(config["architecture"].get<std::string>(), kArchitecture);
}

effnet::Style style_for(const TimmConfig& cfg, const std::string& config_path) {
  effnet::Style st;
  const bool tf = cfg.architecture.rfind("tf_", 0) == 0;
  st.act = cfg.architecture.find("_lite") != std::string::npos ? Activation::Relu6 : Activation::Silu;
  st.bn_eps = tf ? kBnEpsTf : kBnEpsTorch;
  st.tf_same = tf;
  // The entrypoints' kwargs may be overridden in model_args (timm passes them through).
  if (cfg.raw.contains("model_args") && cfg.raw["model_args"].is_object()) {
    const auto& m = cfg.raw["model_args"];
    if (m.contains("bn_eps") && m["bn_eps"].is_number()) st.bn_eps = m["bn_eps"].get<double>();
    if (m.contains("pad_type") && m["pad_type"].is_string()) {
      const std::string pad = m["pad_type"].get<std::string>();
      if (pad != "same" && pad != "")
        fail_input(config_path, ": model_args.pad_type '", pad, "' is not supported ('same' or '')");
      st.tf_same = pad == "same";
    }
    if (m.contains("act_layer") && m["act_layer"].is_string()) {
      const std::string a = m["act_layer"].get<std::string>();
      if (a == "swish" || a == "silu") st.act = Activation::Silu;
      else if (a == "relu6") st.act = Activation::Relu6;
      else if (a == "relu") st.act = Activation::Relu;
      else fail_input(config_path, ": model_args.act_layer '", a, "' is not supported (silu, swish, relu6, relu)");
    }
    if (m.contains("output_stride") && m["output_stride"] != 32)
      fail_input(config_path, ": model_args.output_stride other than 32 (dilated EfficientNet) is not supported");
  }
  return st;
}

std::string block_prefix(int stage, int block) { return cat("blocks.", stage, ".", block); }

class TimmEfficientnet : public Family {
 public:
  std::string name() const override { return "timm_efficientnet"; }

  bool describe(const ModelSource& s) const override {
    const Checkpoint& c = *s.checkpoint;
    return s.config.is_object() && s.config.contains("pretrained_cfg") && c.has("conv_stem.weight") &&
           c.has("blocks.0.0.bn1.weight") && is_efficientnet_architecture(s.config);
  }

  FamilyBuild build(const BuildRequest& req) const override {
    const ModelSource& s = *req.source;
    const std::string cpath = s.config_path.string();
    TimmConfig cfg = parse_timm_config(s.config, cpath);
    const effnet::Style style = style_for(cfg, cpath);
    LayerBuilder b(*s.checkpoint, name());
    effnet::Builder eb(b, style);

    int x = add_timm_input(b, cfg, req.batch, "conv_stem.weight", name());
    x = eb.conv_bn("conv_stem", "bn1", x, kStemStride, style.act);

    const effnet::BlockTensors blocks = effnet::group_block_tensors(s.checkpoint->names());
    int stages = 0;
    while (blocks.count(block_prefix(stages, 0))) ++stages;
    if (stages < kMinStages || stages > kMaxStages)
      fail_input("timm_efficientnet: ", s.checkpoint->source().string(), " has ", stages,
                 " stages ('blocks.N.0.*'); timm's EfficientNet arch defs have ", kMinStages, " or ", kMaxStages);
    for (int stage = 0; stage < stages; ++stage)
      for (int i = 0; blocks.count(block_prefix(stage, i)); ++i) {
        const std::string p = block_prefix(stage, i);
        x = eb.block(p, blocks.at(p), x, i == 0 ? kStageStrides[stage] : 1);
      }

    if (b.has("conv_head.weight")) x = eb.conv_bn("conv_head", "bn2", x, 1, style.act);
    return finish_timm_classifier(b, x, "classifier", cfg, cpath);
  }
};

}  // namespace

void register_family_timm_efficientnet(FamilyRegistry& r) { r.add(std::make_unique<TimmEfficientnet>()); }

}  // namespace kiln
