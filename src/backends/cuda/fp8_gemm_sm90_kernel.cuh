// The sm90 8-bit GEMM of fp8_gemm_sm90.hpp as a CUTLASS 3.x kernel template:
// TMA warp-specialized mainloop (e4m3 x e4m3 with f32 accumulation and
// CUTLASS's FP8 promotion, i.e. no "fast accumulation"; or i8 x i8 with exact
// int32 accumulation, converted to f32 once, RNE, as the CPU's f32 of the
// exact sum) and a TMA epilogue whose fusion
// is an epilogue visitor tree computing the quantized layer's epilogue
// (quant.cu's quant_epilogue_kernel) on the accumulators before the one store:
//
//   Sm90EVT< Sm90Compute<LayerEpilogue, D>,          v -> y (RNE; e4m3 saturating)
//            Sm90AccFetch,                            acc[m, n]
//            Sm90RowBroadcast<alpha>,                 alpha[n] (f32)
//            Sm90RowBroadcast<bias>,                  bias[n]  (f32)
//            [Sm90SrcFetch<C>] >                      residual[m, n] as the GEMM's C (f16, or codes
//                                                     of the layer's type times residual_scale)
//
// The whole epilogue is one compute node so its f32 operations are spelled
// exactly as quant_epilogue_kernel's (fmaf, __fmul_rn, __fadd_rn: no
// contraction), with the activation and the output scale as runtime arguments
// of the node: the only difference from cuBLASLt + quant_epilogue left is the
// order of the f32 accumulation.
//
// Included only by the fp8_gemm_sm90_<tile>.cu translation units (sm_90a).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <type_traits>
#include <utility>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/kernel_hardware_info.h"

#include "backends/cuda/fp8_gemm_sm90_impl.hpp"
#include "core/error.hpp"

#if !defined(CUTLASS_ARCH_MMA_SM90_SUPPORTED) && defined(__CUDA_ARCH__)
#error "fp8_gemm_sm90 needs sm_90a (wgmma): compile with -gencode arch=compute_90a,code=sm_90a"
#endif

namespace kiln::cuda::fp8sm90 {

// ---- the epilogue node -----------------------------------------------------

// Runtime arguments of the node (Sm90Compute hands a ComputeFn's `Arguments`
// to its call as the last parameter).
struct EpiArgs {
  float residual_mul = 1.f;
  float residual_scale = 1.f;  // an 8-bit residual's scale (1 for f16: r * 1 == r exactly)
  float out_scale = 1.f;  // inv_out_scale, or 1 without scale_after (v * 1 == v exactly)
  int relu = 0;           // 1: Activation::Relu (fmaxf(v, 0) as dev::act), 0: none
};

__device__ __forceinline__ float finish(float v, const EpiArgs& a) {
  if (a.relu) v = fmaxf(v, 0.f);
  return __fmul_rn(v, a.out_scale);
}

// The output's encoding before CUTLASS's conversion. e4m3: clamp to the finite
// range (NaN compares false both ways and stays NaN); CUTLASS's float ->
// float_e4m3_t conversion is cvt.rn.satfinite on sm_90 already, the clamp makes
// saturation independent of which converter path CUTLASS picks. i8: the CPU's
// quant::f32_to_i8 (Full range) done here, so the conversion after it is exact
// whatever CUTLASS's rounding: NaN -> 0, round half to even, clamp to [-128, 127].
enum class OutKind { Wide, E4m3, I8 };
template <OutKind kOut>
__device__ __forceinline__ float saturate(float v) {
  if constexpr (kOut == OutKind::E4m3) return v > 448.f ? 448.f : (v < -448.f ? -448.f : v);
  else if constexpr (kOut == OutKind::I8) return v != v ? 0.f : fminf(fmaxf(rintf(v), -128.f), 127.f);
  else return v;
}

template <OutKind kClamp, class T>
struct LayerEpilogueFn {
  using Arguments = EpiArgs;  // Sm90Compute looks it up on ComputeFn<ElementCompute>
};

template <OutKind kClamp, int N>
struct LayerEpilogueFn<kClamp, cutlass::Array<float, N>> {
  using Arguments = EpiArgs;
  using Frag = cutlass::Array<float, N>;

