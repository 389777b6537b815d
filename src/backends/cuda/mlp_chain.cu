// A chain of small linear layers in one launch (linear.cpp, plan_mlp_chains):
// y = L_n(... act(L_1(x))), every intermediate row kept in shared memory.
//
// Why our own kernel: RT-DETR's decoder runs, per layer and query row block,
// MLPs of 300 rows (batch 1) through 2-3 layers of width <= 512 (the query
// position head 4 -> 512 -> 256, the box head 256 -> 256 -> 256 -> 4). Each
// cuBLASLt launch of such a GEMM costs ~3.3 us on an H100 whatever its tile
// (in-graph CUPTI trace, session 21), almost all of it launch ramp and tail;
// cuBLASLt has no multi-GEMM chain, and its grouped GEMM cannot feed one
// product into the next. Here one launch runs the chain: a block takes 16
// rows, each layer is a warp-level tensor-core product (mma.sync m16n8k16,
// f32 sums) whose result, bias added, activation applied and rounded to the
// storage type exactly where the unfused graph stores it, is the next layer's
// input in shared memory. So the numbers equal the unfused chain up to the
// order of the f32 sums.
//
// Weights are packed at build in fragment order (mlp_chain_pack): for output
// tile t (8 columns) and k pair p (32 columns of K), lane L holds the four
// 32-bit B fragments of two mma K steps in 16 consecutive bytes, so a warp
// reads 512 contiguous bytes per load. A cluster of `cluster` blocks shares
// one 16-row block: each computes a share of every layer's columns and writes
// them into every member's shared memory (distributed shared memory), so each
// SM reads 1/cluster of the weights — what bounds a 300-row chain.
#include <cooperative_groups.h>

#include <algorithm>

#include "backends/cuda/cuda_check.hpp"

#include "backends/cuda/device_common.cuh"
#include "backends/cuda/kernels.hpp"

