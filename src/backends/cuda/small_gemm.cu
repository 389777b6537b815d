// A small linear in one launch (kernels.hpp, small_gemm): y = act(x w^T + b)
// for 16-bit x [m, k], w [n, k] (the IR's linear layout), b [n], f32 sums.
//
// Why our own kernel (switch small_gemm; auto: the shapes small_gemm_preferred names): RT-DETR's
// decoder and AIFI run ~25 linears a call of 300-400 rows, k 256-512, whose
// work is far below a microsecond, yet each cuBLASLt launch costs 3.2-4.4 us
// in the graph (H100, session 26: 40 GEMMs, 156 us of a 731 us trace) - launch,
// ramp and a gap before it, since a library kernel cannot take part in
// programmatic dependent launch. This kernel stages its block's whole weight
// panel in shared memory with cp.async *before* the PDL wait (the weights
// are constants), so under PDL only the activation rows are loaded after the
// kernel before it ends.
//
// A block computes a kTileM x 64 tile of y with 4 warps and f32 accumulators
// (mma.sync m16n8k16): tile 64 x 64 as 2 x 2 warps of 32 x 32, or tile 16 x
// 64 as 1 x 4 warps of 16 x 16. The block's rows of x and 64 rows of w, all of
// k, sit in shared memory (rows padded by 16 bytes so the ldmatrix reads of 8
// rows hit distinct banks), so k <= kMaxSmallGemmK. The 16-row tile makes
// four times the blocks and loads a quarter of the rows after the PDL wait:
// RT-DETR's 300-row linears make 19 x 4 blocks (cuBLASLt's choice there is a
// 16 x 64 tile too) instead of 5 x 4. Session 27 (H100, engine trace): the
// 64 x 64 tile took 3.9-4.1 us a linear in the graph against cuBLASLt's
// 3.0-3.6.
#include <algorithm>

#include "backends/cuda/cuda_check.hpp"
#include "backends/cuda/device_common.cuh"
#include "backends/cuda/kernels.hpp"
#include "backends/cuda/norm_row.cuh"