  // acc * alpha + bias (one fma), activation, output scale.
  CUTLASS_DEVICE Frag operator()(Frag const& acc, Frag const& alpha, Frag const& bias, Arguments const& a) const {
    Frag out;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < N; ++i) out[i] = saturate<kClamp>(finish(fmaf(acc[i], alpha[i], bias[i]), a));
    return out;
  }
  // ... + residual * residual_mul before the activation.
  CUTLASS_DEVICE Frag operator()(Frag const& acc, Frag const& alpha, Frag const& bias, Frag const& r,
                                 Arguments const& a) const {
    Frag out;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < N; ++i) {
      const float v =
          __fadd_rn(fmaf(acc[i], alpha[i], bias[i]), __fmul_rn(__fmul_rn(r[i], a.residual_scale), a.residual_mul));
      out[i] = saturate<kClamp>(finish(v, a));
    }
    return out;
  }
};

// Sm90Compute takes a template of exactly one parameter.
template <class T>
struct LayerEpilogueWide : LayerEpilogueFn<OutKind::Wide, T> {};
template <class T>
struct LayerEpilogueE4m3 : LayerEpilogueFn<OutKind::E4m3, T> {};
template <class T>
struct LayerEpilogueI8 : LayerEpilogueFn<OutKind::I8, T> {};

// ---- the kernel ------------------------------------------------------------

// Tile shape (M x N x K per CTA), cluster shape, schedule and tile scheduler
// of one configuration. Scheduler void: CUTLASS's persistent data-parallel
// scheduler (one CTA per output tile); cutlass::gemm::StreamKScheduler
// (cooperative only): the K loop of the tiles is spread over every SM and the
// partial sums meet in the workspace before the one epilogue, for the small-M
// layers of batch 1 where data-parallel tiles leave most SMs idle (resnet50's
// layer3 1x1s at 14x14: 8 tiles of 128x64 on 132 SMs). CUTLASS's default
// reduction is deterministic (a fixed order), its heuristic picks data-parallel
// where stream-K does not pay.
template <int TM, int TN, int TK, int CM, bool kPingpong, class TileScheduler = void>
struct TileConfig {
  using Scheduler = TileScheduler;
  using TileShape = cute::Shape<cute::Int<TM>, cute::Int<TN>, cute::Int<TK>>;
  using ClusterShape = cute::Shape<cute::Int<CM>, cute::_1, cute::_1>;
  using MainloopSchedule = std::conditional_t<kPingpong, cutlass::gemm::KernelTmaWarpSpecializedPingpong,
                                              cutlass::gemm::KernelTmaWarpSpecializedCooperative>;
  using EpilogueSchedule = std::conditional_t<kPingpong, cutlass::epilogue::TmaWarpSpecialized,
                                              cutlass::epilogue::TmaWarpSpecializedCooperative>;
};

// The EVT's root for output type D (the e4m3 node clamps first).
template <class D>
struct EpilogueNode {
  using type = cutlass::epilogue::fusion::Sm90Compute<LayerEpilogueWide, D, float, cutlass::FloatRoundStyle::round_to_nearest>;
};
template <>
struct EpilogueNode<cutlass::float_e4m3_t> {
  using type = cutlass::epilogue::fusion::Sm90Compute<LayerEpilogueE4m3, cutlass::float_e4m3_t, float,
                                                      cutlass::FloatRoundStyle::round_to_nearest>;
};
template <>
struct EpilogueNode<int8_t> {
  using type = cutlass::epilogue::fusion::Sm90Compute<LayerEpilogueI8, int8_t, float, cutlass::FloatRoundStyle::round_to_nearest>;
};

// The SM count of the current device for the persistent tile scheduler
// (fp8_gemm_sm90.cpp; cached per device, 0 when unknown: CUTLASS asks then).
int sm_count_of_current_device();

