// The CUDA lowering of 8-bit quantization (issue 13; docs/cuda-backend.md
// "FP8", "INT8"): quantize / dequantize (quant.cu) and the quantized conv2d /
// linear, of e4m3 (FP8) or i8 (INT8) codes. INT8 layers take the two-kernel
// path only (cuBLASLt's i8 GEMM or cuDNN's i8 fprop writing exact int32 sums,
// then quant_epilogue_i32); the one-kernel candidates below are FP8's.
//
// A quantized layer is one step of up to three launches:
//   1. the zero padding of x's rows to a multiple of 16 channels, when they
//      are not (FP8 GEMM and conv engines take only such; the weight is
//      padded once at load);
//   2. the raw sum acc = sum code_x * code_w into f32 scratch: a cuDNN FP8
//      fprop graph (cudnn_conv.hpp, ConvDesc::fp8) or, for 1x1 convs and
//      linears, a cuBLASLt e4m3 GEMM (Fp8GemmOp) — every engine config and
//      algorithm a candidate of the one tactic selector;
//   3. quant_epilogue: the per-channel alpha, bias, residual, activation and
//      output rounding (wide float or e4m3) with the constants of the CPU
//      emulation (quant::layer_epilogue), so only the engine's accumulation
//      differs from the CPU backend.
// Steps 2 and 3 are one kernel in two further kinds of candidate: cuDNN's FP8
// graph with the epilogue inside (ConvDesc::fp8_epi) and, for 1x1 convs and
// linears on sm_90, kiln's CUTLASS GEMM (fp8_gemm_sm90.hpp) whose epilogue
// writes y directly. The tactic selector times them all, layer against layer.
#include "backends/cuda/cuda_check.hpp"
#include "backends/cuda/fp8_gemm_sm90.hpp"
#include "backends/cuda/lower.hpp"
#include "backends/cuda/quant_int8.hpp"
#include "core/error.hpp"
#include "ir/attrs.hpp"
#include "ir/quant_form.hpp"
#include "quant/layer.hpp"

#include <limits>

