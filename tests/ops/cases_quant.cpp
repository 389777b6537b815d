// 8-bit cases (issue 13): quantize and dequantize per tensor and per channel
// into e4m3 and i8 (inputs past the e4m3 range so saturation is exercised),
// and the quantized conv2d / linear groups: 8-bit x and weight (per-output-
// channel scales), wide or 8-bit output (the output scale folded for
// none/relu, applied after the activation for silu), bias, residual, groups,
// strides and padding. Every case is Exact on the CPU: the CPU kernels and
// the plain reference run the same arithmetic (quant/layer.hpp), bit for bit.
// On CUDA quantize and dequantize are Exact too, INT8 layers are Exact
// where the activation is none or ReLU (cuda_int8_layer: exact int32 sums),
// and the FP8 layers have their own limit (cuda_fp8_layer below): the engines
// accumulate in another order and precision than the CPU's exact sum.
#include "core/error.hpp"
#include "ir/quant_form.hpp"
#include "op_harness.hpp"
#include "quant/fp8.hpp"

namespace kiln::ops {

namespace {

const char* code_tag(DType code) { return code == DType::I8 ? "i8" : "f8"; }

// An INT8 layer on CUDA: its raw sum is the exact integer sum (cuBLASLt's and
// cuDNN's i8 engines accumulate in int32, exact below 2^31: |products| <=
// 2^14, reductions here <= 288 terms), rounded once to f32 as the CPU does, and
// the epilogue is the CPU's f32 operations: Exact for none and ReLU. SiLU and
// GELU take CUDA's expf / erff, within an f32 ulp or two of the CPU's libm;
// after the output scale that can move a value across an i8 rounding midpoint:
// one code, i.e. 1 / 127 of the largest |code| the case reaches at most
// (MaxRel, 8e-3 with the margin), or a few f32 ulps for wide outputs.
Declared cuda_int8_layer(Activation act, bool out_8bit) {
  Declared d;
  if (act == Activation::None || act == Activation::Relu) return d;  // the case's Exact limit
  d.why = "CUDA's expf / erff against the CPU's libm: an f32 ulp, one i8 code after rounding (cuda_int8_layer)";
  d.limit = Limit{Measure::MaxRel, out_8bit ? 8e-3 : 1e-5};
  return d;
}

// The CUDA limit of a quantized FP8 layer, MaxRel (max|got - ref| / max|ref|).
// The CPU's sum is exact; cuBLASLt's and cuDNN's FP8 tensor-core sums are
// not: products of two e4m3 codes are exact, but Hopper adds each k-group of
// 32 products into an accumulator kept to about 14 mantissa bits (cuBLASLt
// promotes to f32 periodically with fast accumulation off; cuDNN's engines
// are not documented either way), so each of the <= K/32 = 9 additions of
// these cases (reduction K <= 288) errs by <= 2^-13 of the sum of |terms|.
// With random signs, sum |terms| / max|sum| is about 0.25 sqrt(K) <= 4.3
// (uniform codes: E|x| / rms(x) = 0.87, max|sum| ~ 3 sigma), so the sum errs
// by <= 9 * 2^-13 * 4.3 = 4.7e-3 of max|ref|; alpha, bias and the activation
// are the CPU's f32 operations (ulps).
// Then the storage rounding of the output, relative to the value <= max|ref|:
// f32 0, f16 2^-11, bf16 2^-8 (half an ulp each, but the CPU and the GPU may
// round a value near a midpoint apart: a whole ulp); e4m3 one code step, at
// most 2^-3 of the value (a step in [2^e, 2^(e+1)) is 2^(e-3)). An error in
// the layout, a scale or the padding is of the order of max|ref| itself.
Declared cuda_fp8_layer(DType out) {
  const double sum = 5e-3;
  const double storage = out == DType::F8E4M3 ? 0.125 : out == DType::BF16 ? 0.0078125 : out == DType::F16 ? 4.9e-4 : 0.0;
  Declared d;
  d.why = "FP8 GEMM/conv engines accumulate in their own order and precision (bound derived above cuda_fp8_layer, cases_quant.cpp)";
  d.limit = Limit{Measure::MaxRel, sum + storage};
  return d;
}

// Scales 0.01 .. 0.04 over `count` channels (a per-channel QuantParams on axis), or one 0.025.
QuantParams scales(DType code, int count, int axis) {
  QuantParams q;
  q.dtype = code, q.axis = axis;
  for (int i = 0; i < count; ++i) q.scales.push_back(count == 1 ? 0.025f : 0.01f + 0.03f * static_cast<float>(i) / static_cast<float>(count));
  return q;
}

void add_qdq(std::vector<OpCase>& out) {
  for (DType dt : kCaseTypes)
    for (DType code : {DType::F8E4M3, DType::I8})
      for (int axis : {-1, 1, 3}) {
        // axis 3 (w): a per-index scale whose stored stride (NHWC on CUDA) is not 1 or the whole tensor
        const Shape s{2, 5, 3, 4};
        const std::string tag = std::string(code_tag(code)) + (axis < 0 ? "_tensor" : axis == 1 ? "_channel" : "_axis3");
        const int count = axis < 0 ? 1 : static_cast<int>(s[static_cast<size_t>(axis)]);
        {  // quantize: x in [-15, 15] at scales 0.01..0.04: e4m3 saturates (|x| / 0.01 > 448), i8 clamps
          OpCase c = one_node_case("quantize", tag, dt, {Measure::Exact, 0});
          Graph g;
          const int x = g.add_input("x", dt, s);
          const int y = g.add_node(Op::Quantize, "x.quantize", {x}, {{"dtype", std::string(dtype_name(code))}});
          g.values[y].quant = scales(code, count, axis);
          g.mark_output(y);
          c.graph = std::move(g);
          c.input_lo = -15.f, c.input_hi = 15.f;
          out.push_back(std::move(c));
        }
        {  // dequantize: codes over the whole range
          OpCase c = one_node_case("dequantize", tag, dt, {Measure::Exact, 0});
          Graph g;
          const int x = g.add_input("x", code, s);
          g.values[x].quant = scales(code, count, axis);
          g.mark_output(g.add_node(Op::Dequantize, "x.dequantize", {x}, {{"dtype", std::string(dtype_name(dt))}}));
          c.graph = std::move(g);
          c.input_lo = code == DType::I8 ? -128.f : -448.f, c.input_hi = code == DType::I8 ? 128.f : 448.f;
          out.push_back(std::move(c));
        }
      }
}

struct LayerSpec {
  const char* tag;
  Op op;
  Shape x, w;
  Attrs attrs;
  bool bias, residual;
  Activation act;
  bool out_8bit;
  bool residual_8bit = false;  // the residual as codes of the layer's type with one scale (a ResNet skip)
};

void add_layers(std::vector<OpCase>& out) {
  const Attrs plain;
  const Attrs s2p1{{"strides", std::vector<int64_t>{2, 2}}, {"pads", std::vector<int64_t>{1, 1, 1, 1}}};
  const Attrs g3{{"groups", int64_t{3}}, {"pads", std::vector<int64_t>{1, 0, 1, 2}}};
  const LayerSpec specs[] = {
      {"conv1x1_wide", Op::Conv2d, {2, 24, 5, 6}, {13, 24, 1, 1}, plain, true, false, Activation::None, false},
      {"conv3x3_s2_relu_8bit", Op::Conv2d, {1, 12, 9, 7}, {16, 12, 3, 3}, s2p1, true, false, Activation::Relu, true},
      {"conv3x3_g3_silu_8bit", Op::Conv2d, {2, 12, 6, 6}, {9, 4, 3, 3}, g3, true, false, Activation::Silu, true},
      {"conv1x1_residual_relu_wide", Op::Conv2d, {2, 16, 4, 4}, {24, 16, 1, 1}, plain, true, true, Activation::Relu, false},
      {"conv1x1_residual_8bit", Op::Conv2d, {1, 16, 4, 4}, {24, 16, 1, 1}, plain, false, true, Activation::None, true},
      {"linear_wide", Op::Linear, {3, 40}, {13, 40}, plain, true, false, Activation::None, false},
      {"linear_gelu_8bit", Op::Linear, {2, 4, 24}, {16, 24}, plain, true, false, Activation::Gelu, true},
      // Channels already multiples of 16 (no padding on CUDA), a strided 1x1 (cuDNN only, no GEMM
      // candidate), a 3x3 with residual into e4m3 (folded scale, residual scaled), an unpadded linear.
      {"conv3x3_c32_relu_wide", Op::Conv2d, {2, 32, 7, 7}, {32, 32, 3, 3}, s2p1, true, false, Activation::Relu, false},
      {"conv1x1_s2_8bit", Op::Conv2d, {1, 32, 6, 6}, {48, 32, 1, 1}, {{"strides", std::vector<int64_t>{2, 2}}}, true, false,
       Activation::None, true},
      {"conv3x3_residual_relu_8bit", Op::Conv2d, {1, 16, 5, 5}, {16, 16, 3, 3}, {{"pads", std::vector<int64_t>{1, 1, 1, 1}}},
       true, true, Activation::Relu, true},
      {"linear_k64_relu_wide", Op::Linear, {5, 64}, {32, 64}, plain, true, false, Activation::Relu, false},
      // A 1x1 with residual into a wide output, k a multiple of 16: the fused cuDNN candidate's
      // residual path (the GEMM competes with it; OpCudaFp8Fusion forces each).
      {"conv1x1_k32_residual_relu_wide", Op::Conv2d, {2, 32, 4, 4}, {32, 32, 1, 1}, plain, true, true, Activation::Relu, false},
      // 8-bit residuals (recipe "residuals": "8bit"): a ResNet conv3 (1x1, relu, codes in and out:
      // GEMM, cuDNN and the fused graph compete), one with k padded, a 3x3 into a wide output.
      {"conv1x1_k32_residual8_relu_8bit", Op::Conv2d, {2, 32, 4, 4}, {32, 32, 1, 1}, plain, true, true, Activation::Relu, true,
       true},
      {"conv1x1_residual8_8bit", Op::Conv2d, {1, 16, 4, 4}, {24, 16, 1, 1}, plain, true, true, Activation::None, true, true},
      // A ResNet layer2 conv3 in small: rows over several 128-row tiles, 256 output channels
      // (every CUTLASS tile shape), an 8-bit skip.
      {"conv1x1_k256_residual8_relu_8bit", Op::Conv2d, {2, 64, 10, 10}, {256, 64, 1, 1}, plain, true, true, Activation::Relu,
       true, true},
      {"conv3x3_residual8_relu_wide", Op::Conv2d, {1, 16, 5, 5}, {16, 16, 3, 3}, {{"pads", std::vector<int64_t>{1, 1, 1, 1}}},
       true, true, Activation::Relu, false, true},
  };
  for (DType dt : kCaseTypes)
    for (DType code : {DType::F8E4M3, DType::I8})
      for (const LayerSpec& s : specs) {
        OpCase c;
        c.name = cat("quantized_", s.tag, "_", code_tag(code), "_", dtype_name(dt));
        c.group = "group:quantized_layer";
        c.dtype = dt;
        c.limit = {Measure::Exact, 0};
        const uint32_t seed = name_seed(c.name);
        Graph g;
        const int x = g.add_input("x", code, s.x);
        g.values[x].quant = scales(code, 1, -1);
        // Weights: a real kernel quantized per output channel as a recipe does it (amax / code_max).
        const HostTensor wf = HostTensor::from_f32(s.w, uniform(static_cast<size_t>(shape_numel(s.w)), seed, -0.5f, 0.5f));
        const QuantParams wq = quant::weight_quant(wf, code);
        const int w = g.add_constant("w", quant::quantize_tensor(wf, wq, quant::Int8Range::Narrow));
        g.values[w].quant = wq;
        std::vector<int> ins{x, w};
        if (s.bias || s.residual)
          ins.push_back(g.add_constant("b", HostTensor::from_f32_as(dt, {s.w[0]}, uniform(static_cast<size_t>(s.w[0]), seed + 1, -2.f, 2.f))));
        Attrs attrs = s.attrs;
        attrs["activation"] = std::string(activation_name(s.act));
        attrs["out_dtype"] = std::string(dtype_name(s.out_8bit ? code : dt));
        if (s.residual) {
          // The residual's shape is the layer's output shape: infer it on a copy without one.
          Graph probe = g;
          const Shape ys = probe.values[probe.add_node(s.op, "probe", ins, attrs)].shape;
          const int r = g.add_input("residual", s.residual_8bit ? code : dt, ys);
          if (s.residual_8bit) g.values[r].quant = QuantParams{{code == DType::I8 ? 0.03f : 0.008f}, -1, code};
          ins.push_back(r);
        }
        const int y = g.add_node(s.op, "layer", ins, attrs);
        if (s.out_8bit) g.values[y].quant = QuantParams{{code == DType::I8 ? 0.05f : 0.004f}, -1, code};
        g.mark_output(y);
        if (const std::string why = quant_node_problem(g, g.nodes.back()); !why.empty()) fail_runtime("op harness: ", why);
        c.graph = std::move(g);
        c.input_range["x"] = code == DType::I8 ? std::make_pair(-128.f, 128.f) : std::make_pair(-448.f, 448.f);
        c.input_range["residual"] = !s.residual_8bit ? std::make_pair(-3.f, 3.f)
                                    : code == DType::I8 ? std::make_pair(-128.f, 128.f) : std::make_pair(-448.f, 448.f);
        const bool grouped = s.attrs.count("groups") != 0;
        if (grouped)
          c.cuda = {Expect::Refuses, "no CUDA 8-bit grouped conv: cuDNN's 8-bit fprop and the 8-bit GEMMs take groups 1 "
                    "(quant_refusal, backends/cuda/quant.cpp)", "no CUDA 8-bit path for a grouped conv"};
        else if (code == DType::I8) c.cuda = cuda_int8_layer(s.act, s.out_8bit);
        else c.cuda = cuda_fp8_layer(s.out_8bit ? code : dt);
        out.push_back(std::move(c));
      }
}

// 16-bit producers that write codes (out_dtype a code type, one output scale:
// the quantize pass folds the quantize after them): max pool, the SE channel
// gate, add (none, ReLU), concat and slice, on vector-width and odd channel counts,
// inputs in [-15, 15] at scale 0.025 (e4m3 saturates past 11.2, i8 clamps past
// 3.2). Exact everywhere: each backend computes the op in f32 and encodes once,
// as the reference does.
void add_code_producers(std::vector<OpCase>& out) {
  const Attrs pool{{"kernel", std::vector<int64_t>{3, 3}}, {"strides", std::vector<int64_t>{2, 2}},
                   {"pads", std::vector<int64_t>{1, 1, 1, 1}}};
  for (DType dt : kCaseTypes)
    for (DType code : {DType::F8E4M3, DType::I8})
      for (int64_t c : {int64_t(32), int64_t(5)}) {
        const std::string tag = cat(code_tag(code), "_c", c);
        const auto finish = [&](OpCase& k, Graph& g, int y) {
          g.values[y].quant = scales(code, 1, -1);
          g.mark_output(y);
          if (const std::string why = quant_node_problem(g, g.nodes.back()); !why.empty()) fail_runtime("op harness: ", why);
          k.graph = std::move(g);
          k.input_lo = -15.f, k.input_hi = 15.f;
          out.push_back(std::move(k));
        };
        const Attrs codes{{"out_dtype", std::string(dtype_name(code))}};
        {
          OpCase k = one_node_case("max_pool2d", "codes" + tag, dt, {Measure::Exact, 0});
          Graph g;
          Attrs a = pool;
          a.insert(codes.begin(), codes.end());
          finish(k, g, g.add_node(Op::MaxPool2d, "maxpool", {g.add_input("x", dt, {2, c, 9, 7})}, a));
        }
        {
          OpCase k = one_node_case("mul", "codes" + tag, dt, {Measure::Exact, 0});
          Graph g;
          const int x = g.add_input("x", dt, {2, c, 5, 6}), gate = g.add_input("s", dt, {2, c, 1, 1});
          k.input_range["s"] = {0.f, 1.f};  // a sigmoid's gate
          finish(k, g, g.add_node(Op::Mul, "se.gate", {x, gate}, codes));
        }
        for (const char* act : {"none", "relu"}) {
          OpCase k = one_node_case("add", cat("codes_", act, tag), dt, {Measure::Exact, 0});
          Graph g;
          Attrs a = codes;
          a["activation"] = std::string(act);
          finish(k, g, g.add_node(Op::Add, "chain", {g.add_input("a", dt, {2, c, 4, 5}), g.add_input("b", dt, {2, c, 4, 5})}, a));
        }
        {
          OpCase k = one_node_case("concat", "codes" + tag, dt, {Measure::Exact, 0});
          Graph g;
          std::vector<int> ins;
          for (int64_t i = 0; i < 3; ++i) ins.push_back(g.add_input(cat("x", i), dt, {2, i == 1 ? c / 2 + 1 : c, 3, 4}));
          Attrs a = codes;
          a["axis"] = int64_t(1);
          finish(k, g, g.add_node(Op::Concat, "cat", ins, a));
        }
        {  // a channel window converted to codes (Res2Net's first chunk)
          OpCase k = one_node_case("slice", "codes" + tag, dt, {Measure::Exact, 0});
          Graph g;
          Attrs a = codes;
          a["axis"] = int64_t(1), a["start"] = int64_t(1), a["end"] = c / 2 + 1;
          finish(k, g, g.add_node(Op::Slice, "split.0", {g.add_input("x", dt, {2, c + 3, 3, 4})}, a));
        }
      }
}

}  // namespace

void add_quant_cases(std::vector<OpCase>& out) {
  add_qdq(out);
  add_layers(out);
  add_code_producers(out);
}

}  // namespace kiln::ops
