// attention cases: RT-DETR-like heads (8 heads of width 4 here), key counts
// that are and are not multiples of a warp, one key, a value width unlike
// the key width, batch 2, a scale with large scores (softmax far from
// uniform), and a head too wide for shared memory (k and v read from L2: the
// exact kernel's other path); every storage type. Heads of width 16k take
// the CUDA tensor-core kernel in f16/bf16 (f32 stays on the exact kernel):
// RT-DETR's real shapes (AIFI 400 tokens, decoder 300 queries, 8 heads of
// 32, batch 1 and 8), query and key counts off the 16/64 tiles with widths
// 16 and 64, a sharp softmax, value widths unlike the key width (up to the
// widest, 128), and keys past the kernel's ring of shared tiles (d = 64: 4
// tiles of 64 keys; d = 32: 8) so slots are refilled. On a 132-SM H200 the
// batch-1 shapes split each key tile over a block's 4 warps, decoder_b2
// over 2 and batch 8 not at all, so every split of the kernel runs. Group
// case: q, k and v from linear layers of one token tensor, as RT-DETR's
// layers give them.
#include "op_harness.hpp"

namespace kiln::ops {

namespace {

// The reference computes in double, the CPU backend in f32 (dot products of
// D terms, softmax, weighted sums of Lk terms); f16/bf16 add the rounding of
// the result, and on the CUDA tensor-core path that of the softmax weights
// before they multiply v (relative 2^-11 / 2^-8 each, errors that average
// out over the keys: an emulation of the kernel gives about 5e-4 / 3.5e-3
// for the RT-DETR shapes, most of it the rounding of y). Outputs are
// weighted means of values in [-1, 1]: max|got - ref| / max|ref|.
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
      {"rtdetr_aifi_h8_d32", 1, 400, 400, 8, 32, 32, 0.1767767, -1.f, 1.f},
      {"rtdetr_decoder_h8_d32", 1, 300, 300, 8, 32, 32, 0.1767767, -1.f, 1.f},
      {"rtdetr_decoder_b2", 2, 300, 300, 8, 32, 32, 0.1767767, -1.f, 1.f},
      {"rtdetr_decoder_b8", 8, 300, 300, 8, 32, 32, 0.1767767, -1.f, 1.f},
      {"tiles_off_q37_k70_h2_d64", 1, 37, 70, 2, 64, 64, 0.125, -1.f, 1.f},
      {"tiles_off_q21_k50_h3_d16_b2", 2, 21, 50, 3, 16, 16, 0.25, -1.f, 1.f},
      {"sharp_softmax_h2_d32", 1, 33, 90, 2, 32, 32, 2.0, -3.f, 3.f},
      {"one_key_h2_d16", 1, 5, 1, 2, 16, 16, 1.0, -1.f, 1.f},
      {"dv_unlike_d_h2_d32_dv64", 1, 20, 200, 2, 32, 64, 0.2, -1.f, 1.f},
      {"ring_refill_k333_h1_d64", 1, 17, 333, 1, 64, 64, 0.125, -1.f, 1.f},
      {"ring_refill_k1100_h1_d32", 1, 17, 1100, 1, 32, 32, 0.18, -1.f, 1.f},
      {"wide_k700_h1_d128", 1, 40, 700, 1, 128, 128, 0.088, -1.f, 1.f},
      {"widths_d80_dv48_h1", 1, 19, 129, 1, 80, 48, 0.11, -1.f, 1.f},
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
  // q and k as slices of one projection of x + pos (weights [2C, C]): CUDA's
  // attention reads both in place, rows 2C apart (plan_row_windows). Head
  // width 4 (the exact kernel) and 32 (tensor cores in f16/bf16).
  struct Merged {
    const char* tag;
    int64_t n, l, c, heads;
  };
  for (DType dt : kCaseTypes)
    for (const Merged& m : {Merged{"h4_d4", 1, 12, 16, 4}, Merged{"h2_d32_b2", 2, 30, 64, 2}}) {
      OpCase c;
      c.name = std::string("group_attention_qk_windows_") + m.tag + "_" + dtype_name(dt);
      c.group = "group:attention_qk_windows";
      c.dtype = dt;
      c.limit = limit_for(Measure::MaxRel, dt, 1e-5, 4e-3, 2e-2);
      CaseBuilder b(c.name, dt);
      const int x = b.input("x", {m.n, m.l, m.c});
      const int qk_in = b.node(Op::Add, "self_attn.pos_add", {x, b.input("pos", {m.n, m.l, m.c})});
      const float r = 2.f / static_cast<float>(m.c);
      auto linear = [&](const std::string& name, int in, int64_t rows) {
        return b.node(Op::Linear, name, {in, b.weight(name + ".weight", {rows, m.c}, -r, r), b.weight(name + ".bias", {rows}, -0.1f, 0.1f)});
      };
      const int qk = linear("self_attn.qk_proj", qk_in, 2 * m.c);
      auto half = [&](const char* name, int64_t start) {
        return b.node(Op::Slice, name, {qk}, {{"axis", int64_t{-1}}, {"start", start}, {"end", start + m.c}});
      };
      const int att = b.node(Op::Attention, "self_attn.attention",
                             {half("self_attn.q", 0), half("self_attn.k", m.c), linear("self_attn.v_proj", x, m.c)},
                             {{"heads", m.heads}, {"scale", 0.5}});
      c.graph = b.finish(linear("self_attn.out_proj", att, m.c));
      out.push_back(std::move(c));
    }
}

}  // namespace kiln::ops