namespace kiln::cuda {

namespace {

namespace cg = cooperative_groups;

constexpr int kRows = 16;       // rows per block (one mma M)
constexpr int kWarps = 8;       // warps per block
constexpr int kPairBatch = 16;  // k pairs whose weights a warp loads before using them (K 512: one round trip)

struct ChainArgs {
  const uint4* w[kMaxMlpChain];
  const float* b[kMaxMlpChain];
  int k_pad[kMaxMlpChain];  // multiple of 32
  int n[kMaxMlpChain];
  int n_pad[kMaxMlpChain];  // multiple of 8; the next layer's k_pad for all but the last
  unsigned relu = 0;        // bit l: ReLU after layer l
  unsigned gelu = 0;        // bit l: GELU (erf) after layer l, on the value rounded to T as the unfused step's
  int layers = 0;
  int ld = 0;               // shared row length in elements (max k_pad + 8)
  // norm (io.x2, the residual, set): the last layer's rows go through the
  // residual add and the layer norm (MlpChainNorm, kernels.hpp) instead of to y.
  MlpChainNorm norm;
  // sum.y set (no norm): also T(f32(y) + f32(sum.add_to)) (MlpChainSum).
  MlpChainSum sum;
  // refine.layer >= 0: that layer's rows are RT-DETR's box refinement
  // (MlpChainRefine, kernels.hpp) before they go on to the next layer.
  MlpChainRefine refine;
};

// Cluster-wide barrier (all blocks' shared writes visible), or the block's.
template <int CL>
__device__ __forceinline__ void chain_sync() {
  if constexpr (CL > 1) cg::this_cluster().sync();
  else __syncthreads();
}

// One row of the fused layer norm (a warp): z (the summed row in shared
// memory, n wide) -> y[r], y_pos[r], y_f32[r]; f32 statistics (mean, then the
// squared deviations), biased variance, as layer_norm_rows.
template <typename T>
__device__ void norm_row(const T* z, int n, int64_t r, T* y, const MlpChainNorm& nm, int lane) {
  float sum = 0.f;
  for (int c = lane; c < n; c += 32) sum += dev::to_f32(z[c]);
  const float mean = dev::warp_sum(sum) / float(n);
  float q = 0.f;
  for (int c = lane; c < n; c += 32) {
    const float d = dev::to_f32(z[c]) - mean;
    q += d * d;
  }
  const float inv = 1.f / sqrtf(dev::warp_sum(q) / float(n) + nm.eps);
  const T* w = static_cast<const T*>(nm.io.weight);
  const T* b = static_cast<const T*>(nm.io.bias);
  const T* pos = static_cast<const T*>(nm.io.pos);
  T* y_pos = static_cast<T*>(nm.io.y_pos);
  float* y_f32 = nm.io.y_f32;
  for (int c = lane; c < n; c += 32) {
    float o = (dev::to_f32(z[c]) - mean) * inv;
    if (w) o *= dev::to_f32(w[c]);
    if (b) o += dev::to_f32(b[c]);
    const T out = dev::from_f32<T>(o);
    y[r * n + c] = out;
    if (y_pos) y_pos[r * n + c] = dev::from_f32<T>(dev::to_f32(out) + dev::to_f32(pos[r * n + c]));
    if (y_f32) y_f32[r * n + c] = dev::to_f32(out);
  }
}

template <typename T, int CL>
__global__ void __launch_bounds__(kWarps * 32) mlp_chain_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t rows, int k0,
                                                                 bool vec, ChainArgs a) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* buf0 = reinterpret_cast<T*>(smem_raw);
  T* buf1 = buf0 + kRows * a.ld;
  const int rank = CL > 1 ? int(blockIdx.z) : 0;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gid = lane >> 2, tig = lane & 3;
  const int64_t r0 = int64_t(blockIdx.x) * kRows;
  // The weights are constants: before waiting for the kernel before this one
  // (PDL), pull every 128-byte line this warp will read into L2, so each
  // layer costs one L2 round trip instead of one from memory (the first
  // version, without this, took 7-10 us per chain in the graph: session 21).
  for (int l = 0; l < a.layers; ++l) {
    const int kp = a.k_pad[l] / 32, tiles = a.n_pad[l] / 8;
    for (int t = rank * kWarps + warp; t < tiles; t += CL * kWarps)
      for (int p = lane / 4; p < kp; p += 8)  // a pair's 512 bytes are 4 lines: 4 lanes a pair, 8 pairs a step
        asm volatile("prefetch.global.L2 [%0];" ::"l"(a.w[l] + (int64_t(t) * kp + p) * 32 + (lane % 4) * 8));
  }
  dev::enter_grid();
  // The block's rows of x, zero past the rows and past k0 up to k_pad[0]
  // (16-byte loads when `vec`: k0 % 8 == 0 and x 16-byte aligned).
  {
    const int kp = a.k_pad[0];
    if (vec) {
      const int per_row = kp / 8;
      for (int i = threadIdx.x; i < kRows * per_row; i += blockDim.x) {
        const int r = i / per_row, c = (i % per_row) * 8;
        uint4 v = make_uint4(0, 0, 0, 0);
        if (r0 + r < rows && c < k0) v = *reinterpret_cast<const uint4*>(x + (r0 + r) * k0 + c);
        *reinterpret_cast<uint4*>(buf0 + r * a.ld + c) = v;
      }
    } else {
      for (int i = threadIdx.x; i < kRows * kp; i += blockDim.x) {
        const int r = i / kp, c = i % kp;
        buf0[r * a.ld + c] = (r0 + r < rows && c < k0) ? x[(r0 + r) * k0 + c] : dev::from_f32<T>(0.f);
      }
    }
  }
  chain_sync<CL>();  // every member running (before any remote write) and its input in place
  T* in = buf0;
  T* out = buf1;
  for (int l = 0; l < a.layers; ++l) {
    const bool last = l + 1 == a.layers;
    const int kp = a.k_pad[l] / 32, n = a.n[l], tiles = a.n_pad[l] / 8;
    const uint4* __restrict__ w = a.w[l];
    const float* __restrict__ bias = a.b[l];
    const bool relu = (a.relu >> l) & 1u, gelu = (a.gelu >> l) & 1u;
    for (int t = rank * kWarps + warp; t < tiles; t += CL * kWarps) {
      const int col = t * 8 + tig * 2;  // this lane's two columns; rows gid and gid + 8
      const float b0 = bias[col], b1 = bias[col + 1];  // loaded with the weights, used after
      float acc[4] = {0.f, 0.f, 0.f, 0.f};
      for (int p0 = 0; p0 < kp; p0 += kPairBatch) {
        uint4 bw[kPairBatch];
#pragma unroll
        for (int j = 0; j < kPairBatch; ++j)
          if (p0 + j < kp) bw[j] = __ldg(w + (int64_t(t) * kp + p0 + j) * 32 + lane);
#pragma unroll
        for (int j = 0; j < kPairBatch; ++j) {
          if (p0 + j >= kp) break;
          const int kc = (p0 + j) * 32 + tig * 2;
          const T* r_lo = in + gid * a.ld + kc;
          const T* r_hi = in + (gid + 8) * a.ld + kc;
          const uint32_t f0[4] = {dev::ld32(r_lo), dev::ld32(r_hi), dev::ld32(r_lo + 8), dev::ld32(r_hi + 8)};
          const uint32_t f1[4] = {dev::ld32(r_lo + 16), dev::ld32(r_hi + 16), dev::ld32(r_lo + 24), dev::ld32(r_hi + 24)};
          dev::mma16816<T>(acc, f0, bw[j].x, bw[j].y);
          dev::mma16816<T>(acc, f1, bw[j].z, bw[j].w);
        }
      }
      float v[4] = {acc[0] + b0, acc[1] + b1, acc[2] + b0, acc[3] + b1};
      if (relu)
        for (float& e : v) e = fmaxf(e, 0.f);
      if (gelu)  // cuBLASLt has no erf GELU epilogue: the unfused linear stores, then a kernel applies it
        for (float& e : v) e = dev::act<Activation::Gelu>(dev::to_f32(dev::from_f32<T>(e)));
      if (l == a.refine.layer) {
        // box_refine's bits (elementwise.cu): the delta as the unfused linear
        // stores it, widened, plus inverse_sigmoid(ref) (or ref), the
        // activation in f32; the f32 result and its narrowing are written
        // out, and the narrowed value (the next layer's input, as the unfused
        // query position head reads it) replaces v. Columns past n and rows
        // past the end are zero.
        T* narrow = static_cast<T*>(a.refine.y_narrow);
        for (int h = 0; h < 2; ++h) {
          const int64_t r = r0 + gid + 8 * h;
          for (int e = 0; e < 2; ++e) {
            float o = 0.f;
            if (r < rows && col + e < n) {
              const int64_t at = r * n + col + e;
              const float d = dev::to_f32(dev::from_f32<T>(v[2 * h + e]));
              const float ref = a.refine.ref[at];
              o = d + (a.refine.eps < 0.f ? ref : dev::inverse_sigmoid_f32(ref, a.refine.eps));
              if (a.refine.act == Activation::Sigmoid) o = dev::act<Activation::Sigmoid>(o);
              a.refine.y[at] = o;
              if (narrow) narrow[at] = dev::from_f32<T>(o);
            }
            v[2 * h + e] = o;
          }
        }
        if (last) continue;  // nothing further to write: the delta itself has no reader
      }
      if (last && a.norm.io.x2) {
        // The residual add as the unfused graph stores it: the product
        // rounded to T, plus the residual, rounded again; rows past the
        // end and columns past n read as zero (never normalized).
        const T* res = static_cast<const T*>(a.norm.io.x2);
        for (int h = 0; h < 2; ++h) {
          const int64_t r = r0 + gid + 8 * h;
          for (int e = 0; e < 2; ++e) {
            float& z = v[2 * h + e];
            z = r < rows && col + e < n ? dev::to_f32(dev::from_f32<T>(dev::to_f32(dev::from_f32<T>(z)) + dev::to_f32(res[r * n + col + e])))
                                        : 0.f;
          }
        }
      }
      if (!last || a.norm.io.x2) {
        const uint32_t lo = dev::pack2<T>(v[0], v[1]), hi = dev::pack2<T>(v[2], v[3]);
        if constexpr (CL > 1) {
          cg::cluster_group cluster = cg::this_cluster();
#pragma unroll
          for (int m = 0; m < CL; ++m) {
            T* o = cluster.map_shared_rank(out, m);
            *reinterpret_cast<uint32_t*>(o + gid * a.ld + col) = lo;
            *reinterpret_cast<uint32_t*>(o + (gid + 8) * a.ld + col) = hi;
          }
        } else {
          *reinterpret_cast<uint32_t*>(out + gid * a.ld + col) = lo;
          *reinterpret_cast<uint32_t*>(out + (gid + 8) * a.ld + col) = hi;
        }
      } else {
        // The unfused add (RT-DETR's query + position, plan_mlp_chains): the
        // stored product plus the other operand in f32, rounded once.
        const T* add_to = static_cast<const T*>(a.sum.add_to);
        T* y_sum = static_cast<T*>(a.sum.y);
        for (int h = 0; h < 2; ++h) {
          const int64_t r = r0 + gid + 8 * h;
          if (r >= rows) continue;
          for (int e = 0; e < 2 && col + e < n; ++e) {
            const T o = dev::from_f32<T>(v[2 * h + e]);
            y[r * n + col + e] = o;
            if (y_sum) y_sum[r * n + col + e] = dev::from_f32<T>(dev::to_f32(o) + dev::to_f32(add_to[r * n + col + e]));
          }
        }
      }
    }
    if (last && !a.norm.io.x2) break;
    chain_sync<CL>();  // layer l written everywhere; its input no longer read
    T* t = in;
    in = out, out = t;
  }
  if (!a.norm.io.x2) return;
  // layer_norm of the summed rows (now `in`, on every member): each member
  // takes 16 / CL of the block's rows, a warp a row (several without a
  // cluster: 16 rows, 8 warps).
  const int per = kRows / CL;
  for (int rr = rank * per + warp; rr < (rank + 1) * per && r0 + rr < rows; rr += kWarps)
    norm_row<T>(in + rr * a.ld, a.n[a.layers - 1], r0 + rr, y, a.norm, lane);
}

}  // namespace

