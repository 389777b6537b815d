// Shared building blocks for families: turns checkpoint tensors into graph
// constants and common layers (conv, batch norm, activation, linear), and
// keeps track of which tensors were consumed so a family can reject a
// checkpoint with a tensor it did not expect (by name) instead of silently
// ignoring part of the model.
#pragma once
#include <array>
#include <set>
#include <string>

#include "checkpoint/safetensors.hpp"
#include "ir/graph.hpp"

namespace kiln {

struct ConvSpec {
  int stride = 1;
  int dilation = 1;
  int padding = -1;  // -1: symmetric (k-1)/2*dilation, PyTorch-style
  // Explicit (top, left, bottom, right) padding; used instead of `padding`
  // when pads[0] >= 0 (TensorFlow "same" padding is asymmetric).
  std::array<int, 4> pads{-1, -1, -1, -1};
};

// TensorFlow "same" padding (top, left, bottom, right) for a conv over an
// [N,C,H,W] input `x` with weight [O,I,kh,kw]: the output is ceil(in/stride)
// and the odd pixel of padding goes to the bottom/right, as in TF and timm's
// pad_same. Static shapes make this a build-time constant.
std::array<int, 4> tf_same_pads(const Shape& x, const Shape& weight, int stride, int dilation = 1);

class LayerBuilder {
 public:
  LayerBuilder(const Checkpoint& ckpt, std::string family);

  Graph& graph() { return graph_; }
  Graph take_graph() { return std::move(graph_); }
  bool has(const std::string& tensor) const { return ckpt_.has(tensor); }
  // Shape of a checkpoint tensor; Error(Input) naming it when absent.
  const Shape& shape_of(const std::string& tensor) const;
  // The tensor as an f32 graph constant (F32/F16/BF16 accepted); marks it used.
  int weight(const std::string& tensor);

  // conv "<prefix>.weight" (+ "<prefix>.bias" when present); groups from the
  // weight's input-channel count.
  int conv(const std::string& prefix, int x, const ConvSpec& spec = {});
  int batch_norm(const std::string& prefix, int x, double eps);
  int act(const std::string& name, int x, Activation a);
  int linear(const std::string& prefix, int x);

  // Every checkpoint tensor must have been used, except those matching
  // `ignored_suffix` (e.g. "num_batches_tracked"). Error(Input) names the
  // first unexpected tensor and the file.
  void check_all_used(const std::string& ignored_suffix) const;

 private:
  const Checkpoint& ckpt_;
  std::string family_;
  Graph graph_;
  std::set<std::string> used_;
};

}  // namespace kiln