// ElementAB: the codes of x and w (e4m3 or int8); ElementC: the residual's
// type (void: none); ElementD: the output's.
template <class Tile, class ElementAB, class ElementC, class ElementD>
struct Gemm8 {
  using ElementA = ElementAB;
  using ElementB = ElementAB;
  // e4m3: f32 accumulators; i8: exact int32 sums (the epilogue's node converts them to f32, RNE).
  using ElementAcc = std::conditional_t<std::is_same_v<ElementAB, int8_t>, int32_t, float>;
  using LayoutA = cutlass::layout::RowMajor;     // x [m, k]
  using LayoutB = cutlass::layout::ColumnMajor;  // w [n, k]: B (k x n) column-major
  using LayoutC = cutlass::layout::RowMajor;     // residual [m, n]
  using LayoutD = cutlass::layout::RowMajor;     // y [m, n]
  static constexpr bool kHasC = !std::is_void_v<ElementC>;
  static constexpr int kAlignA = 16, kAlignB = 16;  // 16 bytes (TMA)
  static constexpr int kAlignD = 128 / cutlass::sizeof_bits<ElementD>::value;
  static constexpr int kAlignC = 128 / cutlass::sizeof_bits<std::conditional_t<kHasC, ElementC, ElementD>>::value;
  using TileShape = typename Tile::TileShape;
  using ClusterShape = typename Tile::ClusterShape;

  // alpha / bias: f32 vectors over n (a "row" broadcast in CUTLASS's terms:
  // one value per column of D), read straight from global memory.
  using Vec = cutlass::epilogue::fusion::Sm90RowBroadcast<0, TileShape, float, float,
                                                          cute::Stride<cute::_0, cute::_1, int64_t>, 4>;
  using Node = typename EpilogueNode<ElementD>::type;
  using Acc = cutlass::epilogue::fusion::Sm90AccFetch;
  using Evt = std::conditional_t<kHasC,
                                 cutlass::epilogue::fusion::Sm90EVT<Node, Acc, Vec, Vec,
                                                                    cutlass::epilogue::fusion::Sm90SrcFetch<ElementC>>,
                                 cutlass::epilogue::fusion::Sm90EVT<Node, Acc, Vec, Vec>>;

  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, ElementAcc, float, ElementC, LayoutC, kAlignC, ElementD, LayoutD, kAlignD,
      typename Tile::EpilogueSchedule, Evt>::CollectiveOp;

  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementA, LayoutA, kAlignA, ElementB, LayoutB, kAlignB, ElementAcc,
      TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      typename Tile::MainloopSchedule>::CollectiveOp;

  using Kernel = cutlass::gemm::kernel::GemmUniversal<cute::Shape<int, int, int, int>, CollectiveMainloop,
                                                      CollectiveEpilogue, typename Tile::Scheduler>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
  using Arguments = typename Gemm::Arguments;
  using StrideA = typename Kernel::StrideA;
  using StrideB = typename Kernel::StrideB;
  using StrideC = typename Kernel::StrideC;
  using StrideD = typename Kernel::StrideD;

  static Arguments arguments(const Problem& p, int sm_count) {
    const int64_t m = p.m, n = p.n, k = p.k;
    // Packed strides, batch (L = 1) stride the whole matrix.
    const StrideA sa = cute::make_stride(k, cute::_1{}, m * k);
    const StrideB sb = cute::make_stride(k, cute::_1{}, n * k);
    const StrideC sc = cute::make_stride(n, cute::_1{}, m * n);
    const StrideD sd = cute::make_stride(n, cute::_1{}, m * n);
    EpiArgs ea;
    if (p.e) {
      ea.residual_mul = p.e->residual_mul;
      ea.residual_scale = p.rdt == DType::F8E4M3 || p.rdt == DType::I8 ? p.e->residual_scale : 1.f;
      ea.out_scale = p.e->scale_after ? p.e->inv_out_scale : 1.f;
      ea.relu = p.e->act == Activation::Relu ? 1 : 0;
    }
    const float* alpha = p.e ? p.e->alpha : nullptr;
    const float* bias = p.e ? p.e->bias : nullptr;
    using ThreadArgs = typename CollectiveEpilogue::FusionCallbacks::Arguments;
    ThreadArgs thread = [&] {
      // Each node's arguments: {first child, ..., last child, the node's own}.
      if constexpr (kHasC)
        return ThreadArgs{{}, {alpha, 0.f, {}}, {bias, 0.f, {}}, {}, ea};
      else
        return ThreadArgs{{}, {alpha, 0.f, {}}, {bias, 0.f, {}}, ea};
    }();
    cutlass::KernelHardwareInfo hw;
    hw.sm_count = sm_count;
    using PtrC = decltype(std::declval<typename CollectiveEpilogue::Arguments>().ptr_C);
    return Arguments{cutlass::gemm::GemmUniversalMode::kGemm,
                     {p.m, p.n, p.k, 1},
                     {static_cast<ElementA const*>(p.x), sa, static_cast<ElementB const*>(p.w), sb},
                     {thread, static_cast<PtrC>(p.residual), sc, static_cast<ElementD*>(p.y), sd},
                     hw};
  }

