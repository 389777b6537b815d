// conv2d cases: awkward channel counts (1, 3, 12, 13, 24), batch 1 and 3,
// 1x1 spatial maps, odd strides, asymmetric pads, dilations, groups and
// depthwise (with and without a channel multiplier), non-square kernels,
// every fused epilogue part (bias, residual, each activation).
#include <cmath>

#include "core/window.hpp"
#include "op_harness.hpp"

namespace kiln::ops {

namespace {

struct ConvSpec {
  const char* tag;
  int64_t n, c, h, w, k, kh, kw;
  std::vector<int64_t> strides, pads, dilations;  // pads: top, left, bottom, right
  int64_t groups;
  bool bias, residual;
  const char* act;
};

// Limits (max|d| / max|ref|): f32 leaves only summation order (double in the
// reference, f32 GEMMs or cuDNN's algorithms, TF32 off, Winograd and FFT
// engines included: 1e-4 as tests/gpu/test_cuda_conv) at K <= 24*49 terms;
// f16/bf16 outputs are rounded once to 11/8 significant bits, so one rounding
// step flipped the other way is 2^-10 / 2^-7 of the output, and CUDA
// epilogues that are not fused store the conv, then add bias and residual,
// each rounded: a few ulps, hence 5e-3 and 3e-2 (as tests/gpu/test_cuda_conv).
constexpr double kConvF32 = 1e-4, kConvF16 = 5e-3, kConvBf16 = 3e-2;

OpCase conv_case(const ConvSpec& s, DType dt) {
  OpCase c;
  c.name = std::string("conv2d_") + s.tag + "_" + dtype_name(dt);
  c.group = "conv2d";
  c.dtype = dt;
  CaseBuilder b(c.name, dt);
  const int x = b.input("x", {s.n, s.c, s.h, s.w});
  const int64_t fan_in = s.c / s.groups * s.kh * s.kw;
  // Weights of ~1/sqrt(fan_in) keep outputs O(1), so relu6 and the sigmoid see both their flat and steep parts.
  const float wr = 1.7f / std::sqrt(static_cast<float>(fan_in));
  std::vector<int> ins = {x, b.weight("w", {s.k, s.c / s.groups, s.kh, s.kw}, -wr, wr)};
  if (s.bias || s.residual) ins.push_back(b.weight("b", {s.k}, s.bias ? -0.5f : 0.f, s.bias ? 0.5f : 0.f));
  if (s.residual) {
    const int64_t oh = window_out_dim(s.h, s.kh, s.strides[0], s.pads[0], s.pads[2], s.dilations[0]);
    const int64_t ow = window_out_dim(s.w, s.kw, s.strides[1], s.pads[1], s.pads[3], s.dilations[1]);
    ins.push_back(b.input("residual", {s.n, s.k, oh, ow}));
  }
  Attrs a = {{"strides", s.strides}, {"pads", s.pads}, {"dilations", s.dilations}, {"groups", s.groups}};
  if (std::string(s.act) != "none") a["activation"] = std::string(s.act);
  c.graph = b.finish(b.node(Op::Conv2d, "conv", ins, a));
  c.limit = limit_for(Measure::MaxRel, dt, kConvF32, kConvF16, kConvBf16);
  return c;
}

}  // namespace

void add_conv_cases(std::vector<OpCase>& out) {
  using V = std::vector<int64_t>;
  const V s1 = {1, 1}, s2 = {2, 2}, d1 = {1, 1}, p0 = {0, 0, 0, 0}, p1 = {1, 1, 1, 1};
  const ConvSpec specs[] = {
      // tag                      n  c   h   w   k   kh kw strides   pads            dilations groups bias  res    act
      {"c13_k24_3x3_relu",        1, 13, 9, 11, 24, 3, 3, s1, p1, d1, 1, true, false, "relu"},
      {"c12_k13_3x3s2_b3_silu",   3, 12, 10, 7, 13, 3, 3, s2, p1, d1, 1, true, false, "silu"},
      {"c24_k24_1x1_direct",      1, 24, 6, 5, 24, 1, 1, s1, p0, d1, 1, true, false, "none"},
      {"c24_k12_1x1s2_relu6",     3, 24, 7, 9, 12, 1, 1, s2, p0, d1, 1, true, false, "relu6"},
      {"c13_k13_1x1_nobias",      1, 13, 4, 4, 13, 1, 1, s1, p0, d1, 1, false, false, "none"},
      {"dw13_3x3_silu",           1, 13, 9, 9, 13, 3, 3, s1, p1, d1, 13, true, false, "silu"},
      {"dw24_5x5s2_b3_relu",      3, 24, 11, 8, 24, 5, 5, s2, {2, 2, 2, 2}, d1, 24, true, false, "relu"},
      {"dw12_3x3_residual",       1, 12, 6, 7, 12, 3, 3, s1, p1, d1, 12, true, true, "relu"},
      {"dw12_mult2_3x3",          1, 12, 6, 6, 24, 3, 3, s1, p1, d1, 12, true, false, "none"},
      {"g4_c24_k12_3x3_sigmoid",  1, 24, 7, 7, 12, 3, 3, s1, p1, d1, 4, true, false, "sigmoid"},
      {"g3_c12_k24_3x3s2_b3",     3, 12, 9, 9, 24, 3, 3, s2, p1, d1, 3, false, false, "relu"},
      {"c12_k24_3x3_dil2",        1, 12, 9, 10, 24, 3, 3, s1, {2, 2, 2, 2}, {2, 2}, 1, true, false, "relu"},
      {"c13_k12_3x3_dil2x1",      3, 13, 9, 7, 12, 3, 3, s1, {2, 1, 2, 1}, {2, 1}, 1, true, false, "none"},
      {"tfsame_c13_k24_3x3s2",    1, 13, 8, 8, 24, 3, 3, s2, {0, 0, 1, 1}, d1, 1, true, false, "silu"},
      {"asym_c12_k13_3x2_s2x1",   1, 12, 9, 8, 13, 3, 2, {2, 1}, {1, 2, 0, 1}, d1, 1, true, false, "relu6"},
      {"c13_k24_3x3_res_relu",    3, 13, 6, 5, 24, 3, 3, s1, p1, d1, 1, true, true, "relu"},
      {"c24_k24_1x1_res_nobias",  1, 24, 5, 5, 24, 1, 1, s1, p0, d1, 1, false, true, "relu"},
      {"c24_k13_3x3s2_res_none",  1, 24, 7, 7, 13, 3, 3, s2, p1, d1, 1, true, true, "none"},
      {"c24_k13_1x1_on_1x1_b3",   3, 24, 1, 1, 13, 1, 1, s1, p0, d1, 1, true, false, "relu"},
      {"c12_k12_3x3_on_1x1",      1, 12, 1, 1, 12, 3, 3, s1, p1, d1, 1, true, false, "silu"},
      {"stem_c3_k12_7x7s2",       1, 3, 16, 15, 12, 7, 7, s2, {3, 3, 3, 3}, d1, 1, true, false, "relu"},
      {"c13_k24_3x3_valid_to_1x1", 3, 13, 3, 3, 24, 3, 3, s1, p0, d1, 1, true, false, "none"},
      {"c1_k12_3x3",              1, 1, 8, 9, 12, 3, 3, s1, p1, d1, 1, true, false, "relu"},
      {"c12_k12_3x3s3",           1, 12, 11, 11, 12, 3, 3, {3, 3}, p1, d1, 1, true, false, "none"},
      // RT-DETR's batch_ones (families/rt_detr_v2/family.cpp): one output channel, a 1x1
      // kernel at the input's size as stride, so the output is one pixel per image.
      {"c3_k1_1x1_stride_hw_b2",  2, 3, 16, 24, 1, 1, 1, {16, 24}, p0, d1, 1, true, false, "none"},
      // Channels in multiples of 8 (the 16-bit engines also time kiln's implicit-GEMM conv
      // here, switch igemm_conv: harness_cuda.cpp): a basic block's conv with residual at
      // batch 2, a strided 3x3 into fewer channels.
      {"c32_k64_3x3_b2_res_relu", 2, 32, 12, 10, 64, 3, 3, s1, p1, d1, 1, true, true, "relu"},
      {"c64_k32_3x3s2_silu",      1, 64, 13, 15, 32, 3, 3, s2, p1, d1, 1, true, false, "silu"},
      // kiln's direct conv (switch direct_conv: <= 4 input channels, k a multiple of 8) and sm90
      // conv (switch sm90_conv: f16, channels in whole 32/64-channel chunks), both timed by the
      // CUDA harness: an RGB stem, a 4-channel conv with residual, 64/128-channel convs.
      {"stem_c3_k16_3x3s2_b2_relu", 2, 3, 17, 18, 16, 3, 3, s2, p1, d1, 1, true, false, "relu"},
      {"c4_k8_5x5_res_silu",      1, 4, 9, 9, 8, 5, 5, s1, {2, 2, 2, 2}, d1, 1, true, true, "silu"},
      {"c64_k128_3x3_res_relu",   1, 64, 11, 12, 128, 3, 3, s1, p1, d1, 1, true, true, "relu"},
      {"c128_k64_1x1s2_b2_none",  2, 128, 9, 9, 64, 1, 1, s2, p0, d1, 1, false, false, "none"},
      // Maps large enough that the CPU backend splits im2col rows, epilogue rows and
      // depthwise planes over its thread pool (small cases run in one chunk).
      {"big_c24_k24_3x3_28x28_res", 1, 24, 28, 28, 24, 3, 3, s1, p1, d1, 1, true, true, "relu"},
      {"big_dw64_3x3s2_b3_silu",  3, 64, 23, 23, 64, 3, 3, s2, p1, d1, 64, true, false, "silu"},
      {"big_c13_k64_1x1_30x30",   1, 13, 30, 30, 64, 1, 1, s1, p0, d1, 1, true, false, "relu6"},
  };
  for (DType dt : kCaseTypes)
    for (const ConvSpec& s : specs) out.push_back(conv_case(s, dt));
}

}  // namespace kiln::ops
