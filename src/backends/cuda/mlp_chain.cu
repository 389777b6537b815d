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
#include <algorithm>

#include "backends/cuda/cuda_check.hpp"

#include "backends/cuda/device_common.cuh"
#include "backends/cuda/kernels.hpp"

namespace kiln::cuda {

namespace {

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

// Once per launch, after each block wrote its input rows and thread 0 set up
// its mbarriers (LayerHandoff::init): the block's barrier (its rows visible
// to its threads), and with a cluster, every member running (before any
// remote store) and its mbarriers initialised (fence.mbarrier_init). The
// cluster barrier's arrive is relaxed: a release one is a GPU-wide memory
// barrier (MEMBAR.ALL.GPU, ERRBAR: SASS of sm_90), which took a quarter of
// the chain's stall samples when every layer ended with one (Nsight Compute,
// session 26). Between layers the blocks hand rows over with asynchronous
// stores instead (LayerHandoff).
template <int CL>
__device__ __forceinline__ void chain_start() {
  __syncthreads();
  if constexpr (CL > 1) asm volatile("barrier.cluster.arrive.relaxed.aligned;\n\tbarrier.cluster.wait.aligned;" ::: "memory");
}

using dev::smem_u32;

// A layer's output rows reach every block of a cluster by st.async into its
// row buffer; each store completes its bytes on that block's mbarrier for the
// buffer, and a block reads the rows once the barrier's phase holds all of
// them (16 rows x n_pad columns: every tile is written by one warp of the
// cluster). No fence: the complete-tx has release semantics at cluster scope
// and the wait acquires at cluster scope. Thread 0 arms a buffer's next phase
// (its expected bytes) right after the phase before completes; a store
// arriving earlier than the arming is allowed (the transaction count may go
// below zero within a phase). Reuse is safe with two buffers: a block can
// write layer l + 1 into another's buffer only after receiving every block's
// layer l, and each warp writes its share of layer l only after reading its
// inputs from that buffer.
template <int CL>
struct LayerHandoff {
  uint32_t bars = 0;       // shared::cta address of buffer 0's mbarrier (buffer 1's follows it)
  uint32_t phase = 0;      // bit b: the parity of buffer b's next phase
  uint32_t smem = 0;       // shared::cta address of the row buffers
  uint32_t peer_smem[CL];  // ... and of each block's copy (shared::cluster)
  uint32_t peer_bars[CL];

