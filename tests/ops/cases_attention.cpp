// attention cases: RT-DETR-like heads (8 heads of width 4 here, 32 in the
// model), key counts that are and are not multiples of a warp, one key, a
// value width unlike the key width, batch 2, a scale with large scores
// (softmax far from uniform), and a head too wide for shared memory (k and v
// read from L2: the kernel's other path); every storage type. Group case:
// q, k and v from linear layers of one token tensor, as RT-DETR's layers
// give them.
#include "op_harness.hpp"

namespace kiln::ops {

namespace {

// The reference computes in double, the CPU backend in f32 (dot products of
// D terms, softmax, weighted sums of Lk terms); f16/bf16 add the rounding of
// the result. Outputs are weighted means of values in [-1, 1]: max|got - ref| / max|ref|.
Limit attention_limit(DType dt) { return limit_for(Measure::MaxRel, dt, 1e-5, 2e-3, 1e-2); }

struct AttentionSpec {
  const char* tag;
  int64_t n, lq, lk, heads, d, dv;
  double scale;
  float lo, hi;
};

}  // namespace

void add_attention_cases(std::vector<OpCase>& out) {
  const AttentionSpec specs[] = {
      {"rtdetr_h8_d4", 1, 20, 20, 8, 4, 4, 0.5, -1.f, 1.f},
      {"keys_37_h3_d5_dv7_b2", 2, 5, 37, 3, 5, 7, 1.0, -1.f, 1.f},
      {"warp_multiple_h1_d32", 1, 33, 64, 1, 32, 32, 0.1767767, -1.f, 1.f},
      {"one_key_h2_d3", 1, 3, 1, 2, 3, 3, 1.0, -1.f, 1.f},
      {"sharp_softmax_h2_d8", 1, 9, 40, 2, 8, 8, 2.0, -3.f, 3.f},
      {"kv_from_l2_h1_d192", 1, 4, 140, 1, 192, 192, 0.07, -1.f, 1.f},
  };
  for (DType dt : kCaseTypes)
    for (const AttentionSpec& s : specs) {
      OpCase c = one_node_case("attention", s.tag, dt, attention_limit(dt));
      c.input_lo = s.lo, c.input_hi = s.hi;
      CaseBuilder b(c.name, dt);
      const int q = b.input("q", {s.n, s.lq, s.heads * s.d});
      const int k = b.input("k", {s.n, s.lk, s.heads * s.d});
      const int v = b.input("v", {s.n, s.lk, s.heads * s.dv});
      c.input_range["v"] = {-1.f, 1.f};
      c.graph = b.finish(b.node(Op::Attention, "encoder.layers.0.self_attn.attention", {q, k, v},
                                {{"heads", s.heads}, {"scale", s.scale}}));
      out.push_back(std::move(c));
    }
  // RT-DETR's form: q = linear(x + pos), k = linear(x + pos), v = linear(x), then the output projection.
  for (DType dt : kCaseTypes) {
    const int64_t n = 1, l = 12, c_ = 16, heads = 4;
    OpCase c;
    c.name = std::string("group_attention_projected_") + dtype_name(dt);
    c.group = "group:attention_projected";
    c.dtype = dt;
    c.limit = limit_for(Measure::MaxRel, dt, 1e-5, 4e-3, 2e-2);
    CaseBuilder b(c.name, dt);
    const int x = b.input("x", {n, l, c_});
    const int pos = b.input("pos", {n, l, c_});
    const int qk = b.node(Op::Add, "self_attn.pos_add", {x, pos});
    auto linear = [&](const std::string& name, int in) {
      return b.node(Op::Linear, name, {in, b.weight(name + ".weight", {c_, c_}, -0.25f, 0.25f), b.weight(name + ".bias", {c_}, -0.1f, 0.1f)});
    };
    const int att = b.node(Op::Attention, "self_attn.attention", {linear("self_attn.q_proj", qk), linear("self_attn.k_proj", qk),
                                                                  linear("self_attn.v_proj", x)},
                           {{"heads", heads}, {"scale", 0.5}});
    c.graph = b.finish(linear("self_attn.out_proj", att));
    out.push_back(std::move(c));
  }
}

}  // namespace kiln::ops
