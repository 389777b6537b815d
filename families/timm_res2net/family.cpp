// timm Res2Net family: Res2Net (Bottle2neck blocks, any scale and base width,
// any depth), Res2Net-D (deep stem, average-pool shortcut), Res2NeXt (grouped
// 3x3 convs). timm builds these as its ResNet class with block=Bottle2neck, so
// the stem, stages and shortcuts are named as in timm_resnet; only the block
// differs. The structure is read from tensor names and shapes, not from a table
// of architectures: width = convs.0 output channels, scale = conv1 output
// channels / width, groups = width / convs.0 input channels, "first" block =
// stride 2 or a downsample present (timm's Bottle2neck.is_first).
#include "checkpoint/timm_common.hpp"
#include "core/error.hpp"
#include "families/family.hpp"

namespace kiln {

namespace {

constexpr double kBnEps = 1e-5;  // timm's ResNet uses nn.BatchNorm2d defaults
constexpr const char* kFamily = "timm_res2net";

int slice_channels(LayerBuilder& b, const std::string& name, int x, int64_t start, int64_t end) {
  return b.graph().add_node(Op::Slice, name, {x}, {{"axis", int64_t{1}}, {"start", start}, {"end", end}});
}

// timm's Bottle2neck.forward:
//   out = relu(bn1(conv1(x))); spx = split(out, width)
//   for i < num_scales: sp = spx[i] if (i == 0 or is_first) else sp + spx[i]
//                       spo += relu(bns[i](convs[i](sp)))          (convs carry the stride)
//   if scale > 1: spo += pool(spx[-1]) if is_first else spx[-1]    (pool: AvgPool2d(3, stride, 1),
//                                                                   count_include_pad=True, floor)
//   out = relu(bn3(conv3(cat(spo))) + shortcut(x))
int block(LayerBuilder& b, const std::string& p, int x, int stride) {
  const bool is_first = stride > 1 || resnet_has_downsample(b, p);
  const int skip = resnet_shortcut(b, p, x, stride, kBnEps);

  const Shape& c1 = b.shape_of(p + ".conv1.weight");
  const Shape& c0 = b.shape_of(p + ".convs.0.weight");
  if (c1.size() != 4 || c0.size() != 4 || c0[0] <= 0 || c1[0] % c0[0] != 0)
    fail_input(kFamily, ": block '", p, "': conv1 output ", shape_str(c1), " is not a whole number of chunks of '",
               p, ".convs.0.weight' ", shape_str(c0));
  const int64_t width = c0[0];
  const int64_t scale = c1[0] / width;
  // timm: num_scales = max(1, scale - 1); scale 1 means one 3x3 on the whole output.
  const int64_t num_convs = std::max<int64_t>(1, scale - 1);
  for (int64_t i = 0; i < num_convs; ++i)
    if (!b.has(cat(p, ".convs.", i, ".weight")))
      fail_input(kFamily, ": missing tensor '", p, ".convs.", i, ".weight' (block '", p, "' has conv1 with ", c1[0],
                 " channels = ", scale, " chunks of ", width, ", so it needs convs.0..", num_convs - 1, ")");

  const int y1 = b.act(p + ".act1", b.batch_norm(p + ".bn1", b.conv(p + ".conv1", x), kBnEps), Activation::Relu);
  std::vector<int> spx;
  if (scale == 1) {
    spx.push_back(y1);
  } else {
    for (int64_t k = 0; k < scale; ++k)
      spx.push_back(slice_channels(b, cat(p, ".split.", k), y1, k * width, (k + 1) * width));
  }

  std::vector<int> spo;
  int sp = -1;
  for (int64_t i = 0; i < num_convs; ++i) {
    const std::string ci = cat(p, ".convs.", i);
    sp = (i == 0 || is_first) ? spx[i] : b.graph().add_node(Op::Add, cat(p, ".chain.", i), {sp, spx[i]});
    sp = b.batch_norm(cat(p, ".bns.", i), b.conv(ci, sp, {stride}), kBnEps);
    sp = b.act(cat(p, ".acts.", i), sp, Activation::Relu);
    spo.push_back(sp);
  }
  if (scale > 1) {
    int last = spx.back();
    if (is_first)
      last = b.graph().add_node(Op::AvgPool2d, p + ".pool", {last},
                                {{"kernel", std::vector<int64_t>{3, 3}},
                                 {"strides", std::vector<int64_t>{stride, stride}},
                                 {"pads", std::vector<int64_t>{1, 1, 1, 1}},
                                 {"ceil_mode", int64_t{0}},
                                 {"count_include_pad", int64_t{1}}});
    spo.push_back(last);
  }
  const int cat_out = spo.size() == 1 ? spo[0] : b.graph().add_node(Op::Concat, p + ".cat", spo, {{"axis", int64_t{1}}});

  int y = b.batch_norm(p + ".bn3", b.conv(p + ".conv3", cat_out), kBnEps);
  if (b.graph().values[y].shape != b.graph().values[skip].shape)
    fail_input(kFamily, ": block '", p, "' output ", shape_str(b.graph().values[y].shape),
               " does not match its shortcut ", shape_str(b.graph().values[skip].shape), " (missing tensor '", p,
               ".downsample.0.weight'?)");
  // add(main path, shortcut): fuse_residual_add prefers the first operand, so conv3 hosts the add.
  y = b.graph().add_node(Op::Add, p + ".add", {y, skip});
  return b.act(p + ".act3", y, Activation::Relu);
}

class TimmRes2net : public Family {
 public:
  std::string name() const override { return kFamily; }

  // Claims only checkpoints with Bottle2neck blocks (convs.N); timm_resnet
  // rejects exactly those, so the two never claim the same checkpoint.
  bool describe(const ModelSource& s) const override {
    const Checkpoint& c = *s.checkpoint;
    return s.config.is_object() && s.config.contains("pretrained_cfg") && c.has("layer1.0.conv1.weight") &&
           c.has("layer1.0.convs.0.weight") && c.has("layer1.0.conv3.weight") && c.has("fc.weight") &&
           (c.has("conv1.weight") || c.has("conv1.0.weight"));
  }

  FamilyBuild build(const BuildRequest& req) const override {
    return build_timm_resnet_like(*req.source, req.batch, kFamily, kBnEps, block);
  }
};

}  // namespace

void register_family_timm_res2net(FamilyRegistry& r) { r.add(std::make_unique<TimmRes2net>()); }

}  // namespace kiln