  __device__ __forceinline__ uint32_t bar(int b) const { return bars + 8u * uint32_t(b); }
  __device__ __forceinline__ void init(uint64_t* at, const void* buffers) {
    bars = smem_u32(at), smem = smem_u32(buffers);
#pragma unroll
    for (int m = 0; m < CL; ++m) {
      asm("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(peer_smem[m]) : "r"(smem), "r"(m));
      asm("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(peer_bars[m]) : "r"(bars), "r"(m));
    }
    if (threadIdx.x == 0) {
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(bar(0)) : "memory");
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(bar(1)) : "memory");
      asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
  }
  // Thread 0: buffer b's current phase expects `bytes`.
  __device__ __forceinline__ void arm(int b, uint32_t bytes) const {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar(b)), "r"(bytes) : "memory");
  }
  // Thread 0 waits for buffer b's phase and calls rearm(); then the block.
  template <typename F>
  __device__ __forceinline__ void wait(int b, F&& rearm) {
    if (threadIdx.x == 0) {
      const uint32_t parity = (phase >> b) & 1u;
      uint32_t done = 0;
      while (!done)
        asm volatile(
            "{ .reg .pred p; mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
            : "=r"(done)
            : "r"(bar(b)), "r"(parity)
            : "memory");
      rearm();
    }
    phase ^= 1u << b;
    __syncthreads();
  }
  // Two 16-bit values into block m's copy of local address `at`, in buffer b.
  __device__ __forceinline__ void store(int b, int m, const void* at, uint32_t v) const {
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];" ::"r"(
                     peer_smem[m] + (smem_u32(at) - smem)),
                 "r"(v), "r"(peer_bars[m] + 8u * uint32_t(b))
                 : "memory");
  }
};

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
  __shared__ __align__(8) uint64_t handoff_bars[2];
  LayerHandoff<CL> ho;  // CL > 1 only
  // Layer l writes buffer (l + 1) % 2 of every block: the last layer only
  // with the fused norm (its summed rows are read back).
  auto writes = [&](int l) { return l < a.layers && (l + 1 < a.layers || a.norm.io.x2 != nullptr); };
  auto layer_bytes = [&](int l) { return uint32_t(kRows * a.n_pad[l] * sizeof(T)); };
  if constexpr (CL > 1) {
    ho.init(handoff_bars, smem_raw);
    if (threadIdx.x == 0)
      for (int l = 0; l < 2; ++l)  // buffer 1 first takes layer 0, buffer 0 layer 1
        if (writes(l)) ho.arm((l + 1) % 2, layer_bytes(l));
  }
  const int rank = CL > 1 ? int(blockIdx.z) : 0;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gid = lane >> 2, tig = lane & 3;
  const int64_t r0 = int64_t(blockIdx.x) * kRows;
  // Output tiles (8 columns) are dealt to the cluster's warps round robin:
  // this warp takes first, first + stride, ...
  const int first = rank * kWarps + warp, stride = CL * kWarps;
  // The weight fragments of one tile's k pairs [p0, p0 + kPairBatch) (and at
  // p0 = 0 the tile's two bias columns), into registers. Each tile's first
  // batch is fetched while the tile before it finishes (its epilogue and the
  // cluster barrier), the first layer's before the PDL wait: the weights are
  // constants. Fetching only when a tile began cost each layer an L2 round
  // trip on the critical path, most of a chain's ~3.5 us a layer (Nsight
  // Compute on the H100, session 26: ~500 instructions a layer at 2 warps a
  // scheduler, latency bound; stalls on the weight loads, the cluster barrier
  // and its release fence).
  uint4 bw[kPairBatch];
  float b0 = 0.f, b1 = 0.f;
  auto tiles_of = [&](int l) { return a.n_pad[l] / 8; };
  auto fetch = [&](int l, int t, int p0) {
    const int kp = a.k_pad[l] / 32, cnt = kp - p0;
    const uint4* __restrict__ src = a.w[l] + (t * kp + p0) * 32 + lane;
#pragma unroll
    for (int j = 0; j < kPairBatch; ++j)
      if (j < cnt) bw[j] = __ldg(src + j * 32);
    if (p0 == 0) {
      const float* __restrict__ bias = a.b[l] + t * 8 + tig * 2;
      b0 = __ldg(bias), b1 = __ldg(bias + 1);
    }
  };
  // have: bw holds this warp's first tile of the layer about to run.
  bool have = first < tiles_of(0);
  if (have) fetch(0, first, 0);
  // Every layer's lines into L2 as well, so each of their fetches is one
  // L2 round trip instead of one from memory (without this the first version
  // took 7-10 us per chain in the graph: session 21).
  for (int l = 0; l < a.layers; ++l) {
    const int kp = a.k_pad[l] / 32, tiles = a.n_pad[l] / 8;
    for (int t = first; t < tiles; t += stride)
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
  // The operands the epilogues of this warp's first tiles read (the
  // refinement's reference; the last layer's residual or sum operand), loaded
  // now rather than after the products: the refinement layer has a single
  // tile, so its warp's load latency would hold the whole cluster.
  float pre_ref[4] = {0.f, 0.f, 0.f, 0.f}, pre_end[4] = {0.f, 0.f, 0.f, 0.f};
  {
    const int rl = a.refine.layer, ll = a.layers - 1;
    const T* end_op = static_cast<const T*>(a.norm.io.x2 ? a.norm.io.x2 : a.sum.y ? a.sum.add_to : nullptr);
    const int col = first * 8 + tig * 2;
    for (int h = 0; h < 2; ++h)
      for (int e = 0; e < 2; ++e) {
        const int64_t r = r0 + gid + 8 * h;
        if (rl >= 0 && first < tiles_of(rl) && r < rows && col + e < a.n[rl]) pre_ref[2 * h + e] = a.refine.ref[r * a.n[rl] + col + e];
        if (end_op && first < tiles_of(ll) && r < rows && col + e < a.n[ll]) pre_end[2 * h + e] = dev::to_f32(end_op[r * a.n[ll] + col + e]);
      }
  }
  chain_start<CL>();
  T* in = buf0;
  T* out = buf1;
  for (int l = 0; l < a.layers; ++l) {
    const bool last = l + 1 == a.layers;
    const int kp = a.k_pad[l] / 32, n = a.n[l], tiles = a.n_pad[l] / 8;
    const bool relu = (a.relu >> l) & 1u, gelu = (a.gelu >> l) & 1u;
    const bool more = l + 1 < a.layers && first < tiles_of(l + 1);  // this warp has a tile in the next layer
    if (!have && first < tiles) fetch(l, first, 0);
    have = false;
    if (first >= tiles && more) fetch(l + 1, first, 0), have = true;  // idle in this layer: fetch the next one's now
    for (int t = first; t < tiles; t += stride) {
      const int col = t * 8 + tig * 2;  // this lane's two columns; rows gid and gid + 8
      float acc[4] = {0.f, 0.f, 0.f, 0.f};
      for (int p0 = 0; p0 < kp; p0 += kPairBatch) {
        if (p0 > 0) fetch(l, t, p0);  // K over 16 pairs (512): the rest where it is used
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
      const float c0 = b0, c1 = b1;  // this tile's bias, before the fetch below replaces it
      // The next tile's first batch, in flight during this epilogue and the barrier.
      if (t + stride < tiles) fetch(l, t + stride, 0);
      else if (more) fetch(l + 1, first, 0), have = true;
      float v[4] = {acc[0] + c0, acc[1] + c1, acc[2] + c0, acc[3] + c1};
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
              const float ref = t == first ? pre_ref[2 * h + e] : a.refine.ref[at];
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
            z = r < rows && col + e < n
                    ? dev::to_f32(dev::from_f32<T>(dev::to_f32(dev::from_f32<T>(z)) +
                                                   (t == first ? pre_end[2 * h + e] : dev::to_f32(res[r * n + col + e]))))
                    : 0.f;
          }
        }
      }
      if (!last || a.norm.io.x2) {
        const uint32_t lo = dev::pack2<T>(v[0], v[1]), hi = dev::pack2<T>(v[2], v[3]);
        if constexpr (CL > 1) {
          const int ob = (l + 1) % 2;
#pragma unroll
          for (int m = 0; m < CL; ++m) {
            ho.store(ob, m, out + gid * a.ld + col, lo);
            ho.store(ob, m, out + (gid + 8) * a.ld + col, hi);
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
            const float av = t == first ? pre_end[2 * h + e] : dev::to_f32(add_to[r * n + col + e]);
            if (y_sum) y_sum[r * n + col + e] = dev::from_f32<T>(dev::to_f32(o) + av);
          }
        }
      }
    }
    if (last && !a.norm.io.x2) break;
    // Layer l written everywhere (so its input is no longer read).
    if constexpr (CL > 1) {
      ho.wait((l + 1) % 2, [&] {
        if (writes(l + 2)) ho.arm((l + 1) % 2, layer_bytes(l + 2));
      });
    } else {
      __syncthreads();
    }
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
    if (norm) fail_runtime("cuda mlp_chain: a refinement and a layer norm together");
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
