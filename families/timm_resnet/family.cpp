// timm ResNet family: ResNet (basic and bottleneck blocks, any depth and
// width), ResNet-D (deep stem, average-pool shortcut), ResNeXt (grouped 3x3).
// The structure is read from tensor names and shapes, not from a table of
// architectures: the number of stages and blocks, block kind (conv3 present =
// bottleneck), groups (in_channels / weight.shape[1]), stem kind (conv1.0 =
// deep stem) and shortcut kind (downsample.1 is a conv = avg-down).
#include "checkpoint/hf_config.hpp"
#include "checkpoint/layer_builder.hpp"
#include "core/error.hpp"
#include "families/family.hpp"
#include "tasks/runtime_config.hpp"

namespace kiln {

namespace {

constexpr double kBnEps = 1e-5;  // timm's ResNet uses nn.BatchNorm2d defaults

std::string block_prefix(int stage, int block) { return cat("layer", stage, ".", block); }

int stem(LayerBuilder& b, int x) {
  if (b.has("conv1.0.weight")) {
    // Deep stem (ResNet-C/D): three 3x3 convs, the first with stride 2.
    x = b.act("conv1.2", b.batch_norm("conv1.1", b.conv("conv1.0", x, {2}), kBnEps), Activation::Relu);
    x = b.act("conv1.5", b.batch_norm("conv1.4", b.conv("conv1.3", x), kBnEps), Activation::Relu);
    x = b.conv("conv1.6", x);
  } else {
    x = b.conv("conv1", x, {2});
  }
  x = b.act("act1", b.batch_norm("bn1", x, kBnEps), Activation::Relu);
  return b.graph().add_node(Op::MaxPool2d, "maxpool", {x},
                            {{"kernel", std::vector<int64_t>{3, 3}},
                             {"strides", std::vector<int64_t>{2, 2}},
                             {"pads", std::vector<int64_t>{1, 1, 1, 1}}});
}

int shortcut(LayerBuilder& b, const std::string& p, int x, int stride) {
  const std::string d = p + ".downsample";
  if (!b.has(d + ".0.weight") && !b.has(d + ".1.weight")) return x;
  if (b.has(d + ".1.weight") && b.shape_of(d + ".1.weight").size() == 4) {
    // Average-pool shortcut (ResNet-D): AvgPool(2, stride, ceil, no pad count) then 1x1 conv.
    if (stride > 1)
      x = b.graph().add_node(Op::AvgPool2d, d + ".0", {x},
                             {{"kernel", std::vector<int64_t>{2, 2}},
                              {"strides", std::vector<int64_t>{stride, stride}},
                              {"ceil_mode", int64_t{1}},
                              {"count_include_pad", int64_t{0}}});
    return b.batch_norm(d + ".2", b.conv(d + ".1", x), kBnEps);
  }
  return b.batch_norm(d + ".1", b.conv(d + ".0", x, {stride}), kBnEps);
}

int block(LayerBuilder& b, const std::string& p, int x, int stride) {
  const bool bottleneck = b.has(p + ".conv3.weight");
  int skip = shortcut(b, p, x, stride);
  int y;
  if (bottleneck) {
    // timm puts the stride on the 3x3 (conv2).
    y = b.act(p + ".act1", b.batch_norm(p + ".bn1", b.conv(p + ".conv1", x), kBnEps), Activation::Relu);
    y = b.act(p + ".act2", b.batch_norm(p + ".bn2", b.conv(p + ".conv2", y, {stride}), kBnEps), Activation::Relu);
    y = b.batch_norm(p + ".bn3", b.conv(p + ".conv3", y), kBnEps);
  } else {
    y = b.act(p + ".act1", b.batch_norm(p + ".bn1", b.conv(p + ".conv1", x, {stride}), kBnEps), Activation::Relu);
    y = b.batch_norm(p + ".bn2", b.conv(p + ".conv2", y), kBnEps);
  }
  if (b.graph().values[y].shape != b.graph().values[skip].shape)
    fail_input("timm_resnet: block '", p, "' output ", shape_str(b.graph().values[y].shape),
               " does not match its shortcut ", shape_str(b.graph().values[skip].shape),
               " (missing tensor '", p, ".downsample.0.weight'?)");
  y = b.graph().add_node(Op::Add, p + ".add", {y, skip});
  return b.act(p + ".act3", y, Activation::Relu);
}

class TimmResnet : public Family {
 public:
  std::string name() const override { return "timm_resnet"; }

  bool describe(const ModelSource& s) const override {
    const Checkpoint& c = *s.checkpoint;
    return s.config.is_object() && s.config.contains("pretrained_cfg") && c.has("layer1.0.conv1.weight") &&
           c.has("layer1.0.conv2.weight") && !c.has("layer1.0.convs.0.weight") && c.has("fc.weight") &&
           (c.has("conv1.weight") || c.has("conv1.0.weight"));
  }

  FamilyBuild build(const BuildRequest& req) const override {
    const ModelSource& s = *req.source;
    TimmConfig cfg = parse_timm_config(s.config, s.config_path.string());
    if (cfg.raw.contains("model_args") && cfg.raw["model_args"].contains("output_stride") &&
        cfg.raw["model_args"]["output_stride"] != 32)
      fail_input(s.config_path.string(), ": model_args.output_stride other than 32 (dilated ResNet) is not supported");
    LayerBuilder b(*s.checkpoint, name());
    const Shape& stem_w = b.shape_of(b.has("conv1.0.weight") ? "conv1.0.weight" : "conv1.weight");
    if (stem_w.size() != 4 || stem_w[1] != cfg.in_chans)
      fail_input("timm_resnet: stem conv weight ", shape_str(stem_w), " does not take ", cfg.in_chans,
                 " input channels (pretrained_cfg.input_size)");
    int x = b.graph().add_input("pixel_values", DType::F32, {req.batch, cfg.in_chans, cfg.input_h, cfg.input_w});
    x = stem(b, x);
    int stages = 0;
    for (int stage = 1; b.has(block_prefix(stage, 0) + ".conv1.weight"); ++stage, ++stages) {
      for (int i = 0; b.has(block_prefix(stage, i) + ".conv1.weight"); ++i)
        x = block(b, block_prefix(stage, i), x, (stage > 1 && i == 0) ? 2 : 1);
    }
    if (stages == 0) fail_input("timm_resnet: no 'layer1.0.conv1.weight' in ", s.checkpoint->source().string());
    x = b.graph().add_node(Op::GlobalAvgPool, "global_pool", {x});
    x = b.graph().add_node(Op::Flatten, "global_pool.flatten", {x});
    x = b.linear("fc", x);
    b.graph().values[x].name = "logits";
    b.graph().mark_output(x);
    b.check_all_used("num_batches_tracked");

    const int64_t classes = b.graph().values[x].shape[1];
    if (cfg.num_classes != classes)
      fail_input(s.config_path.string(), ": num_classes is ", cfg.num_classes, " but tensor 'fc.weight' has ", classes,
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
    FamilyBuild out{b.take_graph(), "classification", to_json(rt), cfg.label_names};
    return out;
  }
};

}  // namespace

void register_family_timm_resnet(FamilyRegistry& r) { r.add(std::make_unique<TimmResnet>()); }

}  // namespace kiln