namespace kiln::cuda {

namespace {

constexpr int kTileN = 64, kWarpsGemm = 4;

using dev::cp_async16;
using dev::ldmatrix_x4;

// Rows [r0, r0 + kRows) of a [rows, k] matrix into a shared [kRows][ld] tile.
template <int kRows, typename T>
__device__ __forceinline__ void stage_rows(T* tile, int ld, const T* src, int rows, int r0, int k) {
  const int per_row = k / 8;  // 16-byte pieces
  for (int i = threadIdx.x; i < kRows * per_row; i += blockDim.x) {
    const int r = i / per_row, c = (i % per_row) * 8;
    const bool valid = r0 + r < rows;
    cp_async16(tile + r * ld + c, src + (int64_t(valid ? r0 + r : 0) * k + c), valid);
  }
}

template <typename T, int kTileM, Activation A>
__global__ void __launch_bounds__(kWarpsGemm * 32) small_gemm_kernel(const T* __restrict__ x, const T* __restrict__ w,
                                                                     const T* __restrict__ b, T* __restrict__ y, int m,
                                                                     int n, int k) {
  constexpr int kWarpsM = kTileM >= 64 ? 2 : 1, kWarpsN = kWarpsGemm / kWarpsM;
  constexpr int kMi = kTileM / kWarpsM / 16, kNj = kTileN / kWarpsN / 8;  // m16 and n8 tiles a warp
  static_assert(kMi >= 1 && kNj >= 2 && kNj % 2 == 0, "tile shape");
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int ld = k + 8;
  T* xs = reinterpret_cast<T*>(smem_raw);
  T* ws = xs + kTileM * ld;
  const int m0 = blockIdx.x * kTileM, n0 = blockIdx.y * kTileN;
  // The weights are constants: their panel is requested before the wait for
  // the kernel before this one.
  stage_rows<kTileN>(ws, ld, w, n, n0, k);
  dev::cp_async_commit();
  dev::enter_grid();
  stage_rows<kTileM>(xs, ld, x, m, m0, k);
  dev::cp_async_commit();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gid = lane >> 2, tig = lane & 3;
  const int wm = (warp / kWarpsN) * (kMi * 16), wn = (warp % kWarpsN) * (kNj * 8);  // this warp's part of the tile
  float bias[kNj][2];
#pragma unroll
  for (int j = 0; j < kNj; ++j)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int col = n0 + wn + j * 8 + tig * 2 + e;
      bias[j][e] = b && col < n ? dev::to_f32(b[col]) : 0.f;
    }
  dev::cp_async_wait<0>();
  __syncthreads();
  float acc[kMi][kNj][4] = {};
  // ldmatrix row addresses: A (16 x 16 at rows wm + 16 i): lanes 0-15 rows 0-15
  // at k, lanes 16-31 the same rows at k + 8; B (two n8 tiles x k16 at wn +
  // 16 p): lanes 0-7 n 0-7 at k, 8-15 n 0-7 at k + 8, 16-23 n 8-15 at k,
  // 24-31 n 8-15 at k + 8.
  const T* a_row = xs + (wm + (lane & 15)) * ld + (lane >> 4) * 8;
  const T* b_row = ws + (wn + (lane & 7) + (lane >> 4) * 8) * ld + ((lane >> 3) & 1) * 8;
  for (int kk = 0; kk < k; kk += 16) {
    uint32_t a[kMi][4], bb[kNj / 2][4];
#pragma unroll
    for (int i = 0; i < kMi; ++i) ldmatrix_x4(a[i], a_row + i * 16 * ld + kk);
#pragma unroll
    for (int p = 0; p < kNj / 2; ++p) ldmatrix_x4(bb[p], b_row + p * 16 * ld + kk);
#pragma unroll
    for (int i = 0; i < kMi; ++i)
#pragma unroll
      for (int j = 0; j < kNj; ++j) dev::mma16816<T>(acc[i][j], a[i], bb[j >> 1][(j & 1) * 2], bb[j >> 1][(j & 1) * 2 + 1]);
  }
#pragma unroll
  for (int i = 0; i < kMi; ++i)
#pragma unroll
    for (int j = 0; j < kNj; ++j) {
      const int col = n0 + wn + j * 8 + tig * 2;
      if (col >= n) continue;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = m0 + wm + i * 16 + gid + 8 * h;
        if (row >= m) continue;
        float v0 = acc[i][j][2 * h] + bias[j][0], v1 = acc[i][j][2 * h + 1] + bias[j][1];
        if constexpr (A == Activation::Relu) v0 = fmaxf(v0, 0.f), v1 = fmaxf(v1, 0.f);
        if constexpr (A == Activation::Gelu) {  // on the product as stored, as the unfused activation step
          v0 = dev::act<A>(dev::to_f32(dev::from_f32<T>(v0)));
          v1 = dev::act<A>(dev::to_f32(dev::from_f32<T>(v1)));
        }
        *reinterpret_cast<uint32_t*>(y + int64_t(row) * n + col) = dev::pack2<T>(v0, v1);
      }
    }
}

template <typename T, int kTileM>
void launch_small_gemm(const T* x, const T* w, const T* b, T* y, int m, int n, int k, Activation act, cudaStream_t stream) {
  static const bool opted = [] {
    const int bytes = int(size_t(kTileM + kTileN) * (kMaxSmallGemmK + 8) * sizeof(T));
    for (auto* kernel : {small_gemm_kernel<T, kTileM, Activation::None>, small_gemm_kernel<T, kTileM, Activation::Relu>,
                         small_gemm_kernel<T, kTileM, Activation::Gelu>})
      KILN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
    return true;
  }();
  (void)opted;
  const size_t smem = size_t(kTileM + kTileN) * size_t(k + 8) * sizeof(T);
  const dim3 grid(unsigned((m + kTileM - 1) / kTileM), unsigned((n + kTileN - 1) / kTileN));
  auto* kernel = act == Activation::Relu   ? small_gemm_kernel<T, kTileM, Activation::Relu>
                 : act == Activation::Gelu ? small_gemm_kernel<T, kTileM, Activation::Gelu>
                                           : small_gemm_kernel<T, kTileM, Activation::None>;
  detail::launch("small_gemm", kernel, grid, kWarpsGemm * 32, smem, stream, x, w, b, y, m, n, k);
}