int mlp_chain_cluster(int64_t rows, int sms) {
  const int64_t blocks = (rows + kRows - 1) / kRows;
  const int64_t fit = sms / std::max<int64_t>(blocks, 1);
  return fit >= 4 ? 4 : fit >= 2 ? 2 : 1;
}

int device_sm_count() { return detail::sm_count(); }

void mlp_chain(const void* x, void* y, DType dt, int64_t rows, int k0, const MlpChainLayer* layers, int count, int cluster,
               cudaStream_t stream, const MlpChainNorm* norm, const MlpChainSum* sum, const MlpChainRefine* refine) {
  if (rows <= 0) return;
  if (count < 1 || count > kMaxMlpChain) fail_runtime("cuda mlp_chain: ", count, " layers (1..", kMaxMlpChain, ")");
  if (cluster != 1 && cluster != 2 && cluster != 4) fail_runtime("cuda mlp_chain: cluster of ", cluster);
  ChainArgs a;
  a.layers = count;
  int widest = 0;
  for (int l = 0; l < count; ++l) {
    const MlpChainLayer& L = layers[l];
    if (L.k_pad % 32 || L.n_pad % 8 || L.n > L.n_pad || (l + 1 < count && L.n_pad != layers[l + 1].k_pad))
      fail_runtime("cuda mlp_chain: layer ", l, " padding k ", L.k_pad, " n ", L.n, "/", L.n_pad);
    a.w[l] = static_cast<const uint4*>(L.w), a.b[l] = L.b;
    a.k_pad[l] = L.k_pad, a.n[l] = L.n, a.n_pad[l] = L.n_pad;
    if (L.act == Activation::Relu) a.relu |= 1u << l;
    else if (L.act == Activation::Gelu) a.gelu |= 1u << l;
    else if (L.act != Activation::None) fail_runtime("cuda mlp_chain: layer ", l, " activation ", activation_name(L.act));
    widest = std::max({widest, L.k_pad, L.n_pad});
  }
  if (norm) a.norm = *norm;
  if (norm && !norm->io.x2) fail_runtime("cuda mlp_chain: a layer norm without its residual");
  if (sum) {
    if (norm) fail_runtime("cuda mlp_chain: a sum output and a layer norm together");
    if (!sum->add_to || !sum->y) fail_runtime("cuda mlp_chain: a sum output without its operand or destination");
    a.sum = *sum;
  }
  if (refine) {
    if (refine->layer < 0 || refine->layer >= count || !refine->ref || !refine->y)
      fail_runtime("cuda mlp_chain: refinement at layer ", refine->layer, " of ", count, " without its reference or output");
    if (refine->act != Activation::None && refine->act != Activation::Sigmoid)
      fail_runtime("cuda mlp_chain: refinement activation ", activation_name(refine->act), " (none or sigmoid)");
    if (layers[refine->layer].act != Activation::None)
      fail_runtime("cuda mlp_chain: refinement after layer ", refine->layer, ", which has an activation");
    a.refine = *refine;
  }
  if (k0 > layers[0].k_pad) fail_runtime("cuda mlp_chain: input width ", k0, " over ", layers[0].k_pad);
  a.ld = widest + 8;  // 16 bytes of padding: the fragment reads of 8 rows hit distinct banks
  const int64_t blocks = (rows + kRows - 1) / kRows;
  if (blocks > int64_t(0x7fffffff)) fail_runtime("cuda mlp_chain: ", rows, " rows is too many");
  detail::dispatch_float(dt, "mlp_chain", [&](auto t) {
    using T = decltype(t);
    if constexpr (std::is_same_v<T, float>) {
      fail_runtime("cuda mlp_chain: f32 chains run as separate GEMMs");
    } else {
      const size_t smem = size_t(2) * kRows * a.ld * sizeof(T);
      if (widest > kMaxMlpWidth) fail_runtime("cuda mlp_chain: width ", widest, " over ", kMaxMlpWidth);
      // Above 48 KiB (widths over 736) a kernel must opt in, once per instantiation.
      static const bool opted = [] {
        const int bytes = int(size_t(2) * kRows * (kMaxMlpWidth + 8) * sizeof(T));
        KILN_CUDA_CHECK(cudaFuncSetAttribute(mlp_chain_kernel<T, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
        KILN_CUDA_CHECK(cudaFuncSetAttribute(mlp_chain_kernel<T, 2>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
        KILN_CUDA_CHECK(cudaFuncSetAttribute(mlp_chain_kernel<T, 4>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
        return true;
      }();
      (void)opted;
      const dim3 grid(unsigned(blocks), 1, unsigned(cluster));
      const auto* xt = static_cast<const T*>(x);
      const bool vec = k0 % 8 == 0 && detail::aligned16(x);
      auto* yt = static_cast<T*>(y);
      auto* kernel = cluster == 4 ? mlp_chain_kernel<T, 4> : cluster == 2 ? mlp_chain_kernel<T, 2> : mlp_chain_kernel<T, 1>;
      detail::launch_clustered("mlp_chain", unsigned(cluster), kernel, grid, kWarps * 32, smem, stream, xt, yt, rows, k0, vec, a);
    }
  });
}

}  // namespace kiln::cuda
