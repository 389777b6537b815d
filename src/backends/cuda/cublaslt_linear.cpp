// cuBLASLt plumbing for LinearOp. cuBLASLt is column-major, so the row-major
// product y[m,n] = x[m,k] · W[n,k]^T is computed as its transpose
// D[n,m] = op_T(A) · B with A = W viewed column-major as [k, n] (ld k),
// B = x viewed as [k, m] (ld k) and D = y viewed as [n, m] (ld n). This is
// the "TN" form cuBLASLt supports best, and the bias (length n = rows of D)
// is exactly what its BIAS epilogue adds. A residual is C, laid out as D.
#include "backends/cuda/cublaslt_linear.hpp"

#include <cstdint>

#include "backends/cuda/cuda_check.hpp"
#include "backends/cuda/kernels.hpp"
#include "core/error.hpp"

namespace kiln::cuda {
namespace lt {

cudaDataType_t data_type(DType dt) {
  switch (dt) {
    case DType::F32: return CUDA_R_32F;
    case DType::F16: return CUDA_R_16F;
    case DType::BF16: return CUDA_R_16BF;
    default: fail_runtime("cuda cuBLASLt: unsupported dtype ", dtype_name(dt));
  }
}

namespace {
template <typename T>
T algo_attr(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoConfigAttributes_t attr) {
  T v{};
  size_t written = 0;
  if (cublasLtMatmulAlgoConfigGetAttribute(&algo, attr, &v, sizeof(v), &written) != CUBLAS_STATUS_SUCCESS) return T{};
  return v;
}
}  // namespace

std::vector<cublasLtMatmulHeuristicResult_t> heuristic_algos(cublasLtHandle_t h, cublasLtMatmulDesc_t op,
                                                             cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                                             cublasLtMatrixLayout_t d, const uint32_t (&align)[3],
                                                             int max, cublasLtMatrixLayout_t c) {
  cublasLtMatmulPreference_t pref = nullptr;
  KILN_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const uint64_t max_ws = LinearOp::kMaxWorkspace;
  cublasStatus_t st =
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &max_ws, sizeof(max_ws));
  const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> aligns[] = {
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align[0]}, {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align[1]},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align[2]}, {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align[2]}};
  for (const auto& [attr, v] : aligns)
    if (st == CUBLAS_STATUS_SUCCESS) st = cublasLtMatmulPreferenceSetAttribute(pref, attr, &v, sizeof(v));
  std::vector<cublasLtMatmulHeuristicResult_t> results(static_cast<size_t>(max));
  int found = 0;
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulAlgoGetHeuristic(h, op, a, b, c ? c : d, d, pref, max, results.data(), &found);
  cublasLtMatmulPreferenceDestroy(pref);
  // NOT_SUPPORTED means "no algorithm", reported by the caller with the layer's shape.
  if (st != CUBLAS_STATUS_SUCCESS && st != CUBLAS_STATUS_NOT_SUPPORTED)
    ::kiln::cuda::throw_cublas(st, "cublasLtMatmulAlgoGetHeuristic", __FILE__, __LINE__);
  std::vector<cublasLtMatmulHeuristicResult_t> ok;
  for (int i = 0; i < found; ++i)
    if (results[static_cast<size_t>(i)].state == CUBLAS_STATUS_SUCCESS) ok.push_back(results[static_cast<size_t>(i)]);
  return ok;
}

std::string algo_name(const cublasLtMatmulAlgo_t& a) {
  return cat("cublasLt algo ", algo_attr<int32_t>(a, CUBLASLT_ALGO_CONFIG_ID), " tile ",
             algo_attr<uint32_t>(a, CUBLASLT_ALGO_CONFIG_TILE_ID), " stages ",
             algo_attr<uint32_t>(a, CUBLASLT_ALGO_CONFIG_STAGES_ID), " splitk ",
             algo_attr<int32_t>(a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM), " red ",
             algo_attr<uint32_t>(a, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME), " swizzle ",
             algo_attr<uint32_t>(a, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING), " custom ",
             algo_attr<uint32_t>(a, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION), " cluster ",
             algo_attr<uint16_t>(a, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID));
}

}  // namespace lt

