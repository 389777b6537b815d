// Fused NHWC convolution on cuDNN's graph API: one cuDNN operation graph
// conv -> +bias -> +residual -> activation, with its candidate engine configs
// ("tactics") exposed so the builder can pick one by heuristics or by timing.
//
// Layouts: x, residual and y are NHWC, the filter is KRSC ([k][r][s][c/groups]),
// bias is [k]; all in the op's dtype (f32, f16 or bf16). Accumulation and the
// epilogue run in f32. Device pointers must be 16-byte aligned (the alignment
// the engines are selected for).
//
// When cuDNN offers no engine for the fused pattern (for example some grouped
// convolutions or activations on some dtypes) the op silently becomes a plain
// convolution and epilogue_fused() says false: the caller must then apply bias,
// residual and activation itself, in that order, to y (which holds conv(x, w)).
#pragma once
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <cstddef>
#include <memory>
#include <optional>
#include <cstdint>
#include <utility>
#include <string>
#include <vector>

#include "core/activation.hpp"
#include "core/window.hpp"
#include "core/dtype.hpp"

namespace kiln::cuda {

struct ConvDesc {
  DType dtype = DType::F32;
  int n = 1, c = 1, h = 1, w = 1, k = 1, r = 1, s = 1;
  int stride_h = 1, stride_w = 1;
  int pad_t = 0, pad_l = 0, pad_b = 0, pad_r = 0;  // asymmetric: TF "same" pads more at the end
  int dil_h = 1, dil_w = 1;
  int groups = 1;
  bool has_bias = false, has_residual = false;
  Activation act = Activation::None;
  bool allow_tf32 = false;  // f32 only: permit TF32 tensor-core engines
  // Pixel strides (elements between neighbouring pixels) of x and y when they
  // are channel windows of wider NHWC buffers (Res2Net chunks read in place,
  // concat inputs written in place); 0: dense (c for x, k for y).
  int x_stride = 0, y_stride = 0;
  // FP8 fprop (issue 13): x and w are e4m3, y (dtype f32) receives the raw
  // sum over the reduction, no bias/residual/activation (the quantized
  // layer's epilogue is quant_epilogue, kernels.hpp). The graph is conv ->
  // pointwise multiply by 1 -> y, the shape of cuDNN's FP8 fprop sample
  // (its runtime-fusion engines want a pointwise op after an FP8 conv).
  // c and k must be multiples of 16, groups 1.
  bool fp8 = false;
  // The 8-bit fprop's code type: e4m3 (f32 raw sums, as above) or i8 (INT8:
  // x and w i8, int32 compute, y the exact int32 sums in y's 4-byte slots;
  // the graph is conv -> identity -> y, cuDNN's int8 fprop sample's shape).
  // dtype stays f32 (a 4-byte raw output) either way.
  DType code = DType::F8E4M3;
  // FP8 only: the quantized layer's epilogue inside the graph (issue 13 §3),
  // conv -> x alpha[k] -> + bias[k] -> (+ residual x residual_mul) ->
  // activation -> (x inv_out_scale) -> (clamp to +-448 for e4m3) -> y of
  // `out`; run with ConvOp::run_fp8_fused. When cuDNN has no engine for the
  // chain the constructor throws (no bare-conv fallback: y would be wrong).
  // dtype stays f32 (the graph's compute type) and has_bias / has_residual /
  // act stay unset (they describe the 16-bit epilogue).
  struct Fp8Epilogue {
    bool on = false;
    DType out = DType::F16;  // f32, f16, bf16 or f8e4m3
    bool bias = false, residual = false;
    DType residual_dtype = DType::F16;  // or f8e4m3 codes (residual_mul then holds the residual's scale too)
    float residual_mul = 1.f;
    Activation act = Activation::None;
    bool scale_after = false;  // multiply by inv_out_scale after the activation
    float inv_out_scale = 1.f;
  } fp8_epi;
  // Up to this many knob variants of the heuristics' first engines join the
  // candidates (switch conv_knobs; ConvOp::tactic_is_variant). Their split
  // and tile knobs changed one at a time: cuDNN's heuristics pick tiles for
  // throughput, and at batch 1 a late-stage conv's tiles fill a quarter of
  // the SMs. Building only: a recorded tag replays whatever it names.
  int knob_variants = 0;
  int knob_samples = 8;  // values tried per knob (knob_values); wider sweeps are for probes
  int out_h() const { return static_cast<int>(window_out_dim(h, r, stride_h, pad_t, pad_b, dil_h)); }
  int out_w() const { return static_cast<int>(window_out_dim(w, s, stride_w, pad_l, pad_r, dil_w)); }
};

class ConvOp {
 public:
  // Builds the fused operation graph (or the conv-only one when nothing fuses),
  // queries heuristics A + fallback and builds the first plan that builds,
  // or, when `prefer` names a candidate that builds (a bundle's recorded
  // tactic), that plan alone and selects it. A `prefer` in cuDNN's tag form
  // ("eng12_k2=3_k13=1") is first replayed by engine id and knobs without the
  // heuristics query (then tactic_count() is 1); when that gives no plan that
  // builds, the query runs as without `prefer`.
  // Throws kiln::Error when not even the plain convolution is supported.
  ConvOp(cudnnHandle_t h, const ConvDesc& d, const std::string& prefer = "");
  ~ConvOp();
  ConvOp(ConvOp&&) noexcept;
  ConvOp& operator=(ConvOp&&) noexcept;
  ConvOp(const ConvOp&) = delete;
  ConvOp& operator=(const ConvOp&) = delete;

