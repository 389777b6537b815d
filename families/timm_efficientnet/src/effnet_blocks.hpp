// Blocks of timm's EfficientNet family (timm/models/_efficientnet_blocks.py),
// built from a checkpoint's tensors: the block kind is read from which convs
// a block has, kernel sizes / channels / expansion / SE from their shapes.
// Only the stride is not in the tensors; the caller passes it.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "checkpoint/layer_builder.hpp"
#include "core/activation.hpp"

namespace kiln::effnet {

// What differs between efficientnet_*, tf_efficientnet_*, *_lite* and V2 that
// the tensors cannot tell: activation, BatchNorm eps and padding style.
struct Style {
  Activation act = Activation::Silu;
  double bn_eps = 1e-5;
  bool tf_same = false;  // TensorFlow "same" padding (tf_ ports), else timm's symmetric padding
};

enum class BlockKind {
  ConvBnAct,          // `conv`, `bn1` (EfficientNetV2 stage 0, "cn")
  DepthwiseSeparable, // `conv_dw`, `bn1`, [`se.*`], `conv_pw`, `bn2` ("ds")
  InvertedResidual,   // `conv_pw`, `bn1`, `conv_dw`, `bn2`, [`se.*`], `conv_pwl`, `bn3` ("ir", MBConv)
  EdgeResidual,       // `conv_exp`, `bn1`, [`se.*`], `conv_pwl`, `bn2` ("er", fused MBConv)
};

const char* block_kind_name(BlockKind k);

// Checkpoint tensors grouped by block: "blocks.S.B" -> names (full).
using BlockTensors = std::map<std::string, std::vector<std::string>>;
BlockTensors group_block_tensors(const std::vector<std::string>& names);

class Builder {
 public:
  Builder(LayerBuilder& b, Style style) : b_(b), style_(style) {}

  // conv + BatchNorm (+ activation unless `act` is None), padded as the style says.
  int conv_bn(const std::string& conv, const std::string& bn, int x, int stride, Activation act);
  // Squeeze-excitation on `x` when "<p>.se.conv_reduce.weight" exists, else x.
  int squeeze_excite(const std::string& p, int x);
  // One block "blocks.S.B"; `tensors` are that block's checkpoint tensors
  // (an unknown one is an Error(Input) naming it).
  int block(const std::string& p, const std::vector<std::string>& tensors, int x, int stride);

  BlockKind kind_of(const std::string& p, const std::vector<std::string>& tensors) const;
  int se_blocks() const { return se_blocks_; }

 private:
  ConvSpec spec_for(const std::string& conv, int x, int stride) const;
  void check_tensors(const std::string& p, BlockKind kind, const std::vector<std::string>& tensors) const;

  LayerBuilder& b_;
  Style style_;
  int se_blocks_ = 0;
};

}  // namespace kiln::effnet
