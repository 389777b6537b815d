// timm ResNet family: ResNet (basic and bottleneck blocks, any depth and
// width), ResNet-D (deep stem, average-pool shortcut), ResNeXt (grouped 3x3).
// The structure is read from tensor names and shapes, not from a table of
// architectures: the number of stages and blocks, block kind (conv3 present =
// bottleneck), groups (in_channels / weight.shape[1]), stem kind (conv1.0 =
// deep stem) and shortcut kind (downsample.1 is a conv = avg-down).
#include "checkpoint/timm_common.hpp"
#include "core/error.hpp"
#include "families/family.hpp"

namespace kiln {

namespace {

constexpr double kBnEps = 1e-5;  // timm's ResNet uses nn.BatchNorm2d defaults

int block(LayerBuilder& b, const std::string& p, int x, int stride) {
  const bool bottleneck = b.has(p + ".conv3.weight");
  int skip = resnet_shortcut(b, p, x, stride, kBnEps);
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
    return build_timm_resnet_like(*req.source, req.batch, name(), kBnEps, block);
  }
};

}  // namespace

void register_family_timm_resnet(FamilyRegistry& r) { r.add(std::make_unique<TimmResnet>()); }

}  // namespace kiln
