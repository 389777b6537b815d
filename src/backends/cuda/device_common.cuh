// Shared pieces of kiln's CUDA kernels (.cu files only): element conversion,
// activations, vector loads/stores and the host-side type/activation
// dispatch and grid sizing of the launchers.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>
#include <utility>

#include "backends/cuda/cuda_check.hpp"
#include "backends/cuda/kernels.hpp"
#include "core/activation.hpp"
#include "core/dtype.hpp"
#include "core/error.hpp"

namespace kiln::cuda::dev {

// ---- element conversion: compute in f32, store with RNE -------------------
// e4m3 (FP8 storage, issue 13): decoding is exact; encoding rounds to
// nearest even and saturates at +-448 (__NV_SATFINITE), what the CPU
// emulation's f32_to_e4m3 does for every finite value and +-inf
// (docs/quantization.md "Formats"). NaN stays NaN (the code may lose its sign).
// i8 codes (INT8 storage): the code's value; encoding is the CPU's
// quant::encode(I8) for activations: round half to even, clamp to [-128, 127],
// NaN -> 0 (what PTX cvt.rni.sat.s8.f32 does).
template <typename T>
__device__ __forceinline__ float to_f32(T v) {
  if constexpr (std::is_same_v<T, float>) return v;
  else if constexpr (std::is_same_v<T, int8_t>) return float(v);
  else if constexpr (std::is_same_v<T, __half>) return __half2float(v);
  else if constexpr (std::is_same_v<T, __nv_fp8_e4m3>) return __half2float(__half(__nv_cvt_fp8_to_halfraw(v.__x, __NV_E4M3)));
  else return __bfloat162float(v);
}
template <typename T>
__device__ __forceinline__ T from_f32(float v) {
  if constexpr (std::is_same_v<T, float>) return v;
  else if constexpr (std::is_same_v<T, int8_t>) {
    if (v != v) return 0;
    return int8_t(max(-128, min(127, __float2int_rn(fminf(fmaxf(v, -129.f), 128.f)))));
  }
  else if constexpr (std::is_same_v<T, __half>) return __float2half_rn(v);
  else if constexpr (std::is_same_v<T, __nv_fp8_e4m3>) {
    __nv_fp8_e4m3 r;
    r.__x = __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3);
    return r;
  } else return __float2bfloat16_rn(v);
}

// f32 engines use full-precision expf and IEEE division to stay close to the
// CPU reference. 16-bit engines round the result to 2^-9..2^-12 anyway, so
// they take the MUFU approximations (__expf, __fdividef: ~1e-6 relative),
// which keeps SiLU/sigmoid memory-bound instead of ALU-bound. For x < -88,
// exp(-x) is inf and x * rcp(inf) gives the right limit (-0 / 0).
template <Activation A, bool kFast = false>
__device__ __forceinline__ float act(float x) {
  if constexpr (A == Activation::Relu) return fmaxf(x, 0.f);
  else if constexpr (A == Activation::Relu6) return fminf(fmaxf(x, 0.f), 6.f);
  else if constexpr (A == Activation::Silu) return kFast ? __fdividef(x, 1.f + __expf(-x)) : x / (1.f + expf(-x));
  else if constexpr (A == Activation::Sigmoid) return kFast ? __fdividef(1.f, 1.f + __expf(-x)) : 1.f / (1.f + expf(-x));
  else if constexpr (A == Activation::Gelu) return 0.5f * x * (1.f + erff(x * 0.70710678118654752f));  // exact (erf) form, every dtype
  else return x;
}

// act<A, kFast> with A chosen at run time, for epilogues whose activation is
// a kernel argument (igemm_conv, conv_sm90): the same forms, so those kernels
// differ from kiln's other 16-bit convs only in the order of their f32 sums.
template <bool kFast>
__device__ __forceinline__ float act_rt(Activation a, float x) {
  switch (a) {
    case Activation::Relu: return act<Activation::Relu, kFast>(x);
    case Activation::Relu6: return act<Activation::Relu6, kFast>(x);
    case Activation::Silu: return act<Activation::Silu, kFast>(x);
    case Activation::Sigmoid: return act<Activation::Sigmoid, kFast>(x);
    case Activation::Gelu: return act<Activation::Gelu, kFast>(x);
    default: return x;
  }
}

