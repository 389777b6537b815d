// Engine switches: the fusion and launch choices that were once environment
// variables (KILN_FUSE_SE=0, ...). They are build options now (`kiln build
// --enable/--disable`, BuildOptions::switches), recorded in the bundle's
// provenance and read back at load, so what is in the bundle is what runs:
// nothing in the environment changes an engine. Each switch is tri-state:
// auto (the measured default, documented where the choice is made), on, off.
#pragma once
#include <array>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace kiln {

enum class Switch : int {
  FuseSe,      // CUDA: squeeze-excitation as one MLP step (auto: on)
  FuseSeMul,   // CUDA: the SE gate applied inside that step (auto: off)
  WindowConv,  // CUDA: kiln's window conv for Res2Net chunk convs (auto: by output size)
  CudaViews,   // CUDA: channel views with cuDNN convs (auto: off unless window convs run)
  FuseSplit,   // CUDA: consecutive slices in one launch (auto: when small; on: always)
  Pdl,         // CUDA: programmatic dependent launch (auto: batch <= 4)
  FuseAdd,     // CPU: a conv's input add computed while it gathers its columns (auto: on)
  Fp8OneKernel,  // CUDA: an 8-bit layer with a one-kernel candidate takes one (auto: off, every path timed)
  FuseMlp,     // CUDA: chains of small linears in one launch (auto: the chains; on: also a post-norm's projection inside the norm)
  IgemmConv,   // CUDA: kiln's implicit-GEMM conv timed beside cuDNN's engines for dense f16/bf16 convs (auto: off; it lost every r18vd conv)
  SideLane,    // CUDA: independent convs, pools and linears on a second stream inside the graph (auto: on)
  ConvKnobs,   // CUDA: knob variants (split-K, tiles, kernel configs) of cuDNN's first engines timed too (auto: on up to batch 4)
  GemmConv,    // CUDA: im2col + a cuBLASLt GEMM (split-K, epilogue) timed beside cuDNN's engines for dense convs (auto: off until measured)
  SmallGemm,   // CUDA: kiln's small linear with PDL (small_gemm.cu) instead of cuBLASLt (auto: the shapes where it won in the graph; on: every 16-bit linear it takes)
  LinearNorm,  // CUDA: a post-norm's projection, residual add and layer norm in one small_gemm_norm launch (auto: off until measured on a GPU; on: every one it takes; at load what the bundle's plan records)
  ConcatMask,  // CUDA: a row-major concat's mul by a per-token constant (RT-DETR's memory mask) inside the concat's launch (auto: off until measured on a GPU; at load what the plan records)
  Sm90Conv,    // CUDA: kiln's sm90 conv (CUTLASS implicit GEMM, TMA + wgmma, PDL) timed beside cuDNN's engines for dense f16 convs (auto: off until measured on a GPU)
  DirectConv,  // CUDA: kiln's direct conv for convs of at most 4 input channels (RGB stems) timed beside cuDNN's engines (auto: off until measured on a GPU)
  ClusterTopK,  // CUDA: top_k rows of 4096..196608 elements on a cluster of 8 blocks instead of one (auto: on since session 33; the same bits either way)
  WideAttention,  // CUDA: attention's key-split-4 form with 2 or 4 query groups a block, one k/v copy per 32 or 64 queries (auto: on since session 33; the same bits either way)
  WarpDeform,  // CUDA: ms_deform_attn with one warp per query and 16-byte value loads (auto: from 2400 queries a launch, where it won on the H100; the same bits either way)
  MemsetKernels,  // CUDA: the captured call's memset nodes (cuDNN's) replaced by kiln fill kernels (auto: off until measured on a GPU; the same bytes either way)
  LateSideFork,   // CUDA: a side run whose window holds a top_k of <= 8 rows forks right before it, beside the few-block step (auto: on since session 34; at load what the plan records)
  WeightPrefetch,  // CUDA: one side-lane launch pulls the weights of the call's last steps (up to 12 MiB) into L2 before they run (auto: off until measured on a GPU; at load what the plan records; no bit changes)
  PrefetchEvictLast,  // CUDA: weight_prefetch's lines marked evict-last in L2, so streaming activations evict them last (auto: off until measured on a GPU; at load what the plan records)
  ChainSideFork,  // CUDA: a side run whose window holds an mlp_chain launch forks right after it, not beside the chain's clusters (auto: off until measured on a GPU; at load what the plan records)
  kCount
};
constexpr int kSwitchCount = static_cast<int>(Switch::kCount);

const char* switch_name(Switch s);
// All switch names, in enum order, for help texts and errors.
std::string switch_names();

class EngineSwitches {
 public:
  // nullopt = auto.
  std::optional<bool> get(Switch s) const { return v_[static_cast<int>(s)]; }
  void set(Switch s, std::optional<bool> on) { v_[static_cast<int>(s)] = on; }
  // "a,b,c" of switch names; an unknown name is Error(Usage) listing the known ones.
  void set_list(const std::string& names, bool on);
  bool all_auto() const;
  // {"fuse_se": "auto" | "on" | "off", ...}: every switch, always.
  nlohmann::json to_json() const;
  // Strict: unknown keys or values are Error(Input) naming `where` and the key.
  // A missing key is auto (bundles older than a switch).
  static EngineSwitches from_json(const nlohmann::json& j, const std::string& where);

 private:
  std::array<std::optional<bool>, kSwitchCount> v_{};
};

}  // namespace kiln