// small_gemm_norm: a post-norm's projection and its norm in one launch,
// y = layer_norm(T(T(x w^T + b) + res)) (+ y + pos, + f32(y)), what RT-DETR's
// out_proj / output_proj, residual add and layer norm compute as three steps
// (two launches: the add runs inside the norm's, plan_norm_adds). A block owns
// 16 whole rows of y, so the norm needs no other block: its warps split the n
// columns (8 * kNj each) over all of k, the rows z = T(T(product) + res) go to
// shared memory, and each warp then runs layer_norm_rows' own row code
// (norm_row.cuh) on rows of it. The whole weight matrix [n, k] is staged in
// shared memory before the PDL wait (it is a constant), so under PDL only the
// block's 16 rows of x and its residual rows are read after the kernel before
// it ends. Why not mlp_chain's norm form: that is a cluster launch whose
// blocks hand rows over distributed shared memory, ~6 us before its first
// layer (mlp_chain.cu); this is one plain block per 16 rows.
template <typename T, int kNj>
__global__ void __launch_bounds__(512) small_gemm_norm_kernel(const T* __restrict__ x, const T* __restrict__ w,
                                                              const T* __restrict__ b, LayerNormIo io, int m, int n, int k,
                                                              float eps, bool relu) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  constexpr int kRows = 16;
  const int ld = k + 8, ldz = n + 8;
  T* ws = reinterpret_cast<T*>(smem_raw);
  T* xs = ws + n * ld;
  T* zs = xs + kRows * ld;
  const int m0 = blockIdx.x * kRows;
  {
    const int per_row = k / 8;
    for (int i = threadIdx.x; i < n * per_row; i += blockDim.x) {
      const int r = i / per_row, c = (i % per_row) * 8;
      cp_async16(ws + r * ld + c, w + int64_t(r) * k + c, true);
    }
  }
  dev::cp_async_commit();
  dev::enter_grid();
  stage_rows<kRows>(xs, ld, x, m, m0, k);
  dev::cp_async_commit();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gid = lane >> 2, tig = lane & 3;
  const int wn = warp * (kNj * 8);  // this warp's columns
  const T* res = static_cast<const T*>(io.x2);
  float bias[kNj][2];
  uint32_t rv[kNj][2];  // the residual's pairs at (row gid + 8 h, column wn + 8 j + 2 tig)
#pragma unroll
  for (int j = 0; j < kNj; ++j) {
    const int col = wn + j * 8 + tig * 2;
    bias[j][0] = b ? dev::to_f32(b[col]) : 0.f;
    bias[j][1] = b ? dev::to_f32(b[col + 1]) : 0.f;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = m0 + gid + 8 * h;
      rv[j][h] = row < m ? dev::ld32(res + int64_t(row) * n + col) : 0u;
    }
  }
  dev::cp_async_wait<0>();
  __syncthreads();
  float acc[kNj][4] = {};
  const T* a_row = xs + (lane & 15) * ld + (lane >> 4) * 8;
  const T* b_row = ws + (wn + (lane & 7) + (lane >> 4) * 8) * ld + ((lane >> 3) & 1) * 8;
  for (int kk = 0; kk < k; kk += 16) {
    uint32_t a[4], bb[kNj / 2][4];
    ldmatrix_x4(a, a_row + kk);
#pragma unroll
    for (int p = 0; p < kNj / 2; ++p) ldmatrix_x4(bb[p], b_row + p * 16 * ld + kk);
#pragma unroll
    for (int j = 0; j < kNj; ++j) dev::mma16816<T>(acc[j], a, bb[j >> 1][(j & 1) * 2], bb[j >> 1][(j & 1) * 2 + 1]);
  }
  // z = T(T(product + bias) + residual), as the linear and the add steps store them.
