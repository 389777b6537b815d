// Marks the gate (mul) of every squeeze-excitation block: global pool ->
// pointwise conv + bias (+ act) -> pointwise conv + bias + sigmoid -> mul,
// fusion mark squeeze_excitation (ir/fusion_marks.hpp). The CUDA backend runs
// the two small convs (and, with switch fuse_se_mul, the gate) as one step.
#include "ir/fusion_marks.hpp"
#include "passes/pass.hpp"

namespace kiln {

int fuse_squeeze_excitation(Graph& g) {
  return mark_each(g, Op::Mul, kMarkSqueezeExcitation, [&](size_t i) { return squeeze_excitation_at(g, i).has_value(); });
}

}  // namespace kiln