LinearOp::LinearOp(cublasLtHandle_t handle, DType dt, int m, int k, int n, bool has_bias, Activation act,
                   bool allow_tf32, std::optional<DType> out_dt, bool has_residual)
    : LtGemm(handle, "linear"), dt_(dt), out_dt_(out_dt.value_or(dt)), m_(m), k_(k), n_(n),
      has_bias_(has_bias), has_residual_(has_residual), act_(act), post_act_(Activation::None) {
  if (m < 1 || k < 1 || n < 1) fail_runtime("cuda linear: invalid shape m=", m, " k=", k, " n=", n);
  if (out_dt_ != dt && !(out_dt_ == DType::F32 && (dt == DType::F16 || dt == DType::BF16)))
    fail_runtime("cuda linear: ", dtype_name(dt), " inputs with ", dtype_name(out_dt_), " output (only 16-bit inputs with f32 output mix)");
  const cudaDataType_t t = lt::data_type(dt), td = lt::data_type(out_dt_);
  const cublasComputeType_t compute =
      dt == DType::F32 && allow_tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  try {
    KILN_CUBLAS_CHECK(cublasLtMatmulDescCreate(&op_, compute, CUDA_R_32F));
    const cublasOperation_t trans_a = CUBLAS_OP_T, trans_b = CUBLAS_OP_N;
    KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op_, CUBLASLT_MATMUL_DESC_TRANSA, &trans_a, sizeof(trans_a)));
    KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op_, CUBLASLT_MATMUL_DESC_TRANSB, &trans_b, sizeof(trans_b)));

    // Only ReLU has an epilogue among kiln's activations; the rest follow as a kernel.
    // Order: cuBLASLt computes D = epilogue(alpha op(A) op(B) + beta C), its
    // BIAS epilogue adding the bias "before applying final postprocessing" and
    // RELU_BIAS "apply Bias and then ReLu transform" (cublasLt.h, cublasLtEpilogue_t;
    // nvmath-python documents cuBLASLt's matmul as F(alpha a @ b + beta c) with
    // F the epilog): relu(x W^T + residual + bias), what a conv's fused
    // epilogue computes (act(conv + bias + residual)). CudaGemmConv.* checks it.
    cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_DEFAULT;
    if (act == Activation::Relu) epi = has_bias ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_RELU;
    else if (has_bias) epi = CUBLASLT_EPILOGUE_BIAS;
    if (act != Activation::None && act != Activation::Relu) post_act_ = act;
    KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op_, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
    if (has_bias) {
      // The bias has the output type (f16 bias for f16 output, f32 for the
      // mixed product): cuBLASLt's default for non-fp8, non-integer kernels, stated explicitly.
      const int32_t bias_type = td;
      KILN_CUBLAS_CHECK(
          cublasLtMatmulDescSetAttribute(op_, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof(bias_type)));
      // The heuristic reads the bias pointer's alignment; a stand-in with the
      // 16-byte alignment run() guarantees keeps the chosen algorithms valid.
      const void* stand_in = reinterpret_cast<const void*>(uintptr_t(16));
      KILN_CUBLAS_CHECK(
          cublasLtMatmulDescSetAttribute(op_, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &stand_in, sizeof(stand_in)));
    }

    KILN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&a_, t, k, n, k));
    KILN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&b_, t, k, m, k));
    KILN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d_, td, n, m, n));
    if (has_residual) KILN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&c_, td, n, m, n));  // C beside D, D's layout

    algos_ = lt::heuristic_algos(handle_, op_, a_, b_, d_, {16, 16, 16}, kMaxTactics, c_);
    if (algos_.empty())
      fail_runtime("cuda linear: cuBLASLt offers no algorithm for ", dtype_name(dt), out_dt_ != dt ? " to f32" : "", " m=", m, " k=", k, " n=", n,
                   has_bias ? " with bias" : "", has_residual ? " with residual" : "", " act ", activation_name(act));
  } catch (...) {
    release();  // the destructor does not run for a constructor that throws
    throw;
  }
}

void LtGemm::release() {
  if (c_) cublasLtMatrixLayoutDestroy(c_);
  if (d_) cublasLtMatrixLayoutDestroy(d_);
  if (b_) cublasLtMatrixLayoutDestroy(b_);
  if (a_) cublasLtMatrixLayoutDestroy(a_);
  if (op_) cublasLtMatmulDescDestroy(op_);
  c_ = d_ = b_ = a_ = nullptr;
  op_ = nullptr;
}

std::string LtGemm::tactic_name(int i) const {
  if (i < 0 || i >= tactic_count()) fail_runtime("cuda ", what_, ": tactic ", i, " of ", tactic_count());
  return lt::algo_name(algos_[size_t(i)].algo);
}

void LtGemm::select(int i) {
  if (i < 0 || i >= tactic_count()) fail_runtime("cuda ", what_, ": tactic ", i, " of ", tactic_count());
  selected_ = i;
}

