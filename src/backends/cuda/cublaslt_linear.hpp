// Linear layers through cuBLASLt: y[m, n] = act(x[m, k] · W[n, k]^T + bias[n]
// [+ residual[m, n]]) with W in PyTorch's [out, in] row-major layout. f32
// computes in full fp32 unless allow_tf32; f16/bf16 accumulate in f32. Bias
// and ReLU ride on cuBLASLt epilogues, the residual on beta = 1 (C = residual,
// D = y); other activations run as a separate kernel on y.
// Every pointer passed to run() must be 16-byte aligned (the algorithm
// search is told so, so arena offsets need not be 256-byte aligned).
#pragma once
#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "core/activation.hpp"
#include "core/dtype.hpp"

namespace kiln::cuda {

// What LinearOp and MatMulOp share: one cuBLASLt product's descriptors (D =
// op(A) op(B), C = D), its heuristic algorithms and the chosen one. Derived
// constructors fill them; the destructor frees them (also when a derived
// constructor throws).
class LtGemm {
 public:
  LtGemm(const LtGemm&) = delete;
  LtGemm& operator=(const LtGemm&) = delete;

  static constexpr int kMaxTactics = 8;
  // Upper bound on the workspace an algorithm may ask for (NVIDIA suggests
  // 32 MiB on Hopper); the engine allocates workspace_bytes() of the chosen one.
  static constexpr size_t kMaxWorkspace = size_t(32) << 20;

  int tactic_count() const { return int(algos_.size()); }
  // "cublasLt algo 21 tile 7 stages 13 splitk 1 red 0 swizzle 0 custom 0 cluster 0".
  std::string tactic_name(int i) const;
  void select(int i);
  int selected() const { return selected_; }
  size_t workspace_bytes() const;

 protected:
  LtGemm(cublasLtHandle_t handle, const char* what) : handle_(handle), what_(what) {}
  ~LtGemm() { release(); }
  void release();
  // D = op(A) op(B) with the selected algorithm, alpha 1, beta 0 (C = D):
  // checks the 16-byte alignment of a, b, d and the workspace size, naming what_.
  void enqueue(const void* a, const void* b, void* d, void* workspace, size_t workspace_size, cudaStream_t s) const;

  cublasLtHandle_t handle_;
  const char* what_;  // "linear", "matmul": for errors
  cublasLtMatmulDesc_t op_ = nullptr;
  cublasLtMatrixLayout_t a_ = nullptr, b_ = nullptr, d_ = nullptr;
  cublasLtMatrixLayout_t c_ = nullptr;  // C when it is not D (LinearOp's residual); null: C = D
  std::vector<cublasLtMatmulHeuristicResult_t> algos_;
  int selected_ = 0;
  bool int_scalars_ = false;  // alpha and beta as int32 (CUBLAS_COMPUTE_32I), else f32
};

class LinearOp : public LtGemm {
 public:
  // Asks cuBLASLt's heuristic for up to kMaxTactics algorithms; throws
  // kiln::Error if it offers none (e.g. an unsupported shape/type).
  // out_dt: the output's (and bias's) type, dt's when unset; F32 with a
  // 16-bit dt is the mixed product plan_wide_linears asks for.
  // has_residual: run() adds residual[m, n] (out_dt, row-major like y) before
  // the activation, as C with beta = 1 (kiln's GEMM conv, gemm_conv.hpp);
  // without it the product is alpha 1, beta 0, C = D, as always.
  LinearOp(cublasLtHandle_t handle, DType dt, int m, int k, int n, bool has_bias, Activation act,
           bool allow_tf32 = false, std::optional<DType> out_dt = std::nullopt, bool has_residual = false);

  // bias may be nullptr only when constructed without bias; residual must be
  // given exactly when constructed with one (it may not alias y). Enqueues on
  // s; capturable in a CUDA graph.
  void run(const void* x, const void* w, const void* bias, void* y, void* workspace, size_t workspace_size,
           cudaStream_t s, const void* residual = nullptr) const;

 private:
  DType dt_, out_dt_;
  int m_, k_, n_;
  bool has_bias_, has_residual_;
  Activation act_;
  Activation post_act_;  // applied by a kernel after the GEMM (not fusable as an epilogue)
  // The bias pointer lives in the (shared) matmul descriptor, so run() sets
  // it and enqueues under this lock; engines are shared across threads.
  mutable std::mutex run_mutex_;
};

// Batched row-major products through cuBLASLt, the IR's matmul:
// y[p] = a[p] · b[p] for p < batch, a [m, k], b [k, n], y [m, n] row-major,
// a_stride / b_stride elements between consecutive products (0: one operand
// shared by all, a 2-D operand; y is dense). Accumulates in f32 (fp32 without
// TF32 unless allow_tf32). Pointers 16-byte aligned; the algorithms are asked
// for the alignment the batch strides keep.
class MatMulOp : public LtGemm {
 public:
  MatMulOp(cublasLtHandle_t handle, DType dt, int64_t batch, int m, int k, int n, int64_t a_stride, int64_t b_stride,
           bool allow_tf32 = false);
  void run(const void* a, const void* b, void* y, void* workspace, size_t workspace_size, cudaStream_t s) const;
};

// The FP8 GEMM of a quantized linear (issue 13):
// D[n, m] = W[n, k] · x[m, k]^T, W and x e4m3 row-major (the "TN" form,
// the only one cuBLASLt runs FP8 in), D f32 column-major with ld n (so
// y[m, n] row-major: one row of n sums per row of x). alpha 1, beta 0, no
// scale pointers (each 1), CUBLAS_COMPUTE_32F with fast accumulation off
// (partial sums promoted to f32 periodically). The scales, bias, residual,
// activation and output rounding are quant_epilogue's (kernels.hpp), so every
// output type and activation takes this one GEMM. k and n must be multiples
// of 16 (cuBLASLt's FP8 rule for k and the leading dimensions): callers pad.
// code I8: the INT8 GEMM, W and x i8, CUBLAS_COMPUTE_32I with int32 alpha and
// beta, D the exact int32 sums (in d's 4-byte slots; quant_epilogue_i32
// reads them). Same TN form and padding.
class Fp8GemmOp : public LtGemm {
 public:
  Fp8GemmOp(cublasLtHandle_t handle, int m, int k, int n, DType code = DType::F8E4M3);
  void run(const void* x, const void* w, float* d, void* workspace, size_t workspace_size, cudaStream_t s) const;
};

// The cuBLASLt plumbing LinearOp and MatMulOp share (cublaslt_linear.cpp).
namespace lt {
cudaDataType_t data_type(DType dt);
// Up to `max` algorithms of cuBLASLt's heuristic for D = op(A) op(B) (+ C
// with layout c; null: C = D), with the minimum pointer alignments of A, B
// and C/D in bytes; empty: none.
std::vector<cublasLtMatmulHeuristicResult_t> heuristic_algos(cublasLtHandle_t h, cublasLtMatmulDesc_t op,
                                                             cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                                             cublasLtMatrixLayout_t d, const uint32_t (&align)[3], int max,
                                                             cublasLtMatrixLayout_t c = nullptr);
// "cublasLt algo 21 tile 7 stages 13 splitk 1 red 0 swizzle 0 custom 0 cluster 0".
std::string algo_name(const cublasLtMatmulAlgo_t& a);
}  // namespace lt

}  // namespace kiln::cuda