// transformers' inverse_sigmoid in f32: x clamped to [0, 1], log(max(x, eps) /
// max(1 - x, eps)) (the inverse_sigmoid op, box_refine, mlp_chain's refine).
__device__ __forceinline__ float inverse_sigmoid_f32(float x, float eps) {
  const float v = fminf(fmaxf(x, 0.f), 1.f);
  return logf(fmaxf(v, eps) / fmaxf(1.f - v, eps));
}

// Whether element type T takes the fast activation path.
template <typename T>
inline constexpr bool kFastMath = sizeof(T) == 2;

// ---- vector access ---------------------------------------------------------
// V elements of T as one (or several) 16-byte accesses; V == 1 is a plain
// scalar access. Callers guarantee 16-byte alignment when V > 1.
template <typename T, int V>
__device__ __forceinline__ void load_vec(const T* p, float (&f)[V]) {
  if constexpr (V == 1) {
    f[0] = to_f32(*p);
  } else {
    constexpr int kBytes = int(sizeof(T)) * V;
    static_assert(kBytes % 16 == 0, "vector width must be a multiple of 16 bytes");
    uint4 raw[kBytes / 16];
#pragma unroll
    for (int i = 0; i < kBytes / 16; ++i) raw[i] = reinterpret_cast<const uint4*>(p)[i];
    const T* e = reinterpret_cast<const T*>(raw);
#pragma unroll
    for (int k = 0; k < V; ++k) f[k] = to_f32(e[k]);
  }
}

template <typename T, int V>
__device__ __forceinline__ void store_vec(T* p, const float (&f)[V]) {
  if constexpr (V == 1) {
    *p = from_f32<T>(f[0]);
  } else {
    constexpr int kBytes = int(sizeof(T)) * V;
    static_assert(kBytes % 16 == 0, "vector width must be a multiple of 16 bytes");
    uint4 raw[kBytes / 16];
    T* e = reinterpret_cast<T*>(raw);
#pragma unroll
    for (int k = 0; k < V; ++k) e[k] = from_f32<T>(f[k]);
#pragma unroll
    for (int i = 0; i < kBytes / 16; ++i) reinterpret_cast<uint4*>(p)[i] = raw[i];
  }
}

// Output type To is a code type (a producer writing codes, CodeOut): the f32
// result is multiplied by f32(1 / scale) once, no contraction, before the
// store's encoding (what quantize does to a stored value).
template <typename To>
inline constexpr bool kIsCode = std::is_same_v<To, __nv_fp8_e4m3> || std::is_same_v<To, int8_t>;
template <typename To, int V>
__device__ __forceinline__ void to_code_units(float (&f)[V], float inv_scale) {
  if constexpr (kIsCode<To>) {
#pragma unroll
    for (int k = 0; k < V; ++k) f[k] = __fmul_rn(f[k], inv_scale);
  }
}

// Elements per 16-byte access.
template <typename T>
inline constexpr int kVec16 = 16 / int(sizeof(T));
// Elements per pack of a kernel reading Ti and writing To: 16 bytes of the
// wider side, so both stay vectorised (f16 in, e4m3 codes out: 16).
template <typename Ti, typename To>
inline constexpr int kVec16Of = kVec16<Ti> > kVec16<To> ? kVec16<Ti> : kVec16<To>;

