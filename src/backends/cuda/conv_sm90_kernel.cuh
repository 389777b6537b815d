// kiln's sm90 conv (conv_sm90.hpp) as a CUTLASS 3.x kernel template: the
// implicit-GEMM fprop mainloop (TMA im2col loads of x, TMA loads of the KRSC
// filter, warp-specialized wgmma with f32 accumulation) and a TMA epilogue
// whose fusion is one epilogue visitor tree node computing the conv layer's
// epilogue exactly as kiln's other convs spell it (igemm_conv.cu's finish8):
//
//   Sm90EVT< Sm90Compute<ConvEpilogue, T>,   v -> y (RNE)
//            Sm90AccFetch,                   acc[m, n]                (f32)
//            Sm90RowBroadcast<bias>,         bias[n] (T -> f32; 0 when null)
//            [Sm90SrcFetch<T>] >             residual[m, n] as the GEMM's C (T -> f32)
//
// v = act((acc + bias) + residual), the activation's fast form for 16-bit
// types (dev::act<A, true>). The GEMM view: M = n * out_h * out_w output
// pixels, N = k output channels, K = r * s * c (CUTLASS's fprop mapping), so
// the bias is a "row" broadcast (one value per column of D).
//
// The kernel is launched here, not by CUTLASS's adapter, so that it can carry
// the programmatic-dependent-launch attribute like kiln's own kernels: the
// sm90 kernel waits (griddepcontrol.wait, CUTLASS_ENABLE_GDC_FOR_SM90) in its
// load warp before the first TMA load, and every store follows those loads.
//
// Included only by the conv_sm90_<tile>.cu translation units (sm_90a).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>
#include <type_traits>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/kernel_hardware_info.h"  // first: CUTLASS's conv collectives use it without including it
#include "cutlass/conv/collective/collective_builder.hpp"
#include "cutlass/conv/convnd_problem_shape.hpp"
#include "cutlass/conv/device/conv_universal_adapter.hpp"
#include "cutlass/conv/kernel/conv_universal.hpp"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp"

#include "backends/cuda/conv_sm90_impl.hpp"
#include "backends/cuda/device_common.cuh"
#include "core/error.hpp"

#if !defined(CUTLASS_ARCH_MMA_SM90_SUPPORTED) && defined(__CUDA_ARCH__)
#error "conv_sm90 needs sm_90a (wgmma): compile with -gencode arch=compute_90a,code=sm_90a"
#endif

namespace kiln::cuda::convsm90 {

// ---- the epilogue node -----------------------------------------------------

// Runtime argument of the node (Sm90Compute hands a ComputeFn's `Arguments` to
// its call as the last parameter): the activation.
struct EpiArgs {
  Activation act = Activation::None;  // dev::act_rt's fast 16-bit forms; the dispatcher refuses the others
};

template <class T>
struct ConvEpilogue {
  using Arguments = EpiArgs;  // Sm90Compute looks it up on ComputeFn<ElementCompute>
};

template <int N>
struct ConvEpilogue<cutlass::Array<float, N>> {
  using Arguments = EpiArgs;
  using Frag = cutlass::Array<float, N>;

  CUTLASS_DEVICE Frag operator()(Frag const& acc, Frag const& bias, Arguments const& a) const {
    Frag out;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < N; ++i) out[i] = dev::act_rt<true>(a.act, __fadd_rn(acc[i], bias[i]));
    return out;
  }
  CUTLASS_DEVICE Frag operator()(Frag const& acc, Frag const& bias, Frag const& r, Arguments const& a) const {
    Frag out;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < N; ++i) out[i] = dev::act_rt<true>(a.act, __fadd_rn(__fadd_rn(acc[i], bias[i]), r[i]));
    return out;
  }
};

// ---- the kernel ------------------------------------------------------------

template <int TM, int TN, int TK>
struct Tile {
  using TileShape = cute::Shape<cute::Int<TM>, cute::Int<TN>, cute::Shape<cute::Int<TK>>>;
  using ClusterShape = cute::Shape<cute::_1, cute::_1, cute::_1>;
};