  const ConvDesc& desc() const;
  // True when bias, residual and activation run inside the cuDNN graph.
  bool epilogue_fused() const;

  int tactic_count() const;
  // The engine config's tag ("eng12_k2=3_k13=1"): stable across runs of the
  // same cuDNN version, so it can key a tactic cache.
  std::string tactic_name(int i) const;
  // Readable numerical/behaviour notes of tactic i ("tensor_core,runtime_compiled").
  std::string tactic_notes(int i) const;
  // Builds plan i if needed and selects it; throws when it does not build.
  void select(int i);
  // Like select but returns false (and keeps the previous selection) when plan i does not build.
  bool try_select(int i);
  int selected() const;
  size_t workspace_bytes() const;

  // Enqueues the selected plan on s (sets h's stream). Capturable in a CUDA graph.
  void run(cudnnHandle_t h, const void* x, const void* w, const void* bias, const void* residual, void* y,
           void* workspace, cudaStream_t s) const;

  // The selected plan of an FP8 graph with its epilogue (ConvDesc::fp8_epi):
  // alpha and bias are f32 [k], residual (when the desc has one) NHWC of
  // fp8_epi.residual_dtype, y of fp8_epi.out.
  void run_fp8_fused(cudnnHandle_t h, const void* x, const void* w, const float* alpha, const float* bias,
                     const void* residual, void* y, void* workspace, cudaStream_t s) const;

  // Times up to max_candidates tactics (tactics.hpp's host-enqueue time_enqueue_us)
  // on the caller's scratch buffers, skipping those that do not build or need
  // more than ws_cap bytes of workspace, and selects the fastest. Synchronizes
  // s; not for use during capture. Returns the selected index.
  int autotune(cudnnHandle_t h, const void* x, const void* w, const void* bias, const void* residual, void* y,
               void* workspace, size_t ws_cap, cudaStream_t s, int max_candidates);
  // Median time in microseconds of the last autotune for tactic i (negative when not timed).
  float tuned_time_us(int i) const;
  // True for the knob variants ConvDesc::knob_variants added (timed at any opt level).
  bool tactic_is_variant(int i) const;
  // Tactic i's engine's knobs and ranges ("k17=[1..8/1] k24=[0..63/1]"); "" for none.
  std::string engine_knobs(int i) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// An engine config's tag as cuDNN's frontend writes it: "eng<global index>"
// then "_k<backend knob type>=<choice>" per knob ("eng12_k2=3_k13=1").
struct EngineTag {
  int64_t engine = -1;
  std::vector<std::pair<int64_t, int64_t>> knobs;  // (cudnnBackendKnobType_t, choice), in the tag's order
};
// Null for anything else (a tactic of kiln's own, a truncated or hostile string).
std::optional<EngineTag> parse_engine_tag(const std::string& tag);

// One knob an engine takes (cudnnBackendKnobType_t numbering) and its range.
struct KnobRange {
  int64_t type = 0, min = 0, max = 0, stride = 1;
};
// The knobs whose variants ConvDesc::knob_variants tries: those that split
// the work (split-K slices, stream-K, CTA count, split-P) or pick the tile
// or kernel config. Other knobs (swizzle, stages, buffers) keep the
// heuristic's choice.
bool knob_varies_work(int64_t type);
// The values a variant tries for k: all of them when there are at most
// `samples`, else min, the powers of two on the knob's stride grid inside,
// and max (at most `samples`, at least 2; none for an empty or inverted range).
std::vector<int64_t> knob_values(const KnobRange& k, int samples = 8);
// The values the variants try for k: split counts (split-K and split-P
// slices) 1, 2, 4, 8 at most (past 2 slices no r18vd conv gained, session
// 25's sweep), every other knob knob_values(k, samples).
constexpr int64_t kMaxKnobSplit = 8;
std::vector<int64_t> knob_search_values(const KnobRange& k, int samples);

// PyTorch stores conv weights KCRS ([k][c/groups][r][s]); the NHWC engines want KRSC.
std::vector<float> kcrs_to_krsc(const float* w, int k, int c_per_group, int r, int s);

}  // namespace kiln::cuda