size_t LtGemm::workspace_bytes() const { return algos_[size_t(selected_)].workspaceSize; }

void LinearOp::run(const void* x, const void* w, const void* bias, void* y, void* workspace, size_t workspace_size,
                   cudaStream_t s, const void* residual) const {
  const auto misaligned = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) != 0; };
  if (misaligned(x) || misaligned(w) || misaligned(y) || (has_bias_ && misaligned(bias)) || misaligned(residual))
    fail_runtime("cuda linear: x, w, bias, residual and y must be 16-byte aligned");
  if (has_bias_ && bias == nullptr) fail_runtime("cuda linear: layer has a bias but none was passed");
  if (has_residual_ != (residual != nullptr) || (residual && residual == y))
    fail_runtime("cuda linear: ", has_residual_ ? "a residual apart from y" : "no residual", " expected");
  const cublasLtMatmulHeuristicResult_t& h = algos_[size_t(selected_)];
  if (workspace_size < h.workspaceSize)
    fail_runtime("cuda linear: tactic needs ", h.workspaceSize, " bytes of workspace, got ", workspace_size);
  // beta 1 with C = residual adds it (an out-of-place C: cuBLASLt reads C, writes D).
  const float alpha = 1.f, beta = has_residual_ ? 1.f : 0.f;
  const void* c = has_residual_ ? residual : y;
  {
    std::lock_guard<std::mutex> lock(run_mutex_);
    if (has_bias_)
      KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op_, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
    KILN_CUBLAS_CHECK(cublasLtMatmul(handle_, op_, &alpha, w, a_, x, b_, &beta, c, c_ ? c_ : d_, y, d_, &h.algo,
                                     h.workspaceSize ? workspace : nullptr, h.workspaceSize, s));
  }
  if (post_act_ != Activation::None) activation(y, y, out_dt_, int64_t(m_) * n_, post_act_, s);
}

// MatMulOp. Row-major y = a · b is column-major y^T = b^T · a^T: with b seen
// column-major as [n, k] (ld n), a as [k, m] (ld k) and y as [n, m] (ld n),
// D = B_col · A_col with no transposes; batches are strided layouts.
namespace {

void set_batch(cublasLtMatrixLayout_t l, int64_t batch, int64_t stride) {
  const int32_t count = static_cast<int32_t>(batch);
  KILN_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)));
  KILN_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)));
}

// The largest power of two <= 16 dividing the byte offset between products.
uint32_t stride_alignment(int64_t batch, int64_t stride, size_t elem) {
  if (batch <= 1 || stride == 0) return 16;
  const uint64_t bytes = static_cast<uint64_t>(stride) * elem;
  uint32_t a = 16;
  while (a > 1 && bytes % a) a /= 2;
  return a;
}

}  // namespace

MatMulOp::MatMulOp(cublasLtHandle_t handle, DType dt, int64_t batch, int m, int k, int n, int64_t a_stride,
                   int64_t b_stride, bool allow_tf32)
    : LtGemm(handle, "matmul") {
  if (batch < 1 || m < 1 || k < 1 || n < 1 || batch > INT32_MAX)
    fail_runtime("cuda matmul: invalid shape batch=", batch, " m=", m, " k=", k, " n=", n);
  const cudaDataType_t t = lt::data_type(dt);
  const cublasComputeType_t compute = dt == DType::F32 && allow_tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  // (the LtGemm destructor frees what was made when this throws)
  KILN_CUBLAS_CHECK(cublasLtMatmulDescCreate(&op_, compute, CUDA_R_32F));
  const cublasOperation_t none = CUBLAS_OP_N;
  KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op_, CUBLASLT_MATMUL_DESC_TRANSA, &none, sizeof(none)));
  KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op_, CUBLASLT_MATMUL_DESC_TRANSB, &none, sizeof(none)));
  KILN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&a_, t, n, k, n));  // the IR's b
  KILN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&b_, t, k, m, k));  // the IR's a
  KILN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d_, t, n, m, n));
  if (batch > 1) {
    set_batch(a_, batch, b_stride);
    set_batch(b_, batch, a_stride);
    set_batch(d_, batch, int64_t(m) * n);
  }
  const size_t es = dtype_size(dt);
  const uint32_t align[3] = {stride_alignment(batch, b_stride, es), stride_alignment(batch, a_stride, es),
                             stride_alignment(batch, int64_t(m) * n, es)};
  algos_ = lt::heuristic_algos(handle_, op_, a_, b_, d_, align, LinearOp::kMaxTactics);
  if (algos_.empty())
    fail_runtime("cuda matmul: cuBLASLt offers no algorithm for ", dtype_name(dt), " batch=", batch, " m=", m, " k=", k,
                 " n=", n, " strides ", a_stride, "/", b_stride);
}