// ElementC: the residual's type (void: none).
template <class TileT, class ElementC>
struct Conv16 {
  using T = cutlass::half_t;
  using ElementAcc = float;
  static constexpr bool kHasC = !std::is_void_v<ElementC>;
  static constexpr int kAlign = 8;  // 16 bytes (TMA)
  using TileShape = typename TileT::TileShape;
  using ClusterShape = typename TileT::ClusterShape;
  using Layout = cutlass::layout::TensorNHWC;

  using Bias = cutlass::epilogue::fusion::Sm90RowBroadcast<0, TileShape, T, float, cute::Stride<cute::_0, cute::_1, int64_t>, kAlign>;
  using Node = cutlass::epilogue::fusion::Sm90Compute<ConvEpilogue, T, float, cutlass::FloatRoundStyle::round_to_nearest>;
  using Acc = cutlass::epilogue::fusion::Sm90AccFetch;
  using Evt = std::conditional_t<kHasC,
                                 cutlass::epilogue::fusion::Sm90EVT<Node, Acc, Bias, cutlass::epilogue::fusion::Sm90SrcFetch<T>>,
                                 cutlass::epilogue::fusion::Sm90EVT<Node, Acc, Bias>>;

  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, ElementAcc, float, ElementC, Layout, kAlign, T, Layout, kAlign,
      cutlass::epilogue::TmaWarpSpecialized, Evt>::CollectiveOp;

  using CollectiveMainloop = typename cutlass::conv::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, cutlass::conv::Operator::kFprop, T, Layout, kAlign, T, Layout,
      kAlign, ElementAcc, TileShape, ClusterShape,
      cutlass::conv::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename CollectiveEpilogue::SharedStorage))>,
      cutlass::conv::collective::KernelScheduleAuto>::CollectiveOp;

  using ProblemShape = cutlass::conv::ConvProblemShape<cutlass::conv::Operator::kFprop, 2>;
  using Kernel = cutlass::conv::kernel::ConvUniversal<ProblemShape, CollectiveMainloop, CollectiveEpilogue>;
  using Conv = cutlass::conv::device::ConvUniversalAdapter<Kernel>;
  using Arguments = typename Conv::Arguments;
  using StrideC = typename Kernel::StrideC;
  using StrideD = typename Kernel::StrideD;

  // PyTorch's output extent floor((h + pad_t + pad_b - dil (r - 1) - 1) / stride) + 1 is given
  // (out_h); CUTLASS derives it from both paddings, so the lower one is the conv's and the upper
  // one the least that yields out_h (never negative: an overhang PyTorch's floor drops is not padding).
  static int upper_pad(int in, int out, int k, int stride, int pad, int dil) {
    const int need = (out - 1) * stride + dil * (k - 1) + 1 - in - pad;
    return need > 0 ? need : 0;
  }

  static Arguments arguments(const Problem& p) {
    const IgemmConvShape& s = p.s;
    const int64_t xs = s.x_stride ? s.x_stride : s.c, ys = s.y_stride ? s.y_stride : s.k;
    ProblemShape shape(cutlass::conv::Mode::kCrossCorrelation, {s.n, s.h, s.w, s.c},
                       {int64_t(s.h) * s.w * xs, int64_t(s.w) * xs, xs, 1}, {s.k, s.r, s.s, s.c},
                       {int64_t(s.r) * s.s * s.c, int64_t(s.s) * s.c, s.c, 1},
                       {s.pad_t, s.pad_l},
                       {upper_pad(s.h, s.out_h, s.r, s.stride_h, s.pad_t, s.dil_h),
                        upper_pad(s.w, s.out_w, s.s, s.stride_w, s.pad_l, s.dil_w)},
                       {s.stride_h, s.stride_w}, {s.dil_h, s.dil_w}, 1);
    // D (and C) strides over ((q, p, n), k): pixel, row and image strides of y.
    StrideD sd{};
    cute::get<0, 0>(sd) = ys;
    cute::get<0, 1>(sd) = int64_t(s.out_w) * ys;
    cute::get<0, 2>(sd) = int64_t(s.out_h) * s.out_w * ys;
    StrideC sc{};
    cute::get<0, 0>(sc) = s.k;  // the residual is dense
    cute::get<0, 1>(sc) = int64_t(s.out_w) * s.k;
    cute::get<0, 2>(sc) = int64_t(s.out_h) * s.out_w * s.k;
    using ThreadArgs = typename CollectiveEpilogue::FusionCallbacks::Arguments;
    const EpiArgs ea{p.act};
    const T* bias = static_cast<const T*>(p.bias);
    ThreadArgs thread = [&] {
      // Each node's arguments: {first child, ..., last child, the node's own}.
      if constexpr (kHasC)
        return ThreadArgs{{}, {bias, T(0), {}}, {}, ea};
      else
        return ThreadArgs{{}, {bias, T(0), {}}, ea};
    }();
    using PtrC = decltype(std::declval<typename CollectiveEpilogue::Arguments>().ptr_C);
    cutlass::KernelHardwareInfo hw;
    return Arguments{shape,
                     {static_cast<const T*>(p.x), static_cast<const T*>(p.w)},
                     {thread, static_cast<PtrC>(p.residual), sc, static_cast<T*>(p.y), sd},
                     hw};
  }

  static std::string unsupported(const Problem& p) {
    const Arguments args = arguments(p);
    if (Conv::can_implement(args) != cutlass::Status::kSuccess) return "CUTLASS's can_implement refuses the shape";
    if (Conv::get_workspace_size(args) != 0) return "the kernel asks for a workspace";
    return "";
  }

  static void run(const Problem& p, const char* name) {
    const Arguments args = arguments(p);
    Conv conv;
    cutlass::Status st = conv.can_implement(args);
    if (st != cutlass::Status::kSuccess)
      fail_runtime("cuda conv_sm90 (", name, "): CUTLASS can_implement refused the conv: ", cutlassGetStatusString(st));
    if (Conv::get_workspace_size(args) != 0) fail_runtime("cuda conv_sm90 (", name, "): the kernel asks for a workspace");
    // initialize: the TMA descriptors (im2col of x at this address) and the kernel's shared-memory limit.
    st = conv.initialize(args, nullptr, p.stream);
    if (st != cutlass::Status::kSuccess)
      fail_runtime("cuda conv_sm90 (", name, "): CUTLASS initialize failed: ", cutlassGetStatusString(st), " (",
                   cudaGetErrorString(cudaGetLastError()), ")");
    auto params = conv.params();
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = Conv::get_grid_shape(params);
    cfg.blockDim = Kernel::get_block_shape();
    cfg.dynamicSmemBytes = Kernel::SharedStorageSize;
    cfg.stream = p.stream;
    cudaLaunchAttribute attr[1] = {};
    if (p.pdl) {
      attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
      attr[0].val.programmaticStreamSerializationAllowed = 1;
      cfg.attrs = attr;
      cfg.numAttrs = 1;
    }
    const cudaError_t e = cudaLaunchKernelEx(&cfg, cutlass::device_kernel<Kernel>, params);
    if (e != cudaSuccess) fail_runtime("cuda conv_sm90 (", name, "): launch failed: ", cudaGetErrorString(e));
  }
};

