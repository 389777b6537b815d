#include "effnet_blocks.hpp"

#include <algorithm>
#include <cctype>

#include "core/error.hpp"

namespace kiln::effnet {

namespace {

const std::vector<std::string> kBnParts = {"weight", "bias", "running_mean", "running_var", "num_batches_tracked"};
const std::vector<std::string> kSeParts = {"se.conv_reduce.weight", "se.conv_reduce.bias", "se.conv_expand.weight",
                                           "se.conv_expand.bias"};

// Tensor suffixes (after "blocks.S.B.") each block kind may have.
std::vector<std::string> allowed_tensors(BlockKind kind) {
  std::vector<std::string> convs, bns;
  bool se = true;
  switch (kind) {
    case BlockKind::ConvBnAct: convs = {"conv"}, bns = {"bn1"}, se = false; break;
    case BlockKind::DepthwiseSeparable: convs = {"conv_dw", "conv_pw"}, bns = {"bn1", "bn2"}; break;
    case BlockKind::InvertedResidual: convs = {"conv_pw", "conv_dw", "conv_pwl"}, bns = {"bn1", "bn2", "bn3"}; break;
    case BlockKind::EdgeResidual: convs = {"conv_exp", "conv_pwl"}, bns = {"bn1", "bn2"}; break;
  }
  std::vector<std::string> out;
  for (const auto& c : convs) out.push_back(c + ".weight");  // timm's block convs have no bias
  for (const auto& b : bns)
    for (const auto& part : kBnParts) out.push_back(b + "." + part);
  if (se) out.insert(out.end(), kSeParts.begin(), kSeParts.end());
  return out;
}

// "blocks.12.3.conv_pw.weight" -> "blocks.12.3"; "" when not of that form.
std::string block_of(const std::string& name) {
  size_t pos = 0;
  if (name.rfind("blocks.", 0) != 0) return "";
  pos = 7;
  for (int part = 0; part < 2; ++part) {
    const size_t start = pos;
    while (pos < name.size() && std::isdigit(static_cast<unsigned char>(name[pos]))) ++pos;
    if (pos == start || pos >= name.size() || name[pos] != '.') return "";
    ++pos;
  }
  return name.substr(0, pos - 1);
}

}  // namespace

const char* block_kind_name(BlockKind k) {
  switch (k) {
    case BlockKind::ConvBnAct: return "conv-bn-act";
    case BlockKind::DepthwiseSeparable: return "depthwise-separable";
    case BlockKind::InvertedResidual: return "inverted residual";
    case BlockKind::EdgeResidual: return "edge residual";
  }
  return "?";
}

BlockTensors group_block_tensors(const std::vector<std::string>& names) {
  BlockTensors out;
  for (const auto& n : names) {
    std::string blk = block_of(n);
    if (!blk.empty()) out[blk].push_back(n);
  }
  return out;
}

ConvSpec Builder::spec_for(const std::string& conv, int x, int stride) const {
  const Shape& ws = b_.shape_of(conv + ".weight");
  const Shape& xs = b_.graph().values.at(x).shape;
  ConvSpec spec;
  spec.stride = stride;
  if (ws.size() != 4 || xs.size() != 4) return spec;  // LayerBuilder::conv names the bad shape
  if (style_.tf_same) {
    spec.pads = tf_same_pads(xs, ws, stride);
  } else {
    // timm's get_padding(): ((stride - 1) + (k - 1)) // 2 per side, symmetric.
    const int ph = static_cast<int>((stride - 1 + ws[2] - 1) / 2), pw = static_cast<int>((stride - 1 + ws[3] - 1) / 2);
    spec.pads = {ph, pw, ph, pw};
  }
  return spec;
}

int Builder::conv_bn(const std::string& conv, const std::string& bn, int x, int stride, Activation act) {
  int y = b_.batch_norm(bn, b_.conv(conv, x, spec_for(conv, x, stride)), style_.bn_eps);
  return act == Activation::None ? y : b_.act(bn + ".act", y, act);
}

int Builder::squeeze_excite(const std::string& p, int x) {
  const std::string se = p + ".se";
  if (!b_.has(se + ".conv_reduce.weight") && !b_.has(se + ".conv_expand.weight")) return x;
  ++se_blocks_;
  // timm's SqueezeExcite: mean over H,W -> 1x1 reduce (bias) -> block's act -> 1x1 expand (bias) -> sigmoid gate.
  int s = b_.graph().add_node(Op::GlobalAvgPool, se + ".pool", {x});
  s = b_.act(se + ".act1", b_.conv(se + ".conv_reduce", s), style_.act);
  s = b_.act(se + ".gate", b_.conv(se + ".conv_expand", s), Activation::Sigmoid);
  return b_.graph().add_node(Op::Mul, se + ".mul", {x, s});
}

BlockKind Builder::kind_of(const std::string& p, const std::vector<std::string>& tensors) const {
  if (b_.has(p + ".conv_exp.weight")) return BlockKind::EdgeResidual;
  if (b_.has(p + ".conv_pwl.weight")) return BlockKind::InvertedResidual;
  if (b_.has(p + ".conv_dw.weight")) return BlockKind::DepthwiseSeparable;
  if (b_.has(p + ".conv.weight")) return BlockKind::ConvBnAct;
  fail_input("timm_efficientnet: block '", p, "' is none of the EfficientNet blocks (no conv_exp, conv_pwl, conv_dw or "
             "conv tensor); its first tensor is '", tensors.empty() ? std::string("?") : tensors.front(), "'");
}

void Builder::check_tensors(const std::string& p, BlockKind kind, const std::vector<std::string>& tensors) const {
  const std::vector<std::string> ok = allowed_tensors(kind);
  for (const auto& t : tensors) {
    const std::string rest = t.substr(p.size() + 1);
    if (std::find(ok.begin(), ok.end(), rest) == ok.end())
      fail_input("timm_efficientnet: unexpected tensor '", t, "' ", shape_str(b_.shape_of(t)), " in ",
                 block_kind_name(kind), " block '", p, "' (not part of timm's ", block_kind_name(kind), " block)");
  }
}

int Builder::block(const std::string& p, const std::vector<std::string>& tensors, int x, int stride) {
  const BlockKind kind = kind_of(p, tensors);
  check_tensors(p, kind, tensors);
  const Activation act = style_.act;
  int y = x;
  switch (kind) {
    case BlockKind::ConvBnAct:
      y = conv_bn(p + ".conv", p + ".bn1", x, stride, act);
      break;
    case BlockKind::DepthwiseSeparable:
      // Stride on the depthwise conv; no activation after the pointwise conv (timm: pw_act=False).
      y = conv_bn(p + ".conv_dw", p + ".bn1", x, stride, act);
      y = squeeze_excite(p, y);
      y = conv_bn(p + ".conv_pw", p + ".bn2", y, 1, Activation::None);
      break;
    case BlockKind::InvertedResidual:
      y = conv_bn(p + ".conv_pw", p + ".bn1", x, 1, act);
      y = conv_bn(p + ".conv_dw", p + ".bn2", y, stride, act);
      y = squeeze_excite(p, y);
      y = conv_bn(p + ".conv_pwl", p + ".bn3", y, 1, Activation::None);
      break;
    case BlockKind::EdgeResidual:
      // Fused MBConv: the full kxk expansion conv carries the stride.
      y = conv_bn(p + ".conv_exp", p + ".bn1", x, stride, act);
      y = squeeze_excite(p, y);
      y = conv_bn(p + ".conv_pwl", p + ".bn2", y, 1, Activation::None);
      break;
  }
  // timm: has_skip = stride == 1 and in_chs == out_chs (and not noskip; no
  // EfficientNet/Lite/V2 arch def sets noskip, and every V2 "cn" stage sets skip).
  const Shape& xs = b_.graph().values[x].shape;
  const Shape& ys = b_.graph().values[y].shape;
  if (stride == 1 && xs == ys) y = b_.graph().add_node(Op::Add, p + ".add", {y, x});
  return y;
}

}  // namespace kiln::effnet
