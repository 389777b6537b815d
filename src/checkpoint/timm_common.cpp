#include "checkpoint/timm_common.hpp"

#include "core/error.hpp"
#include "tasks/runtime_config.hpp"

namespace kiln {

int add_timm_input(LayerBuilder& b, const TimmConfig& cfg, int batch, const std::string& stem_weight,
                   const std::string& family) {
  const Shape& w = b.shape_of(stem_weight);
  if (w.size() != 4 || w[1] != cfg.in_chans)
    fail_input(family, ": stem conv weight '", stem_weight, "' ", shape_str(w), " does not take ", cfg.in_chans,
               " input channels (pretrained_cfg.input_size)");
  return b.graph().add_input("pixel_values", DType::F32, {batch, cfg.in_chans, cfg.input_h, cfg.input_w});
}

int resnet_stem(LayerBuilder& b, int x, double eps) {
  if (b.has("conv1.0.weight")) {
    // Deep stem (ResNet-C/D, tiered): three 3x3 convs, the first with stride 2.
    x = b.act("conv1.2", b.batch_norm("conv1.1", b.conv("conv1.0", x, {2}), eps), Activation::Relu);
    x = b.act("conv1.5", b.batch_norm("conv1.4", b.conv("conv1.3", x), eps), Activation::Relu);
    x = b.conv("conv1.6", x);
  } else {
    x = b.conv("conv1", x, {2});
  }
  x = b.act("act1", b.batch_norm("bn1", x, eps), Activation::Relu);
  return b.graph().add_node(Op::MaxPool2d, "maxpool", {x},
                            {{"kernel", std::vector<int64_t>{3, 3}},
                             {"strides", std::vector<int64_t>{2, 2}},
                             {"pads", std::vector<int64_t>{1, 1, 1, 1}}});
}

bool resnet_has_downsample(const LayerBuilder& b, const std::string& p) {
  return b.has(p + ".downsample.0.weight") || b.has(p + ".downsample.1.weight");
}

int resnet_shortcut(LayerBuilder& b, const std::string& p, int x, int stride, double eps) {
  const std::string d = p + ".downsample";
  if (!resnet_has_downsample(b, p)) return x;
  if (b.has(d + ".1.weight") && b.shape_of(d + ".1.weight").size() == 4) {
    if (stride > 1)
      x = b.graph().add_node(Op::AvgPool2d, d + ".0", {x},
                             {{"kernel", std::vector<int64_t>{2, 2}},
                              {"strides", std::vector<int64_t>{stride, stride}},
                              {"ceil_mode", int64_t{1}},
                              {"count_include_pad", int64_t{0}}});
    return b.batch_norm(d + ".2", b.conv(d + ".1", x), eps);
  }
  return b.batch_norm(d + ".1", b.conv(d + ".0", x, {stride}), eps);
}

FamilyBuild build_timm_resnet_like(const ModelSource& s, int batch, const std::string& family, double bn_eps,
                                   const ResnetBlockFn& block) {
  const std::string config_path = s.config_path.string();
  TimmConfig cfg = parse_timm_config(s.config, config_path);
  if (cfg.raw.contains("model_args") && cfg.raw["model_args"].contains("output_stride") &&
      cfg.raw["model_args"]["output_stride"] != 32)
    fail_input(config_path, ": model_args.output_stride other than 32 (a dilated network) is not supported by ", family);
  LayerBuilder b(*s.checkpoint, family);
  int x = add_timm_input(b, cfg, batch, b.has("conv1.0.weight") ? "conv1.0.weight" : "conv1.weight", family);
  x = resnet_stem(b, x, bn_eps);
  auto prefix = [](int stage, int i) { return cat("layer", stage, ".", i); };
  if (!b.has(prefix(1, 0) + ".conv1.weight"))
    fail_input(family, ": no 'layer1.0.conv1.weight' in ", s.checkpoint->source().string());
  for (int stage = 1; b.has(prefix(stage, 0) + ".conv1.weight"); ++stage)
    for (int i = 0; b.has(prefix(stage, i) + ".conv1.weight"); ++i)
      x = block(b, prefix(stage, i), x, (stage > 1 && i == 0) ? 2 : 1);
  return finish_timm_classifier(b, x, "fc", cfg, config_path);
}

FamilyBuild finish_timm_classifier(LayerBuilder& b, int x, const std::string& classifier, const TimmConfig& cfg,
                                   const std::string& config_path) {
  x = b.graph().add_node(Op::GlobalAvgPool, "global_pool", {x});
  x = b.graph().add_node(Op::Flatten, "global_pool.flatten", {x});
  x = b.linear(classifier, x);
  b.graph().values[x].name = "logits";
  b.graph().mark_output(x);
  // Anything left (a block or head part the family does not know) is named here.
  b.check_all_used("num_batches_tracked");
  const int64_t classes = b.graph().values[x].shape[1];
  if (cfg.num_classes != classes)
    fail_input(config_path, ": num_classes is ", cfg.num_classes, " but tensor '", classifier, ".weight' has ", classes,
               " rows");
  ClassificationRuntime rt;
  rt.num_classes = static_cast<int>(classes);
  rt.preprocess.height = cfg.input_h;
  rt.preprocess.width = cfg.input_w;
  rt.preprocess.crop_pct = cfg.crop_pct;
  rt.preprocess.crop_mode = cfg.crop_mode;
  rt.preprocess.interpolation = cfg.interpolation;
  rt.preprocess.mean = cfg.mean;
  rt.preprocess.std = cfg.std;
  return FamilyBuild{b.take_graph(), "classification", to_json(rt), cfg.label_names};
}

}  // namespace kiln