  static size_t workspace(int m, int n, int k) {
    Problem p;
    p.m = m, p.n = n, p.k = k;
    return Gemm::get_workspace_size(arguments(p, sm_count_of_current_device()));
  }

  static void run(const Problem& p, int sm_count, const char* name) {
    const Arguments args = arguments(p, sm_count);
    Gemm gemm;
    cutlass::Status st = gemm.can_implement(args);
    if (st != cutlass::Status::kSuccess)
      fail_runtime("cuda fp8_gemm_sm90 (", name, "): CUTLASS can_implement refused [", p.m, ", ", p.k, "] x [", p.n, ", ",
                   p.k, "]: ", cutlassGetStatusString(st));
    const size_t need = Gemm::get_workspace_size(args);
    if (need > p.workspace_bytes)
      fail_runtime("cuda fp8_gemm_sm90 (", name, "): needs ", need, " workspace bytes, given ", p.workspace_bytes);
    st = gemm.initialize(args, p.workspace, p.stream);
    if (st != cutlass::Status::kSuccess)
      fail_runtime("cuda fp8_gemm_sm90 (", name, "): CUTLASS initialize failed: ", cutlassGetStatusString(st), " (",
                   cudaGetErrorString(cudaGetLastError()), ")");
    st = gemm.run(p.stream);
    if (st != cutlass::Status::kSuccess)
      fail_runtime("cuda fp8_gemm_sm90 (", name, "): CUTLASS run failed: ", cutlassGetStatusString(st), " (",
                   cudaGetErrorString(cudaGetLastError()), ")");
  }
};

// A configuration's entry points: every (residual, output) pair of the tile
// for codes AB (residual and output: f16 or codes of AB's type).
template <class Tile, class AB>
struct ConfigKernels {
  template <class C, class D>
  using G = Gemm8<Tile, AB, C, D>;
  using F16 = cutlass::half_t;
  static constexpr DType kCode = std::is_same_v<AB, int8_t> ? DType::I8 : DType::F8E4M3;

  static size_t workspace(int m, int n, int k) {
    size_t w = 0;
    for (size_t v : {G<void, F16>::workspace(m, n, k), G<void, AB>::workspace(m, n, k), G<F16, F16>::workspace(m, n, k),
                     G<F16, AB>::workspace(m, n, k), G<AB, F16>::workspace(m, n, k), G<AB, AB>::workspace(m, n, k)})
      w = v > w ? v : w;
    return w;
  }

  template <class C>
  static void run_out(const Problem& p, int sms, const char* name) {
    if (p.ydt == kCode) G<C, AB>::run(p, sms, name);
    else G<C, F16>::run(p, sms, name);
  }

  static void run(const Problem& p, const char* name) {
    const int sms = sm_count_of_current_device();
    if (!p.residual) run_out<void>(p, sms, name);
    else if (p.rdt == kCode) run_out<AB>(p, sms, name);
    else run_out<F16>(p, sms, name);
  }
};

}  // namespace kiln::cuda::fp8sm90

// Defines fp8sm90::<var> for a tile config of codes AB (one per translation unit).
#define KILN_SM90_GEMM8_CONFIG(var, label, AB, ...)                                      \
  namespace kiln::cuda::fp8sm90 {                                                        \
  namespace {                                                                            \
  using Tile_##var = TileConfig<__VA_ARGS__>;                                            \
  using Kernels_##var = ConfigKernels<Tile_##var, AB>;                                   \
  size_t workspace_##var(int m, int n, int k) { return Kernels_##var::workspace(m, n, k); } \
  void run_##var(const Problem& p) { Kernels_##var::run(p, label); }                      \
  }                                                                                      \
  const Config var{label, Kernels_##var::kCode, workspace_##var, run_##var};             \
  }
#define KILN_FP8_SM90_CONFIG(var, label, ...) KILN_SM90_GEMM8_CONFIG(var, label, cutlass::float_e4m3_t, __VA_ARGS__)
#define KILN_I8_SM90_CONFIG(var, label, ...) KILN_SM90_GEMM8_CONFIG(var, label, int8_t, __VA_ARGS__)