void LtGemm::enqueue(const void* a, const void* b, void* d, void* workspace, size_t workspace_size, cudaStream_t s) const {
  const auto misaligned = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) != 0; };
  if (misaligned(a) || misaligned(b) || misaligned(d)) fail_runtime("cuda ", what_, ": operands must be 16-byte aligned");
  const cublasLtMatmulHeuristicResult_t& h = algos_[size_t(selected_)];
  if (workspace_size < h.workspaceSize)
    fail_runtime("cuda ", what_, ": tactic needs ", h.workspaceSize, " bytes of workspace, got ", workspace_size);
  const float alpha = 1.f, beta = 0.f;
  const int32_t ialpha = 1, ibeta = 0;
  KILN_CUBLAS_CHECK(cublasLtMatmul(handle_, op_, int_scalars_ ? static_cast<const void*>(&ialpha) : &alpha, a, a_, b, b_,
                                   int_scalars_ ? static_cast<const void*>(&ibeta) : &beta, d, d_, d, d_, &h.algo,
                                   h.workspaceSize ? workspace : nullptr, h.workspaceSize, s));
}

void MatMulOp::run(const void* a, const void* b, void* y, void* workspace, size_t workspace_size, cudaStream_t s) const {
  // No per-call descriptor state (unlike LinearOp's bias pointer): no lock needed.
  enqueue(b, a, y, workspace, workspace_size, s);  // column-major: the IR's b is cuBLASLt's A
}

Fp8GemmOp::Fp8GemmOp(cublasLtHandle_t handle, int m, int k, int n, DType code)
    : LtGemm(handle, code == DType::I8 ? "int8 gemm" : "fp8 gemm") {
  if (code != DType::F8E4M3 && code != DType::I8) fail_runtime("cuda 8-bit gemm: codes of ", dtype_name(code));
  const bool i8 = code == DType::I8;
  if (m < 1 || k < 1 || n < 1) fail_runtime("cuda ", what_, ": invalid shape m=", m, " k=", k, " n=", n);
  if (k % 16 || n % 16) fail_runtime("cuda ", what_, ": k=", k, " and n=", n, " must be multiples of 16 (pad them)");
  int_scalars_ = i8;
  // e4m3: f32 compute and output (cuBLASLt's FP8 table has C f32 -> D f32 for
  // e4m3 x e4m3). i8: exact int32 sums (products of two i8 codes are at most
  // 2^14, and a quantized layer's reduction is below 2^17, quant::kMaxExactReduction).
  const cudaDataType_t ab = i8 ? CUDA_R_8I : CUDA_R_8F_E4M3, dt = i8 ? CUDA_R_32I : CUDA_R_32F;
  // (the LtGemm destructor frees what was made when this throws)
  KILN_CUBLAS_CHECK(cublasLtMatmulDescCreate(&op_, i8 ? CUBLAS_COMPUTE_32I : CUBLAS_COMPUTE_32F, dt));
  const cublasOperation_t trans_a = CUBLAS_OP_T, trans_b = CUBLAS_OP_N;
  KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op_, CUBLASLT_MATMUL_DESC_TRANSA, &trans_a, sizeof(trans_a)));
  KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op_, CUBLASLT_MATMUL_DESC_TRANSB, &trans_b, sizeof(trans_b)));
  if (!i8) {
    const int8_t fast_accum = 0;  // the default, stated: FP8 partial sums are promoted to f32
    KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op_, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast_accum, sizeof(fast_accum)));
  }
  KILN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&a_, ab, k, n, k));  // W
  KILN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&b_, ab, k, m, k));  // x
  KILN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d_, dt, n, m, n));
  algos_ = lt::heuristic_algos(handle_, op_, a_, b_, d_, {16, 16, 16}, kMaxTactics);
  if (algos_.empty())
    fail_runtime("cuda ", what_, ": cuBLASLt offers no ", i8 ? "i8 x i8 -> i32" : "e4m3 x e4m3 -> f32", " algorithm for m=", m,
                 " k=", k, " n=", n);
}

void Fp8GemmOp::run(const void* x, const void* w, float* d, void* workspace, size_t workspace_size, cudaStream_t s) const {
  enqueue(w, x, d, workspace, workspace_size, s);  // A = W, B = x (TN)
}

}  // namespace kiln::cuda