// A configuration's entry points: with and without a residual.
template <class TileT>
struct ConfigKernels {
  static std::string unsupported(const Problem& p) {
    return p.residual ? Conv16<TileT, cutlass::half_t>::unsupported(p) : Conv16<TileT, void>::unsupported(p);
  }
  static void run(const Problem& p, const char* name) {
    if (p.residual) Conv16<TileT, cutlass::half_t>::run(p, name);
    else Conv16<TileT, void>::run(p, name);
  }
};

}  // namespace kiln::cuda::convsm90

// Defines convsm90::<var> for tile TM x TN x TK (one per translation unit).
#define KILN_SM90_CONV_CONFIG(var, TM, TN, TK)                                                   \
  namespace kiln::cuda::convsm90 {                                                               \
  namespace {                                                                                    \
  constexpr const char kName_##var[] = "kiln sm90 conv " #TM "x" #TN "x" #TK;                    \
  using Kernels_##var = ConfigKernels<Tile<TM, TN, TK>>;                                         \
  std::string unsupported_##var(const Problem& p) { return Kernels_##var::unsupported(p); }      \
  void run_##var(const Problem& p) { Kernels_##var::run(p, kName_##var); }                       \
  }                                                                                              \
  const Config var{kName_##var, TM, TN, TK, unsupported_##var, run_##var};                       \
  }
