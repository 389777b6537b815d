// Internal to the CUDA backend: which squeeze-excitation patterns of a shaped
// graph run as kiln's se_mlp steps (se.cu). Graph analysis only (no CUDA), so
// it is tested without a GPU.
#pragma once
#include <cstddef>
#include <map>
#include <vector>

#include "ir/fusion_marks.hpp"
#include "ir/graph.hpp"

namespace kiln::cuda {

// The blocks are the muls the fuse_squeeze_excitation pass marked
// (ir/fusion_marks.hpp): global pool -> 1x1 conv (+bias, +act) -> 1x1 conv
// (+bias) + sigmoid -> mul (channel scale). The two tiny convs run as one
// se_mlp step at the second conv's place, then the mul; with `fuse_mul` the
// convs and the mul are one se_mlp_scale step at the mul's place. The pooled
// tensor is read at that later step, so it stays alive until then.
struct SePlan {
  std::vector<size_t> fused_away;                   // nodes with no step of their own
  std::map<size_t, SqueezeExcitation> mlp_at;       // second conv -> its block (se_mlp step here)
  std::map<size_t, SqueezeExcitation> scale_at;     // mul -> its block (se_mlp_scale step here)
  std::map<int, int> live_until;                    // pooled value -> the node index whose step reads it
};

SePlan plan_squeeze_excitation(const Graph& g, bool fuse_mul);

// A 1x1, stride-1, unpadded, ungrouped conv with a bias and no residual.
bool is_pointwise_with_bias(const Graph& g, const Node& n);

}  // namespace kiln::cuda