// Walk over a [rows, cols] grid where each thread keeps one column for its
// whole life: the grid stride is a whole number of rows, so per-column data
// (BN scale, channel offsets) is loaded once and the index math needs no
// division inside the loop. Threads past the last whole row sit out.
struct RowWalk {
  uint32_t col;
  int64_t row;
  uint32_t step;
};
__device__ __forceinline__ bool row_walk(uint32_t cols, RowWalk& w) {
  const uint32_t tid = blockIdx.x * blockDim.x + threadIdx.x;
  const uint32_t n = gridDim.x * blockDim.x;
  w.step = n / cols;
  w.col = tid % cols;
  w.row = tid / cols;
  return w.row < w.step;
}


// ---- programmatic dependent launch (PDL, sm_90) ----------------------------
// Every kiln kernel begins with enter_grid() and is launched by detail::launch.
// The wait holds the whole block until the kernel before it in the stream has
// finished and its writes are visible (a no-op without the launch attribute);
// only then does the block touch global memory, so reads and writes keep stream
// order exactly. The trigger after it lets the next kiln kernel's blocks be
// scheduled while this one runs: they are resident and waiting when it ends,
// instead of paying the launch gap between two small kernels of a CUDA graph.
// (cuDNN's and cuBLASLt's kernels do not trigger, so a kiln kernel after one of
// them starts as usual.)
__device__ __forceinline__ void enter_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// ---- warp reductions (every lane gets the result) ---------------------------
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// ---- tensor cores (mma.sync, sm_80+) ----------------------------------------
// Two f32 rounded to T (RNE), the lower column in the low half as mma wants it.
template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  T r[2] = {from_f32<T>(lo), from_f32<T>(hi)};
  uint32_t u;
  memcpy(&u, r, 4);
  return u;
}
// Two consecutive 16-bit elements as one mma fragment register.
template <typename T>
__device__ __forceinline__ uint32_t ld32(const T* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}

// c += a b for one warp: a 16x16 row-major, b 16x8 column-major (T: __half or
// __nv_bfloat16, two per register), c 16x8 f32; the PTX fragment layouts.
template <typename T>
__device__ __forceinline__ void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (std::is_same_v<T, __half>) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// ---- shared memory: addresses, cp.async, ldmatrix (sm_80+) -----------------
__device__ __forceinline__ uint32_t smem_u32(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }

// 16 bytes global -> shared, bypassing L1; with valid false the 16 bytes are
// zero-filled instead (src is then not read, but must stay a mapped address).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem_u32(dst)), "l"(src), "r"(valid ? 16 : 0) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// Four 8x8 16-bit matrices from shared memory; lane l gives the row address
// of matrix l / 8 and receives (row l / 4, columns 2(l % 4), +1) of each.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p)));
}

}  // namespace kiln::cuda::dev