namespace kiln::cuda {

namespace {

int round16(int64_t v) { return as_int((v + 15) / 16 * 16); }

bool cuda_code(DType t) { return t == DType::F8E4M3 || t == DType::I8; }

// Where the scale of each stored element sits: scales[(i / inner) % extent]
// over the value's stored order (NHWC for 4-D maps, lower.hpp).
struct ScaleWalk {
  int64_t inner = 1, extent = 1;
};
ScaleWalk scale_walk(const Value& v) {
  const QuantParams& q = *v.quant;
  if (q.axis < 0 || q.scales.size() == 1) return {};
  const int rank = static_cast<int>(v.shape.size());
  std::vector<int> order(static_cast<size_t>(rank));  // logical axis at each stored position
  for (int i = 0; i < rank; ++i) order[static_cast<size_t>(i)] = i;
  if (stored_nhwc(v)) order = {0, 2, 3, 1};
  ScaleWalk w;
  w.extent = v.shape[static_cast<size_t>(q.axis)];
  bool after = false;
  for (int pos = 0; pos < rank; ++pos) {
    if (after) w.inner *= v.shape[static_cast<size_t>(order[static_cast<size_t>(pos)])];
    if (order[static_cast<size_t>(pos)] == q.axis) after = true;
  }
  return w;
}

const float* device_f32(Lowering& L, const std::string& key, const std::vector<float>& v) {
  return static_cast<const float*>(L.engine_copy(key, v.data(), v.size() * sizeof(float)));
}

const void* device_bytes(Lowering& L, const std::string& key, const std::vector<uint8_t>& v) {
  return L.engine_copy(key, v.data(), v.size());
}

// The epilogue constants of quantized layer n: quant::layer_epilogue's, the
// ones the CPU kernels use, uploaded once per engine.
QuantEpilogue epilogue_of(Lowering& L, const Node& n) {
  std::vector<float> bias;
  if (n.inputs.size() > 2) bias = L.g.values[n.inputs[2]].constant->to_f32();
  const quant::LayerEpilogue e = quant::layer_epilogue(L.g, n, bias.empty() ? nullptr : bias.data());
  QuantEpilogue q;
  q.alpha = device_f32(L, n.name + "#q_alpha", e.alpha);
  q.bias = device_f32(L, n.name + "#q_bias", e.bias);
  q.residual_mul = e.residual_mul;
  q.residual_scale = e.residual_scale;
  q.inv_out_scale = e.inv_out_scale;
  q.scale_after = is_8bit(e.out) && !e.folded;
  q.act = e.act;
  return q;
}

// Lazily allocated, zeroed device scratch for timing candidates.
struct TimingScratch {
  size_t bytes;
  DeviceBuffer buf;
  void* get(cudaStream_t s) {
    if (!buf.get() && bytes) {
      buf = DeviceBuffer(bytes);
      KILN_CUDA_CHECK(cudaMemsetAsync(buf.get(), 0, bytes, s));
    }
    return buf.get();
  }
};

// The raw-sum engines of one quantized layer: a cuDNN FP8 conv and/or a
// cuBLASLt FP8 GEMM, their candidates, and the chosen one's enqueue.
struct RawSum {
  ConvOp* conv = nullptr;
  Fp8GemmOp* gemm = nullptr;
  ConvOp* fused = nullptr;  // the FP8 conv with its epilogue in the graph (ConvDesc::fp8_epi), or none
  bool use_gemm = false, use_fused = false;
  // The CUTLASS GEMM's configurations that take this layer (fp8_gemm_sm90.hpp)
  // with their workspaces, and the chosen one (-1: another engine).
  struct CutlassConfig {
    int cfg;
    size_t workspace;
  };
  std::vector<CutlassConfig> cutlass;
  int use_cutlass = -1;
  int m = 0, n = 0, k = 0;  // the GEMM's shape for CUTLASS: rows, output channels, padded input channels
  bool direct() const { return use_fused || use_cutlass >= 0; }  // y written by the engine itself
  size_t workspace() const {
    for (const CutlassConfig& c : cutlass)
      if (c.cfg == use_cutlass) return c.workspace;
    return use_fused ? fused->workspace_bytes() : use_gemm ? gemm->workspace_bytes() : conv->workspace_bytes();
  }
  void operator()(cudnnHandle_t h, const void* x, const void* w, float* acc, void* ws, size_t cap, cudaStream_t s) const {
    if (use_gemm) gemm->run(x, w, acc, ws, cap, s);
    else conv->run(h, x, w, nullptr, nullptr, acc, ws, s);
  }
};

// Chooses among the engines' candidates (tactics.hpp) and records the choice;
// x_bytes / acc_bytes size the timing scratch. The preferred engine's
// candidates come first (timing tries the first few of the opt level) and
// the other engine's heuristic pick is always timed too, so both are compared.
// With a fused candidate the unfused ones are timed with their quant_epilogue
// (`epi`, on scratch), so the comparison is layer against layer.
struct EpilogueTiming {
  const QuantEpilogue* e = nullptr;
  int kp = 0, k = 0;
  int64_t rows = 0;
  DType rdt = DType::F32, ydt = DType::F32;
  bool residual = false;
};

std::string choose_raw_sum(Lowering& L, const Node& n, const LayerSignature& sig, RawSum& rs, const void* w,
                           size_t x_bytes, size_t acc_bytes, bool gemm_first, const EpilogueTiming& et = {}) {
  TimingScratch xb{x_bytes, {}}, ab{acc_bytes, {}};
  const size_t yr = size_t(et.rows) * size_t(et.k);
  const bool any_direct = rs.fused || !rs.cutlass.empty();
  TimingScratch yb{any_direct ? yr * dtype_size(et.ydt) : 0, {}}, rb{any_direct && et.residual ? yr * dtype_size(et.rdt) : 0, {}};
  const auto epilogue = [&](cudaStream_t s) {
    if (!any_direct) return;
    if (sig.dtype == DType::I8)  // int32 raw sums
      quant_epilogue_i32(static_cast<const int32_t*>(ab.get(s)), et.kp, *et.e, et.residual ? rb.get(s) : nullptr, et.rdt,
                         yb.get(s), et.ydt, et.rows, et.k, s);
    else
      quant_epilogue(static_cast<float*>(ab.get(s)), et.kp, *et.e, et.residual ? rb.get(s) : nullptr, et.rdt, yb.get(s),
                     et.ydt, et.rows, et.k, s);
  };
  cudnnHandle_t h = L.m.cudnn.h;
  std::vector<Candidate> convs, gemms, fused, cutlass;
  for (const auto& [cfg, need] : rs.cutlass) {
    cutlass.push_back({fp8_gemm_sm90_config_name(cfg),
                       [&rs, cfg = cfg] { return rs.use_fused = false, rs.use_gemm = false, rs.use_cutlass = cfg, true; },
                       [&, cfg = cfg, need = need](cudaStream_t s, void* ws, size_t cap) {
                         if (need > cap) return false;
                         fp8_gemm_sm90(cfg, sig.dtype, xb.get(s), w, *et.e, et.residual ? rb.get(s) : nullptr, et.rdt,
                                       yb.get(s), et.ydt, rs.m, rs.n, rs.k, ws, cap, s);
                         return true;
                       }});
  }
  if (rs.fused)
    for (int t = 0; t < rs.fused->tactic_count(); ++t)
      fused.push_back({"fused " + rs.fused->tactic_name(t),
                       [&rs, t] { return rs.use_fused = true, rs.use_gemm = false, rs.use_cutlass = -1, rs.fused->try_select(t); },
                       [&](cudaStream_t s, void* ws, size_t cap) {
                         if (rs.fused->workspace_bytes() > cap) return false;
                         rs.fused->run_fp8_fused(h, xb.get(s), w, et.e->alpha, et.e->bias, et.residual ? rb.get(s) : nullptr,
                                                 yb.get(s), ws, s);
                         return true;
                       }});
  if (rs.conv) {
    // The heuristic's own pick first.
    std::vector<int> order{rs.conv->selected()};
    for (int t = 0; t < rs.conv->tactic_count(); ++t)
      if (t != order[0]) order.push_back(t);
    for (int t : order)
      convs.push_back({rs.conv->tactic_name(t),
                       [&rs, t] { return rs.use_fused = false, rs.use_gemm = false, rs.use_cutlass = -1, rs.conv->try_select(t); },
                       [&](cudaStream_t s, void* ws, size_t cap) {
                         if (rs.conv->workspace_bytes() > cap) return false;
                         rs.conv->run(h, xb.get(s), w, nullptr, nullptr, ab.get(s), ws, s);
                         epilogue(s);
                         return true;
                       }});
  }
  if (rs.gemm)
    for (int t = 0; t < rs.gemm->tactic_count(); ++t)
      gemms.push_back({rs.gemm->tactic_name(t),
                       [&rs, t] { return rs.use_fused = false, rs.use_gemm = true, rs.use_cutlass = -1, rs.gemm->select(t), true; },
                       [&](cudaStream_t s, void* ws, size_t cap) {
                         if (rs.gemm->workspace_bytes() > cap) return false;
                         rs.gemm->run(xb.get(s), w, static_cast<float*>(ab.get(s)), ws, cap, s);
                         epilogue(s);
                         return true;
                       }});
  std::vector<Candidate>& first = gemm_first || convs.empty() ? gemms : convs;
  std::vector<Candidate>& second = &first == &gemms ? convs : gemms;
  if (!first.empty() && !second.empty()) second.front().always_time = true;
  std::vector<Candidate> cands = std::move(first);
  for (Candidate& c : second) cands.push_back(std::move(c));
  // Switch fp8_one_kernel: where cuDNN's fused graph or kiln's CUTLASS GEMM
  // can run the layer, the two-kernel paths (raw sum, then quant_epilogue)
  // are not timed; they stay last, as the fallback should no one-kernel
  // candidate prepare. Timing compares one layer's enqueues alone; in a
  // batch-1 engine the epilogue's extra launch also delays the next layer
  // (docs/quantization.md "Where the targets stand").
  const bool one_kernel = L.m.opts.switches.get(Switch::Fp8OneKernel).value_or(false) && (!fused.empty() || !cutlass.empty());
  std::vector<Candidate> fallback;
  if (one_kernel) {
    fallback = std::move(cands);
    cands.clear();
    for (Candidate& c : fallback) c.run = nullptr, c.always_time = false;
  }
  if (!fused.empty()) {
    // After the unfused ones (the heuristic pick stays today's path, a tie
    // keeps it); the fused heuristic pick is always timed. The test hook
    // Fp8Fusion::Fused leaves only the fused candidates.
    fused.front().always_time = true;
    if (L.m.opts.fp8_fusion == Fp8Fusion::Fused) cands.clear();
    for (Candidate& c : fused) cands.push_back(std::move(c));
  }
  if (!cutlass.empty()) {
    // Every configuration is timed (a handful); Fp8Fusion::Cutlass leaves only them.
    for (Candidate& c : cutlass) c.always_time = true;
    if (L.m.opts.fp8_fusion == Fp8Fusion::Cutlass) cands.clear();
    for (Candidate& c : cutlass) cands.push_back(std::move(c));
  }
  for (Candidate& c : fallback) cands.push_back(std::move(c));
  LayerSignature keyed = sig;  // the cache key names a restricted choice
  if (one_kernel) keyed.attr("one_kernel", 1);
  const TacticChoice c = L.tactics.choose(n.name, keyed, cands, 0);
  L.tactics.finish();  // the timing scratch dies with this function
  L.record(n.name, cands[static_cast<size_t>(c.index)].name, c.us);
  return cands[static_cast<size_t>(c.index)].name;
}

// The step of a quantized layer: [pad x] -> raw sum -> epilogue. Workspace:
// [0, lead) the caller's (RowMajorIo), then padded x, acc, the engine's.
struct QuantLayerRun {
  RawSum rs;
  const void* w;
  QuantEpilogue e;
  int64_t x_rows, rows;  // pixels (or rows) of x and of y: a strided conv reads more than it writes
  int c, cp, k, kp;
  DType rdt, ydt;
  DType code = DType::F8E4M3;  // x and w: e4m3 (f32 raw sums) or i8 (int32 raw sums)
  size_t pad_at, acc_at, lib_at;
  void operator()(const Exec& x, const void* in, const void* residual, void* out) const {
    char* ws = static_cast<char*>(x.workspace);
    const void* xin = in;
    if (c != cp) pad_rows_u8(in, x_rows, c, ws + pad_at, cp, x.stream), xin = ws + pad_at;
    if (rs.use_cutlass >= 0) {
      fp8_gemm_sm90(rs.use_cutlass, code, xin, w, e, residual, rdt, out, ydt, rs.m, rs.n, rs.k, ws + lib_at,
                    x.workspace_bytes - lib_at, x.stream);
      return;
    }
    if (rs.use_fused) {
      rs.fused->run_fp8_fused(x.cudnn, xin, w, e.alpha, e.bias, residual, out, ws + lib_at, x.stream);
      return;
    }
    float* acc = reinterpret_cast<float*>(ws + acc_at);
    rs(x.cudnn, xin, w, acc, ws + lib_at, x.workspace_bytes - lib_at, x.stream);
    if (code == DType::I8) quant_epilogue_i32(reinterpret_cast<const int32_t*>(acc), kp, e, residual, rdt, out, ydt, rows, k, x.stream);
    else quant_epilogue(acc, kp, e, residual, rdt, out, ydt, rows, k, x.stream);
  }
};

// The CUTLASS GEMM's configurations that take the layer as [rows, cp] x
// [k, cp]^T -> y [rows, k] directly: codes of the layer's type, output
// channels a multiple of 16 (no padding of y), f16 or codes in and out, none
// or ReLU (fp8_gemm_sm90_unsupported). Left out under the test hooks that
// force cuDNN's fused or the two-kernel path.
void add_cutlass_candidates(Lowering& L, QuantLayerRun& run, bool residual) {
  if (L.m.opts.fp8_fusion == Fp8Fusion::Fused || L.m.opts.fp8_fusion == Fp8Fusion::Unfused) return;
  if (run.k != run.kp || run.rows > std::numeric_limits<int>::max()) return;
  RawSum& rs = run.rs;
  rs.m = as_int(run.rows), rs.n = run.k, rs.k = run.cp;
  for (int cfg = 0; cfg < fp8_gemm_sm90_configs(); ++cfg)
    if (fp8_gemm_sm90_unsupported(cfg, run.code, rs.m, rs.n, rs.k, residual, run.rdt, run.ydt, run.e.act).empty())
      rs.cutlass.push_back({cfg, fp8_gemm_sm90_workspace(cfg, rs.m, rs.n, rs.k)});
}

// The step's kernel label: [pad +] the engine [+ quant_epilogue].
std::string layer_label(const QuantLayerRun& run, const std::string& tactic, bool cudnn_prefix) {
  return cat(run.c != run.cp ? "pad + " : "", cudnn_prefix && !run.rs.use_gemm && run.rs.use_cutlass < 0 ? "cudnn " : "",
             tactic, run.rs.direct() ? "" : " + quant_epilogue");
}

void plan_workspace(Lowering& L, QuantLayerRun& run, size_t lead) {
  run.pad_at = align256(lead);
  run.acc_at = align256(run.pad_at + (run.c != run.cp ? size_t(run.x_rows) * size_t(run.cp) : 0));
  run.lib_at = align256(run.acc_at + (run.rs.direct() ? 0 : size_t(run.rows) * size_t(run.kp) * sizeof(float)));
  L.reserve_workspace(run.lib_at + run.rs.workspace());
}

}  // namespace

std::string quant_refusal(const Graph& g, const Node& n) {
  const auto val = [&](int v) -> const Value& { return g.values.at(static_cast<size_t>(v)); };
  switch (n.op) {
    case Op::Quantize:
      if (!cuda_code(val(n.outputs.at(0)).dtype))
        return cat(n.name, ": CUDA quantize writes e4m3 or i8 codes, not ", dtype_name(val(n.outputs[0]).dtype));
      return "";
    case Op::Dequantize:
      if (!cuda_code(val(n.inputs.at(0)).dtype))
        return cat(n.name, ": CUDA dequantize reads e4m3 or i8 codes, not ", dtype_name(val(n.inputs[0]).dtype));
      return "";
    case Op::Conv2d:
    case Op::Linear: {
      if (!is_quantized_layer(g, n)) return "";
      if (!cuda_code(val(n.inputs[0]).dtype))
        return cat(n.name, ": CUDA quantized layers read e4m3 or i8 codes, not ", dtype_name(val(n.inputs[0]).dtype));
      if (n.op == Op::Conv2d && conv_attrs(n).groups != 1) {
        const Shape& xs = val(n.inputs[0]).shape;
        return cat(n.name, ": no CUDA 8-bit path for a grouped conv (", shape_str(xs), ", groups ", conv_attrs(n).groups,
                   "): cuDNN's 8-bit fprop and the 8-bit GEMMs take groups 1; keep the layer 16-bit (the recipe's default "
                   "exclusions do so for depthwise convs) or build with --backend cpu");
      }
      return "";
    }
    case Op::MaxPool2d:
    case Op::Mul:
    case Op::Add:
    case Op::Concat:
    case Op::Slice: {
      if (!writes_codes(g, n)) return "";
      const DType t = val(n.outputs[0]).dtype;
      if (!cuda_code(t)) return cat(n.name, ": CUDA ", op_name(n.op), " writes e4m3 or i8 codes, not ", dtype_name(t));
      if (n.op == Op::Add && n.activation() != Activation::None && n.activation() != Activation::Relu)
        return cat(n.name, ": CUDA add writes codes after no activation or ReLU, not ", activation_name(n.activation()));
      return "";
    }
    default: return "";
  }
}

CodeOut code_out(const Graph& g, int v) {
  const Value& y = g.values.at(static_cast<size_t>(v));
  const int p = y.producer;
  if (p < 0 || !writes_codes(g, g.nodes.at(static_cast<size_t>(p)))) return {};
  // quant_node_problem (the verifier) wants one scale; never store wide values into a code buffer.
  if (!y.quant || y.quant->scales.size() != 1) fail_input("'", y.name, "': codes written without one scale");
  return CodeOut{y.dtype, 1.f / y.quant->scales[0]};  // f32(1 / scale), as quant::quantize_value
}

void lower_Quantize(Lowering& L, size_t ni) {
  const Node& n = L.g.nodes[ni];
  if (const std::string why = quant_refusal(L.g, n); !why.empty()) fail_input(why);
  const int in0 = n.inputs[0], out = n.outputs[0];
  const Value &xv = L.g.values[in0], &yv = L.g.values[out];
  if (stored_nhwc(xv) != stored_nhwc(yv)) fail_input(n.name, ": CUDA quantize of a constant 4-D value (quantize it at build)");
  std::vector<float> inv;
  for (float s : yv.quant->scales) inv.push_back(1.f / s);  // f32(1 / scale), as quant::quantize_value
  const float* scales = device_f32(L, n.name + "#inv_scales", inv);
  const ScaleWalk sw = scale_walk(yv);
  const DType xdt = xv.dtype;
  const int64_t count = shape_numel(yv.shape);
  const ValuePtr ptr = L.ptr;
  const bool i8 = yv.dtype == DType::I8;
  const auto launch = i8 ? quantize_i8 : quantize_e4m3;
  L.step(i8 ? "quantize_i8" : "quantize_e4m3", [=](const Exec& x) {
    launch(ptr(x, in0), xdt, ptr(x, out), count, scales, sw.inner, sw.extent, x.stream);
  });
}

void lower_Dequantize(Lowering& L, size_t ni) {
  const Node& n = L.g.nodes[ni];
  if (const std::string why = quant_refusal(L.g, n); !why.empty()) fail_input(why);
  const Value &xv = L.g.values[n.inputs[0]], &yv = L.g.values[n.outputs[0]];
  if (stored_nhwc(xv) != stored_nhwc(yv)) fail_input(n.name, ": CUDA dequantize of a constant 4-D value (fold it at build)");
  const float* scales = device_f32(L, n.name + "#scales", xv.quant->scales);
  const ScaleWalk sw = scale_walk(xv);
  const Operand x_at = operand(L, n.inputs[0]);
  const int out = n.outputs[0];
  const DType ydt = yv.dtype;
  const int64_t count = shape_numel(yv.shape);
  const ValuePtr ptr = L.ptr;
  const bool i8 = xv.dtype == DType::I8;
  const auto launch = i8 ? dequantize_i8 : dequantize_e4m3;
  L.step(i8 ? "dequantize_i8" : "dequantize_e4m3", [=](const Exec& x) {
    launch(x_at(x), ptr(x, out), ydt, count, scales, sw.inner, sw.extent, x.stream);
  });
}

void lower_quantized_linear(Lowering& L, size_t ni) {
  const Graph& g = L.g;
  const Node& n = g.nodes[ni];
  if (const std::string why = quant_refusal(g, n); !why.empty()) fail_input(why);
  const int in0 = n.inputs[0], out = n.outputs[0];
  const Shape xs = g.values[in0].shape, ws = g.values[n.inputs[1]].shape;
  QuantLayerRun run{};
  run.k = as_int(ws[0]), run.kp = round16(ws[0]);
  run.c = as_int(ws[1]), run.cp = round16(ws[1]);
  run.rows = run.x_rows = shape_numel(xs) / ws[1];
  run.rdt = DType::F32;
  run.ydt = g.values[out].dtype;
  run.code = g.values[in0].dtype;
  run.e = epilogue_of(L, n);
  // W [k, c] row-major codes, padded once to [kp, cp] with zeros.
  const HostTensor& wt = *L.g.values[n.inputs[1]].constant;
  std::vector<uint8_t> wp(size_t(run.kp) * size_t(run.cp), 0);
  for (int o = 0; o < run.k; ++o)
    for (int i = 0; i < run.c; ++i)
      wp[size_t(o) * size_t(run.cp) + size_t(i)] = wt.blob.data[size_t(o) * size_t(run.c) + size_t(i)];
  run.w = device_bytes(L, n.name + "#fp8_w", wp);
  try {
    L.p.fp8_gemms.push_back(std::make_unique<Fp8GemmOp>(L.m.lt.h, as_int(run.rows), run.cp, run.kp, run.code));
  } catch (const Error& e) {
    fail_runtime(n.name, ": no CUDA ", run.code == DType::I8 ? "INT8" : "FP8", " engine for this linear (x ", shape_str(xs),
                 ", w ", shape_str(ws), "): ", e.what());
  }
  run.rs.gemm = L.p.fp8_gemms.back().get();
  add_cutlass_candidates(L, run, false);
  LayerSignature sig{run.code == DType::I8 ? "int8 gemm" : "fp8 gemm", run.code, {{run.rows, run.cp}, {run.kp, run.cp}}, {}};
  if (!run.rs.cutlass.empty())  // timed against the direct-writing CUTLASS GEMM: layer against layer
    sig.attr("cutlass", int64_t(run.rs.cutlass.size())).attr("out", int64_t(run.ydt)).attr("act", int64_t(run.e.act));
  const EpilogueTiming et{&run.e, run.kp, run.k, run.rows, run.rdt, run.ydt, false};
  const std::string tactic = choose_raw_sum(L, n, sig, run.rs, run.w, size_t(run.x_rows) * size_t(run.cp),
                                            size_t(run.rows) * size_t(run.kp) * sizeof(float), true, et);
  const RowMajorIo io(L, {in0}, {out});  // x[..., c] as rows (a 4-D x, stored NHWC, through the workspace)
  plan_workspace(L, run, io.scratch_bytes());
  L.step(io.kernel(layer_label(run, tactic, false)), [run, io](const Exec& x) {
    io.load(x);
    run(x, io.in(x, 0), nullptr, io.out(x, 0));
    io.store(x);
  });
}

void lower_quantized_conv(Lowering& L, size_t ni) {
  const Graph& g = L.g;
  const Node& n = g.nodes[ni];
  if (const std::string why = quant_refusal(g, n); !why.empty()) fail_input(why);
  const int in0 = n.inputs[0], out = n.outputs[0];
  const int res = n.inputs.size() > 3 ? n.inputs[3] : -1;
  if (L.strided(in0) || L.strided(out) || (res >= 0 && L.strided(res)))
    fail_input(n.name, ": a quantized conv on channel views (switch cuda_views) is not supported on CUDA");
  const ConvDesc d = conv_desc(g, n, false, 0, 0);
  QuantLayerRun run{};
  run.c = d.c, run.cp = round16(d.c), run.k = d.k, run.kp = round16(d.k);
  run.rows = int64_t(d.n) * d.out_h() * d.out_w();
  run.x_rows = int64_t(d.n) * d.h * d.w;
  run.rdt = res >= 0 ? g.values[res].dtype : DType::F32;
  run.ydt = g.values[out].dtype;
  run.code = g.values[in0].dtype;
  run.e = epilogue_of(L, n);
  // KCRS codes -> KRSC padded to [kp, r, s, cp] with zeros (NHWC engines' filter layout).
  const HostTensor& wt = *L.g.values[n.inputs[1]].constant;
  std::vector<uint8_t> wp(size_t(run.kp) * size_t(d.r) * size_t(d.s) * size_t(run.cp), 0);
  for (int o = 0; o < d.k; ++o)
    for (int i = 0; i < d.c; ++i)
      for (int y = 0; y < d.r; ++y)
        for (int z = 0; z < d.s; ++z)
          wp[((size_t(o) * d.r + y) * d.s + z) * run.cp + i] = wt.blob.data[((size_t(o) * d.c + i) * d.r + y) * d.s + z];
  run.w = device_bytes(L, n.name + "#fp8_w", wp);

  // cuDNN's FP8 fprop on the padded shape, and for a 1x1 conv with unit
  // strides and no padding (y = W x per pixel) the FP8 GEMM too.
  ConvDesc raw = d;
  raw.c = run.cp, raw.k = run.kp, raw.dtype = DType::F32, raw.fp8 = true, raw.code = run.code;
  raw.has_bias = raw.has_residual = false, raw.act = Activation::None;
  std::string cudnn_error;
  try {
    auto owned = std::make_unique<ConvOp>(L.m.cudnn.h, raw);
    run.rs.conv = owned.get();
    L.p.convs.push_back(std::move(owned));
  } catch (const Error& e) {
    cudnn_error = e.what();
  }
  const bool pointwise = d.r == 1 && d.s == 1 && d.stride_h == 1 && d.stride_w == 1 && d.pad_t == 0 && d.pad_l == 0 &&
                         d.pad_b == 0 && d.pad_r == 0;
  std::string gemm_error;
  if (pointwise) {
    try {
      L.p.fp8_gemms.push_back(std::make_unique<Fp8GemmOp>(L.m.lt.h, as_int(run.rows), run.cp, run.kp, run.code));
      run.rs.gemm = L.p.fp8_gemms.back().get();
    } catch (const Error& e) {
      gemm_error = e.what();
    }
  }
  // The epilogue inside cuDNN's graph (ConvDesc::fp8_epi), a further
  // candidate: only when k needs no padding (y is written directly, k wide).
  // A refusal drops the candidate; the two-kernel path stays.
  std::string fused_error;
  if (run.k == run.kp && run.code == DType::F8E4M3 && L.m.opts.fp8_fusion != Fp8Fusion::Unfused) {
    ConvDesc fd = raw;
    ConvDesc::Fp8Epilogue& fe = fd.fp8_epi;
    fe.on = true, fe.out = run.ydt, fe.bias = true, fe.residual = res >= 0, fe.residual_dtype = run.rdt;
    // An e4m3 residual: code x (scale x residual_mul) in one multiply (the CPU rounds code x scale first: <= 1 ulp).
    fe.residual_mul = run.rdt == DType::F8E4M3 ? run.e.residual_scale * run.e.residual_mul : run.e.residual_mul;
    fe.act = run.e.act, fe.scale_after = run.e.scale_after;
    fe.inv_out_scale = run.e.inv_out_scale;
    try {
      auto owned = std::make_unique<ConvOp>(L.m.cudnn.h, fd);
      run.rs.fused = owned.get();
      L.p.convs.push_back(std::move(owned));
    } catch (const Error& e) {
      fused_error = e.what();
    }
  } else if (run.k != run.kp) {
    fused_error = cat("output channels ", run.k, " not a multiple of 16");
  }
  if (pointwise) add_cutlass_candidates(L, run, res >= 0);
  if (!fused_error.empty() && L.m.opts.log && L.m.opts.fp8_fusion == Fp8Fusion::Fused)
    *L.m.opts.log << n.name << ": no fused FP8 candidate: " << fused_error << "\n";
  if (!run.rs.conv && !run.rs.gemm && !run.rs.fused && run.rs.cutlass.empty())
    fail_runtime(n.name, ": no CUDA ", run.code == DType::I8 ? "INT8" : "FP8", " engine for this conv (x ", shape_str(g.values[in0].shape), ", w [", d.k, ",", d.c, ",",
                 d.r, ",", d.s, "], stride ", d.stride_h, "x", d.stride_w, ", channels padded to ", run.cp, "->", run.kp,
                 "): ", cudnn_error, gemm_error.empty() ? "" : "; ", gemm_error);
  LayerSignature sig{run.code == DType::I8 ? "int8 conv" : "fp8 conv", run.code, {{d.n, run.cp, d.h, d.w}, {run.kp, run.cp, d.r, d.s}}, {}};
  sig.attr("stride_h", d.stride_h).attr("stride_w", d.stride_w).attr("pad_t", d.pad_t).attr("pad_l", d.pad_l);
  sig.attr("pad_b", d.pad_b).attr("pad_r", d.pad_r).attr("dil_h", d.dil_h).attr("dil_w", d.dil_w);
  sig.attr("cudnn", run.rs.conv != nullptr).attr("gemm", run.rs.gemm != nullptr);
  sig.attr("cutlass", int64_t(run.rs.cutlass.size()));
  if (run.rs.fused || !run.rs.cutlass.empty()) {
    // What the fused graph computes (the unfused candidates are timed with their epilogue then).
    sig.attr("fused", 1).attr("out", int64_t(run.ydt)).attr("residual", int64_t(res >= 0 ? int(run.rdt) : -1));
    sig.attr("act", int64_t(run.e.act)).attr("scale_after", run.e.scale_after);
    sig.attr("hook", int64_t(L.m.opts.fp8_fusion));
  }
  EpilogueTiming et{&run.e, run.kp, run.k, run.rows, run.rdt, run.ydt, res >= 0};
  const std::string tactic = choose_raw_sum(L, n, sig, run.rs, run.w, size_t(run.x_rows) * size_t(run.cp),
                                            size_t(run.rows) * size_t(run.kp) * sizeof(float), pointwise, et);
  plan_workspace(L, run, 0);
  const ValuePtr ptr = L.ptr;
  L.step(layer_label(run, tactic, true),
         [run, ptr, in0, res, out](const Exec& x) { run(x, ptr(x, in0), res >= 0 ? ptr(x, res) : nullptr, ptr(x, out)); });
}

}  // namespace kiln::cuda
