// Building blocks shared by the timm classification families (families never
// include each other): the engine input, timm's ResNet stem and shortcut
// (used by timm_resnet and timm_res2net, which timm builds with the same
// ResNet class), and the pooled classifier head with its runtime.json.
#pragma once
#include <functional>
#include <string>

#include "checkpoint/hf_config.hpp"
#include "checkpoint/layer_builder.hpp"
#include "families/family.hpp"

namespace kiln {

// Adds the "pixel_values" input [batch, in_chans, H, W] after checking that
// `stem_weight` takes in_chans channels.
int add_timm_input(LayerBuilder& b, const TimmConfig& cfg, int batch, const std::string& stem_weight,
                   const std::string& family);

// timm ResNet stem: 7x7/2 conv (or the deep 3x3 stem "conv1.0/.3/.6"), bn1,
// ReLU, 3x3/2 max-pool.
int resnet_stem(LayerBuilder& b, int x, double bn_eps);
bool resnet_has_downsample(const LayerBuilder& b, const std::string& block);
// The block's shortcut: identity, 1x1 conv + BN ("downsample.0/.1"), or the
// ResNet-D average-pool shortcut (AvgPool(2, stride, ceil, no pad count) then
// conv "downsample.1" + BN "downsample.2").
int resnet_shortcut(LayerBuilder& b, const std::string& block, int x, int stride, double bn_eps);

// Builds a network of timm's ResNet class (ResNet, ResNet-D, ResNeXt, Res2Net):
// rejects dilated variants (model_args.output_stride != 32), adds the input and
// the stem, calls `block(b, "layer{s}.{i}", x, stride)` for every block found in
// the checkpoint (stride 2 on the first block of stages 2+), then the fc head.
using ResnetBlockFn = std::function<int(LayerBuilder& b, const std::string& prefix, int x, int stride)>;
FamilyBuild build_timm_resnet_like(const ModelSource& source, int batch, const std::string& family, double bn_eps,
                                   const ResnetBlockFn& block);

// Global average pool, flatten, linear `classifier` -> output "logits";
// rejects unused tensors and a num_classes that disagrees with the
// classifier; fills runtime.json from the timm config.
FamilyBuild finish_timm_classifier(LayerBuilder& b, int x, const std::string& classifier, const TimmConfig& cfg,
                                   const std::string& config_path);

}  // namespace kiln
