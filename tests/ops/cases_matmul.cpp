// matmul cases: ranks 2-5, equal leading dims (attention's q·kᵀ and p·v
// shapes), a 2-D right operand shared by every leading index (a constant, as
// a projection would be), a 2-D left constant shared by a batched right one,
// K = 1, N = 1, batches 1 and 3.
#include <cmath>

#include "op_harness.hpp"

namespace kiln::ops {

void add_matmul_cases(std::vector<OpCase>& out) {
  struct MatMulSpec {
    const char* tag;
    Shape a, b;
    bool a_const, b_const;
  };
  const MatMulSpec specs[] = {
      {"r4_heads_b1", {1, 2, 13, 24}, {1, 2, 24, 13}, false, false},
      {"r4_heads_b3", {3, 2, 13, 8}, {3, 2, 8, 13}, false, false},
      {"r2_b3_const_b", {3, 24}, {24, 13}, false, true},
      {"r3_b3", {3, 13, 24}, {3, 24, 13}, false, false},
      {"r3_const_b_n1_b1", {1, 13, 24}, {24, 1}, false, true},
      {"r4_const_a_b3", {13, 24}, {3, 2, 24, 5}, true, false},
      {"r5_b1", {1, 2, 3, 13, 4}, {1, 2, 3, 4, 24}, false, false},
      {"r3_k1_b3", {3, 13, 1}, {3, 1, 24}, false, false},
      {"r4_attention_300_b1", {1, 8, 300, 32}, {1, 8, 32, 300}, false, false},  // q·kᵀ of RT-DETR's decoder size
  };
  for (DType dt : kCaseTypes)
    for (const MatMulSpec& s : specs) {
      // Sums of up to 24 products: as linear (cases_elementwise.cpp), relative to the largest output.
      OpCase c = one_node_case("matmul", s.tag, dt, limit_for(Measure::MaxRel, dt, 1e-4, 5e-3, 3e-2));
      CaseBuilder b(c.name, dt);
      const float r = 1.7f / std::sqrt(static_cast<float>(s.a.back()));
      const int a = s.a_const ? b.weight("a", s.a, -1.f, 1.f) : b.input("a", s.a);
      const int w = s.b_const ? b.weight("b", s.b, -r, r) : b.input("b", s.b);
      c.graph = b.finish(b.node(Op::MatMul, "attn.matmul", {a, w}));
      out.push_back(std::move(c));
    }
}

}  // namespace kiln::ops
