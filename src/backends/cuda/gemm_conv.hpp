// kiln's GEMM conv (switch gemm_conv): a dense conv as im2col into the step's
// workspace (im2col_nhwc, gemm_conv.cu) and one cuBLASLt GEMM (LinearOp)
//   y[M, k] = act(cols[M, K] · w[k, K]^T + bias + residual),
// M = n * out_h * out_w output pixels, K = r * s * c, w the KRSC filter the
// engine uploads (each output channel's row in tap-major, channel-minor
// order, cols' column order), y NHWC. cuBLASLt picks split-K for the small
// late-stage maps (20x20x512 at K = 4608) where cuDNN's tiles fill a quarter
// of the SMs. Bias and ReLU ride cuBLASLt's epilogue, the residual rides
// beta = 1 with C = residual; other activations run as a kernel after the
// GEMM. A 1x1 stride-1 unpadded conv needs no im2col: x [M, c] is cols.
// A candidate of lower_Conv2d's tactic selector (conv.cpp), recorded as
// "kiln gemm_conv " + the cuBLASLt algorithm's name (lt::algo_name).
#pragma once
#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <optional>
#include <string>

#include "backends/cuda/cublaslt_linear.hpp"
#include "backends/cuda/cudnn_conv.hpp"
#include "backends/cuda/kernels.hpp"

namespace kiln::cuda {

inline constexpr const char* kGemmConvTactic = "kiln gemm_conv ";  // + lt::algo_name
// The largest im2col matrix taken: every context holds it in its workspace
// (twice with the side lane), and the convs the GEMM is for are small maps.
inline constexpr size_t kMaxIm2colBytes = size_t(64) << 20;

// Empty when the GEMM conv takes d, else why not: groups 1, dense x and y
// (no channel windows), f16/bf16/f32 (f32 computes as LinearOp does: fp32,
// or TF32 with allow_tf32), no 8-bit codes, GEMM extents within int, an
// im2col matrix of at most kMaxIm2colBytes. Needs no GPU.
std::string gemm_conv_unsupported(const ConvDesc& d);
// The conv reads x as the GEMM's A as it is (1x1, stride 1, no padding).
bool gemm_conv_in_place(const ConvDesc& d);
// Bytes of d's im2col matrix (0 when gemm_conv_in_place).
size_t gemm_conv_cols_bytes(const ConvDesc& d);
// "kiln gemm_conv " + algo, and back: the cuBLASLt algorithm's name of a
// gemm_conv tactic name, nullopt for any other.
std::string gemm_conv_tactic_name(const std::string& algo);
std::optional<std::string> parse_gemm_conv_tactic(const std::string& name);

// One conv as im2col + GEMM, its tactics the GEMM's cuBLASLt algorithms.
class GemmConvOp {
 public:
  // Throws kiln::Error when gemm_conv_unsupported(d) says why, or cuBLASLt
  // offers no algorithm for the product.
  GemmConvOp(cublasLtHandle_t handle, const ConvDesc& d);

  int tactic_count() const { return lt_.tactic_count(); }
  std::string tactic_name(int i) const { return gemm_conv_tactic_name(lt_.tactic_name(i)); }
  // The index of the tactic named `name` (tactic_name), or -1.
  int find(const std::string& name) const;
  void select(int i) { lt_.select(i); }
  int selected() const { return lt_.selected(); }
  // The im2col matrix (256-byte aligned) then the selected algorithm's workspace.
  size_t workspace_bytes() const { return cols_bytes_ + lt_.workspace_bytes(); }
  // What the step launches: the tactic, " +im2col" when it runs, " +silu kernel" for an activation after the GEMM.
  std::string step_name() const;

  // x NHWC, w KRSC, bias [k] (or null), residual like y (or null, exactly as
  // constructed), y NHWC, all in d's type and 16-byte aligned; the workspace
  // of workspace_bytes() at least, 256-byte aligned. Capturable.
  void run(const void* x, const void* w, const void* bias, const void* residual, void* y, void* workspace,
           size_t workspace_size, cudaStream_t s) const;

 private:
  Im2colShape geo_;
  DType dt_;
  Activation act_;
  bool im2col_;
  size_t cols_bytes_;  // 256-aligned, 0 without im2col
  LinearOp lt_;
};

}  // namespace kiln::cuda