namespace kiln::cuda::detail {

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

constexpr int kThreads = 256;

// Multiprocessors of the current device, read once: kiln runs one GPU model
// per process.
inline int sm_count() {
  static const int sms = [] {
    int dev = 0, n = 0;
    KILN_CUDA_CHECK(cudaGetDevice(&dev));
    KILN_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
    return n;
  }();
  return sms;
}

// Blocks for a grid-stride loop over `work` items: enough to fill every SM
// (2048 threads is an SM's full capacity), never more than the work needs.
inline int grid_for(int64_t work, int threads = kThreads) {
  const int64_t need = (work + threads - 1) / threads;
  const int64_t cap = int64_t(sm_count()) * (2048 / threads);
  return int(need < 1 ? 1 : (need < cap ? need : cap));
}

// Blocks for a RowWalk over [rows, cols]: at least one thread per column.
inline int grid_rows(int64_t rows, int64_t cols, int threads = kThreads) {
  const int g = grid_for(rows * cols, threads);
  const int64_t min_blocks = (cols + threads - 1) / threads;
  return int(g < min_blocks ? min_blocks : g);
}

// Calls f(T{}) with T the CUDA element type of dt.
template <typename F>
void dispatch_float(DType dt, const char* op, F&& f) {
  switch (dt) {
    case DType::F32: f(float{}); return;
    case DType::F16: f(__half{}); return;
    case DType::BF16: f(__nv_bfloat16{}); return;
    default: fail_runtime("cuda ", op, ": unsupported dtype ", dtype_name(dt));
  }
}

// dispatch_float, e4m3 (__nv_fp8_e4m3) and i8 codes (int8_t): for the
// kernels that only move and convert values (engine inputs/outputs, cast,
// layout), which 8-bit values pass through.
template <typename F>
void dispatch_storage(DType dt, const char* op, F&& f) {
  if (dt == DType::F8E4M3) return f(__nv_fp8_e4m3{});
  if (dt == DType::I8) return f(int8_t{});
  dispatch_float(dt, op, std::forward<F>(f));
}

// dispatch_float over the inputs' type Ti with the output type To: Ti, or the
// code type of a producer that writes codes (CodeOut): f(Ti{}, To{}).
template <typename F>
void dispatch_float_out(DType dt, const CodeOut& code, const char* op, F&& f) {
  dispatch_float(dt, op, [&](auto t) {
    if (code.dt == DType::F8E4M3) f(t, __nv_fp8_e4m3{});
    else if (code.dt == DType::I8) f(t, int8_t{});
    else if (code.on()) fail_runtime("cuda ", op, ": codes of type ", dtype_name(code.dt));
    else f(t, t);
  });
}

// Calls f(std::integral_constant<Activation, A>{}) so kernels can be
// specialised on the activation instead of branching per element.
template <typename F>
void dispatch_act(Activation a, F&& f) {
  switch (a) {
    case Activation::None: f(std::integral_constant<Activation, Activation::None>{}); return;
    case Activation::Relu: f(std::integral_constant<Activation, Activation::Relu>{}); return;
    case Activation::Relu6: f(std::integral_constant<Activation, Activation::Relu6>{}); return;
    case Activation::Silu: f(std::integral_constant<Activation, Activation::Silu>{}); return;
    case Activation::Sigmoid: f(std::integral_constant<Activation, Activation::Sigmoid>{}); return;
    case Activation::Gelu: f(std::integral_constant<Activation, Activation::Gelu>{}); return;
    default: fail_unknown_activation(a, "cuda dispatch_act");
  }
}

// Whether kiln's kernels are launched with the PDL attribute: the thread's
// pdl_default(), which a context sets from the bundle's `pdl` switch (auto:
// by batch size) around its launches; a CUDA graph keeps what it captured.
inline bool pdl_enabled() { return pdl_default(); }

// Launches a kiln kernel (one that begins with dev::enter_grid()) with the PDL
// attribute, and a thread-block cluster of cluster_z blocks along z when
// cluster_z > 1. Launch-configuration errors are reported at once, naming op;
// asynchronous faults surface at the next synchronising call as usual.
template <typename... P, typename... A>
void launch_clustered(const char* op, unsigned cluster_z, void (*kernel)(P...), dim3 grid, dim3 block, size_t smem,
                      cudaStream_t stream, A&&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[2] = {};
  unsigned na = 0;
  if (cluster_z > 1) {
    attr[na].id = cudaLaunchAttributeClusterDimension;
    attr[na].val.clusterDim.x = 1;
    attr[na].val.clusterDim.y = 1;
    attr[na].val.clusterDim.z = cluster_z;
    ++na;
  }
  if (pdl_enabled()) {
    attr[na].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[na].val.programmaticStreamSerializationAllowed = 1;
    ++na;
  }
  cfg.attrs = attr;
  cfg.numAttrs = na;
  const cudaError_t e = cudaLaunchKernelEx(&cfg, kernel, std::forward<A>(args)...);
  if (e != cudaSuccess) ::kiln::cuda::throw_cuda(e, op, __FILE__, __LINE__);
}

template <typename... P, typename... A>
void launch(const char* op, void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream, A&&... args) {
  launch_clustered(op, 1, kernel, grid, block, smem, stream, std::forward<A>(args)...);
}

}  // namespace kiln::cuda::detail