#pragma unroll
  for (int j = 0; j < kNj; ++j) {
    const int col = wn + j * 8 + tig * 2;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float v0 = acc[j][2 * h] + bias[j][0], v1 = acc[j][2 * h + 1] + bias[j][1];
      if (relu) v0 = fmaxf(v0, 0.f), v1 = fmaxf(v1, 0.f);
      T r2[2];
      *reinterpret_cast<uint32_t*>(r2) = rv[j][h];
      const float z0 = dev::to_f32(dev::from_f32<T>(v0)) + dev::to_f32(r2[0]);
      const float z1 = dev::to_f32(dev::from_f32<T>(v1)) + dev::to_f32(r2[1]);
      *reinterpret_cast<uint32_t*>(zs + (gid + 8 * h) * ldz + col) = dev::pack2<T>(z0, z1);
    }
  }
  __syncthreads();
  const int warps = blockDim.x >> 5;
  const T* lw = static_cast<const T*>(io.weight);
  const T* lb = static_cast<const T*>(io.bias);
  const T* pos = static_cast<const T*>(io.pos);
  for (int r = warp; r < kRows; r += warps) {
    const int64_t row = m0 + r;
    if (row >= m) break;
    const int64_t base = row * n;
    dev::layer_norm_row_vec<T, 1>(zs + r * ldz, nullptr, lw, lb, static_cast<T*>(io.y) + base, io.y_pos ? pos + base : nullptr,
                                  io.y_pos ? static_cast<T*>(io.y_pos) + base : nullptr, io.y_f32 ? io.y_f32 + base : nullptr, n,
                                  eps, lane);
  }
}

int small_gemm_norm_nj(int n) { return n >= 128 && n % 32 == 0 ? 4 : 2; }

size_t small_gemm_norm_smem(int n, int k, size_t elem) {
  return (size_t(n + 16) * size_t(k + 8) + size_t(16) * size_t(n + 8)) * elem;
}

template <typename T, int kNj>
void launch_small_gemm_norm(const T* x, const T* w, const T* b, const LayerNormIo& io, int m, int n, int k, bool relu,
                            float eps, cudaStream_t stream) {
  static const bool opted = [] {
    const int bytes = int(small_gemm_norm_smem(kMaxSmallGemmNormWidth, kMaxSmallGemmNormK, sizeof(T)));
    KILN_CUDA_CHECK(cudaFuncSetAttribute(small_gemm_norm_kernel<T, kNj>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
    return true;
  }();
  (void)opted;
  const int warps = n / (8 * kNj);
  detail::launch("small_gemm_norm", small_gemm_norm_kernel<T, kNj>, dim3(unsigned((m + 15) / 16)), 32 * warps,
                 small_gemm_norm_smem(n, k, sizeof(T)), stream, x, w, b, io, m, n, k, eps, relu);
}

}  // namespace

std::string small_gemm_unsupported(DType dt, int64_t m, int n, int k, Activation act) {
  if (dt != DType::F16 && dt != DType::BF16) return cat("dtype ", dtype_name(dt), " (f16 or bf16)");
  if (m <= 0 || m > kMaxSmallGemmRows) return cat("m ", m, " (1 to ", kMaxSmallGemmRows, " rows)");
  if (k <= 0 || k % 16 || k > kMaxSmallGemmK) return cat("k ", k, " (a multiple of 16 up to ", kMaxSmallGemmK, ")");
  if (n <= 0 || n % 8) return cat("n ", n, " (a multiple of 8)");
  if (act != Activation::None && act != Activation::Relu && act != Activation::Gelu)
    return cat("activation ", activation_name(act), " (none, ReLU or GELU)");
  return "";
}

// Session 27, H100, RT-DETR r18vd at batch 1 (bench/results/2026-12-06-session27, call 3): per
// linear, the time it adds to the graph's call, small_gemm (16 x 64) against cuBLASLt: 300 rows
// with n 256-512 and k 256 (out_proj, output_proj, the merged q/k and the sampling offsets and
// weights) 2.1-2.6 against 3.0-3.7 us; n 1024 with ReLU (fc1) 5.2-6.5 against 3.7-3.8; n 80
// (class_embed) 3.5 against 3.1. The probe (a replayed graph of four dependent launches) agrees
// and adds k 512 (4.0 against 3.5) and 2400 rows (8.0 against 3.5). With every linear it takes
// (switch on), the engine went 0.652 -> 0.639 ms.
// GELU (session 28): cuBLASLt has no exact (erf) GELU epilogue, so its linear
// is two launches (the GEMM, then the activation kernel: 3.6 + 2.6 us for
// AIFI's fc1, 400 x 1024 x 256, in session 27's trace); small_gemm applies it
// in its epilogue (~4.6 us a launch at n 1024 in the probe). Not preferred
// yet: the epilogue has not run on a GPU (session 28 got no device time); the
// candidate rule once it has: up to n 1024 under GELU.
bool small_gemm_preferred(int64_t m, int n, int k, Activation act) {
  (void)act;
  return m <= 1024 && n >= 128 && n <= 512 && k <= 256;
}

void small_gemm(const void* x, const void* w, const void* b, void* y, DType dt, int m, int n, int k, Activation act,
                cudaStream_t stream, int tile_m) {
  if (m <= 0 || n <= 0) return;
  if (const std::string why = small_gemm_unsupported(dt, m, n, k, act); !why.empty()) fail_runtime("cuda small_gemm: ", why);
  if (!detail::aligned16(x) || !detail::aligned16(w) || !detail::aligned16(y))
    fail_runtime("cuda small_gemm: operands not 16-byte aligned");
  if (tile_m == 0) tile_m = 16;
  if (tile_m != 16 && tile_m != 64) fail_runtime("cuda small_gemm: tile_m ", tile_m, " (16 or 64)");
  detail::dispatch_float(dt, "small_gemm", [&](auto t) {
    using T = decltype(t);
    if constexpr (!std::is_same_v<T, float>) {
      auto* xt = static_cast<const T*>(x);
      auto* wt = static_cast<const T*>(w);
      auto* bt = static_cast<const T*>(b);
      auto* yt = static_cast<T*>(y);
      if (tile_m == 16)
        launch_small_gemm<T, 16>(xt, wt, bt, yt, m, n, k, act, stream);
      else
        launch_small_gemm<T, 64>(xt, wt, bt, yt, m, n, k, act, stream);
    }
  });
}

std::string small_gemm_norm_unsupported(DType dt, int64_t m, int n, int k, Activation act) {
  if (dt != DType::F16 && dt != DType::BF16) return cat("dtype ", dtype_name(dt), " (f16 or bf16)");
  if (m <= 0 || m > kMaxSmallGemmRows) return cat("m ", m, " (1 to ", kMaxSmallGemmRows, " rows)");
  if (k <= 0 || k % 16 || k > kMaxSmallGemmNormK) return cat("k ", k, " (a multiple of 16 up to ", kMaxSmallGemmNormK, ")");
  if (n <= 0 || n % 16 || n > kMaxSmallGemmNormWidth)
    return cat("n ", n, " (a multiple of 16 up to ", kMaxSmallGemmNormWidth, ")");
  if (act != Activation::None && act != Activation::Relu) return cat("activation ", activation_name(act), " (none or ReLU)");
  return "";
}

void small_gemm_norm(const void* x, const void* w, const void* b, DType dt, int m, int n, int k, Activation act,
                     const LayerNormIo& io, float eps, cudaStream_t stream) {
  if (m <= 0) return;
  if (const std::string why = small_gemm_norm_unsupported(dt, m, n, k, act); !why.empty())
    fail_runtime("cuda small_gemm_norm: ", why);
  if (!io.x2 || !io.y || (io.y_pos && !io.pos)) fail_runtime("cuda small_gemm_norm: no residual, output or position rows");
  for (const void* p : {x, w, io.x2, io.weight, io.bias, static_cast<const void*>(io.y), io.pos,
                        static_cast<const void*>(io.y_pos), static_cast<const void*>(io.y_f32)})
    if (p && !detail::aligned16(p)) fail_runtime("cuda small_gemm_norm: operands not 16-byte aligned");
  const bool relu = act == Activation::Relu;
  detail::dispatch_float(dt, "small_gemm_norm", [&](auto t) {
    using T = decltype(t);
    if constexpr (!std::is_same_v<T, float>) {
      auto* xt = static_cast<const T*>(x);
      auto* wt = static_cast<const T*>(w);
      auto* bt = static_cast<const T*>(b);
      if (small_gemm_norm_nj(n) == 4)
        launch_small_gemm_norm<T, 4>(xt, wt, bt, io, m, n, k, relu, eps, stream);
      else
        launch_small_gemm_norm<T, 2>(xt, wt, bt, io, m, n, k, relu, eps, stream);
    }
  });
}

}  // namespace kiln::cuda
