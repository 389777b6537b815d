// Elementwise kernels: cast, add, activation, folded batch norm and the
// squeeze-excitation channel scale. All are memory-bound, so the work is
// 16-byte vector accesses with two independent loads in flight per thread.
#include "backends/cuda/device_common.cuh"
#include "backends/cuda/kernels.hpp"

#include <cstdint>

namespace kiln::cuda {
namespace {

using dev::act;
using dev::inverse_sigmoid_f32;
using dev::load_vec;
using dev::store_vec;

template <Activation A, bool kFast>
struct AddOp {
  template <int N>
  __device__ void operator()(float (&a)[N], const float (&b)[N]) const {
#pragma unroll
    for (int k = 0; k < N; ++k) a[k] = act<A, kFast>(a[k] + b[k]);
  }
};
// A producer writing codes (CodeOut): act(a + b) in f32, then times
// f32(1 / scale); the store encodes. None and ReLU only (exact in f32).
template <Activation A>
struct AddCodeOp {
  float inv_scale;
  template <int N>
  __device__ void operator()(float (&a)[N], const float (&b)[N]) const {
#pragma unroll
    for (int k = 0; k < N; ++k) a[k] = __fmul_rn(act<A>(__fadd_rn(a[k], b[k])), inv_scale);
  }
};
// a * b in f32, times f32(1 / scale) when writing codes (1 otherwise: exact).
struct MulOp {
  float inv_scale;
  template <int N>
  __device__ void operator()(float (&a)[N], const float (&b)[N]) const {
#pragma unroll
    for (int k = 0; k < N; ++k) a[k] = __fmul_rn(__fmul_rn(a[k], b[k]), inv_scale);
  }
};
template <Activation A, bool kFast>
struct ActOp {
  template <int N>
  __device__ void operator()(float (&a)[N], const float (&)[N]) const {
#pragma unroll
    for (int k = 0; k < N; ++k) a[k] = act<A, kFast>(a[k]);
  }
};

// y = op(a[, b]) over count elements: full V-packs first, then the scalar
// tail. Pointers may alias (each element is read and written by one thread),
// hence no __restrict__ and no read-only cache loads. b_period > 0: b holds
// one image of b_period elements, read at e modulo b_period (a constant
// repeated per image; a multiple of V on the vector path).
template <typename Ti, typename To, int V, bool kBinary, typename Op>
__global__ void map_kernel(const Ti* a, const Ti* b, To* y, int64_t count, int64_t b_period, Op op) {
  dev::enter_grid();
  const int64_t packs = count / V;
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  auto b_at = [&](int64_t e) { return b + (b_period > 0 ? e % b_period : e); };
  for (int64_t i = tid; i < packs; i += 2 * stride) {
    const int64_t j = i + stride;
    const bool second = j < packs;
    float a0[V], b0[V], a1[V], b1[V];
    load_vec<Ti, V>(a + i * V, a0);
    if constexpr (kBinary) load_vec<Ti, V>(b_at(i * V), b0);
    if (second) {
      load_vec<Ti, V>(a + j * V, a1);
      if constexpr (kBinary) load_vec<Ti, V>(b_at(j * V), b1);
    }
    op(a0, b0);
    store_vec<To, V>(y + i * V, a0);
    if (second) {
      op(a1, b1);
      store_vec<To, V>(y + j * V, a1);
    }
  }
  for (int64_t e = packs * V + tid; e < count; e += stride) {
    float s[1], t[1];
    load_vec<Ti, 1>(a + e, s);
    if constexpr (kBinary) load_vec<Ti, 1>(b_at(e), t);
    op(s, t);
    store_vec<To, 1>(y + e, s);
  }
}

struct CopyOp {
  template <int N>
  __device__ void operator()(float (&)[N], const float (&)[N]) const {}
};

template <typename Ti, typename To, bool kBinary, typename Op>
void launch_map(const void* a, const void* b, void* y, int64_t count, Op op, cudaStream_t stream, const char* name,
                int64_t b_period = 0) {
  if (count <= 0) return;
  // The pack covers 16 bytes of the wider type so both sides stay vectorised.
  constexpr int kV = dev::kVec16Of<Ti, To>;
  const bool vec = detail::aligned16(a) && detail::aligned16(y) && (!kBinary || detail::aligned16(b)) && b_period % kV == 0;
  const auto* ta = static_cast<const Ti*>(a);
  const auto* tb = static_cast<const Ti*>(b);
  auto* ty = static_cast<To*>(y);
  if (vec) {
    detail::launch(name, map_kernel<Ti, To, kV, kBinary, Op>, detail::grid_for(count / kV / 2 + 1), detail::kThreads, 0,
        stream, ta, tb, ty, count, b_period, op);
  } else {
    detail::launch(name, map_kernel<Ti, To, 1, kBinary, Op>, detail::grid_for(count / 2 + 1), detail::kThreads, 0, stream,
        ta, tb, ty, count, b_period, op);
  }
}

// y[r, ch] = act(x[r, ch] * scale[ch] + shift[ch]).
template <typename T, int V, Activation A>
__global__ void batch_norm_kernel(const T* x, T* y, int64_t rows, int c, const float* scale, const float* shift) {
  dev::enter_grid();
  dev::RowWalk w;
  if (!dev::row_walk(uint32_t(c / V), w)) return;
  const int ch = int(w.col) * V;
  float sc[V], sh[V];
#pragma unroll
  for (int k = 0; k < V; ++k) {
    sc[k] = __ldg(scale + ch + k);
    sh[k] = __ldg(shift + ch + k);
  }
  for (int64_t r = w.row; r < rows; r += 2 * int64_t(w.step)) {
    const int64_t r1 = r + w.step;
    float f0[V], f1[V];
    load_vec<T, V>(x + r * c + ch, f0);
    if (r1 < rows) load_vec<T, V>(x + r1 * c + ch, f1);
#pragma unroll
    for (int k = 0; k < V; ++k) f0[k] = act<A, dev::kFastMath<T>>(fmaf(f0[k], sc[k], sh[k]));
    store_vec<T, V>(y + r * c + ch, f0);
    if (r1 < rows) {
#pragma unroll
      for (int k = 0; k < V; ++k) f1[k] = act<A, dev::kFastMath<T>>(fmaf(f1[k], sc[k], sh[k]));
      store_vec<T, V>(y + r1 * c + ch, f1);
    }
  }
}

// y[b, p, ch] = x[b, p, ch] * s[b, ch]; rows run over b*hw. To a code type:
// the product times inv_scale, encoded (CodeOut).
template <typename T, typename To, int V>
__global__ void mul_channel_kernel(const T* x, const T* s, To* y, int64_t rows, int hw, int c, float inv_scale) {
  dev::enter_grid();
  dev::RowWalk w;
  if (!dev::row_walk(uint32_t(c / V), w)) return;
  const int ch = int(w.col) * V;
  int64_t cur_b = -1;
  float sv[V];
  for (int64_t r = w.row; r < rows; r += w.step) {
    const int64_t b = r / hw;
    if (b != cur_b) {  // the scale changes only once per image
      cur_b = b;
      load_vec<T, V>(s + b * c + ch, sv);
    }
    float f[V];
    load_vec<T, V>(x + r * c + ch, f);
#pragma unroll
    for (int k = 0; k < V; ++k) f[k] = __fmul_rn(f[k], sv[k]);
    dev::to_code_units<To, V>(f, inv_scale);
    store_vec<To, V>(y + r * c + ch, f);
  }
}

}  // namespace

namespace {

// Index values: the engine's inputs and outputs are f32, integer values are
// stored as themselves (i32/i64). A float that is not an integer of I's range
// becomes I's minimum, which gather_rows reports as out of range.
template <typename Ti, typename To>
__global__ void int_cast_kernel(const Ti* x, To* y, int64_t count) {
  dev::enter_grid();
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    if constexpr (std::is_integral_v<To>) {
      const float f = dev::to_f32(x[i]);
      const bool exact = f == floorf(f) && f >= -2147483648.f && f < 2147483648.f;
      y[i] = exact ? To(f) : static_cast<To>(sizeof(To) == 8 ? INT64_MIN : INT32_MIN);  // the type's minimum
    } else {
      y[i] = dev::from_f32<To>(float(x[i]));
    }
  }
}

template <typename F>
void dispatch_int(DType dt, F&& f) {
  switch (dt) {
    case DType::I32: f(int32_t{}); return;
    case DType::I64: f(int64_t{}); return;
    default: fail_runtime("cuda cast: unsupported dtype ", dtype_name(dt));
  }
}

void int_cast(const void* x, DType xdt, void* y, DType ydt, int64_t count, cudaStream_t stream) {
  const bool to_int = !dtype_is_float(ydt);
  if (to_int && !dtype_is_float(xdt)) fail_runtime("cuda cast: ", dtype_name(xdt), " -> ", dtype_name(ydt), " is not supported");
  dispatch_int(to_int ? ydt : xdt, [&](auto i) {
    detail::dispatch_float(to_int ? xdt : ydt, "cast", [&](auto f) {
      using I = decltype(i);
      using F = decltype(f);
      if (to_int)
        detail::launch("cast", int_cast_kernel<F, I>, detail::grid_for(count), detail::kThreads, 0, stream,
                       static_cast<const F*>(x), static_cast<I*>(y), count);
      else
        detail::launch("cast", int_cast_kernel<I, F>, detail::grid_for(count), detail::kThreads, 0, stream,
                       static_cast<const I*>(x), static_cast<F*>(y), count);
    });
  });
}

struct InverseSigmoidOp {
  float eps;
  template <int N>
  __device__ void operator()(float (&a)[N], const float (&)[N]) const {
#pragma unroll
    for (int k = 0; k < N; ++k) a[k] = inverse_sigmoid_f32(a[k], eps);
  }
};

// The inverse_sigmoid, the f32 add (AddOp's f32 math: no fast exp) and both
// casts of the unfused nodes, element by element: the same bits. Without ref,
// an f32 activation and its narrowing cast (ActOp's f32 math). Counts are
// small (queries x 4), so one element a thread.
template <typename Td, typename Tn, Activation A>
__global__ void box_refine_kernel(const Td* delta, const float* ref, float eps, float* y, Tn* y_narrow, int64_t count) {
  dev::enter_grid();
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < count; e += stride) {
    const float d = dev::to_f32(delta[e]);
    const float v = act<A, false>(ref ? d + (eps < 0.f ? ref[e] : inverse_sigmoid_f32(ref[e], eps)) : d);
    y[e] = v;
    if (y_narrow) y_narrow[e] = dev::from_f32<Tn>(v);
  }
}

}  // namespace

void box_refine(const void* delta, DType delta_dt, const float* ref, float eps, float* y, void* y_narrow, DType narrow_dt,
                int64_t count, Activation act_kind, cudaStream_t stream) {
  if (count <= 0) return;
  if (act_kind != Activation::None && act_kind != Activation::Sigmoid)
    fail_runtime("cuda box_refine: activation ", activation_name(act_kind), " (none or sigmoid)");
  if (y_narrow && narrow_dt != DType::F16 && narrow_dt != DType::BF16)
    fail_runtime("cuda box_refine: narrow output ", dtype_name(narrow_dt), " (f16 or bf16)");
  detail::dispatch_float(delta_dt, "box_refine", [&](auto d) {
    using Td = decltype(d);
    auto go = [&](auto n, auto a_c) {
      using Tn = decltype(n);
      constexpr Activation A = decltype(a_c)::value;
      detail::launch("box_refine", box_refine_kernel<Td, Tn, A>, detail::grid_for(count), detail::kThreads, 0, stream,
          static_cast<const Td*>(delta), ref, eps, y, static_cast<Tn*>(y_narrow), count);
    };
    auto with_act = [&](auto n) {
      if (act_kind == Activation::Sigmoid) go(n, std::integral_constant<Activation, Activation::Sigmoid>{});
      else go(n, std::integral_constant<Activation, Activation::None>{});
    };
    if (narrow_dt == DType::BF16) with_act(__nv_bfloat16{});
    else with_act(__half{});
  });
}

void inverse_sigmoid(const void* x, void* y, DType dt, int64_t count, float eps, cudaStream_t stream) {
  detail::dispatch_float(dt, "inverse_sigmoid", [&](auto t) {
    using T = decltype(t);
    launch_map<T, T, false>(x, nullptr, y, count, InverseSigmoidOp{eps}, stream, "inverse_sigmoid");
  });
}

void cast(const void* x, DType xdt, void* y, DType ydt, int64_t count, cudaStream_t stream) {
  if (count <= 0) return;
  if (xdt == ydt) {
    if (x != y) KILN_CUDA_CHECK(cudaMemcpyAsync(y, x, size_t(count) * dtype_size(xdt), cudaMemcpyDeviceToDevice, stream));
    return;
  }
  // Floats and 8-bit codes (e4m3, i8: values as the codes' values) convert here; indices in int_cast.
  const auto stored = [](DType t) { return dtype_is_float(t) || t == DType::I8; };
  if (!stored(xdt) || !stored(ydt)) return int_cast(x, xdt, y, ydt, count, stream);
  detail::dispatch_storage(xdt, "cast", [&](auto ti) {
    detail::dispatch_storage(ydt, "cast", [&](auto to) {
      using Ti = decltype(ti);
      using To = decltype(to);
      if constexpr (!std::is_same_v<Ti, To>) launch_map<Ti, To, false>(x, nullptr, y, count, CopyOp{}, stream, "cast");
    });
  });
}

namespace {

// y[r, ch] = act(a[r, ch] + b[r, ch]) where each tensor is a channel window
// of a wider NHWC buffer (its own pixel stride): Res2Net's chain add reads a
// chunk of the 1x1 conv's output and the previous 3x3's output in place.
// To a code type: act none or ReLU, the sum times inv_scale, encoded (CodeOut).
template <typename T, typename To, int V, Activation A>
__global__ void add_strided_kernel(const T* __restrict__ a, int as, const T* __restrict__ b, int bs, To* __restrict__ y,
                                   int ys, int64_t rows, int c, float inv_scale) {
  dev::enter_grid();
  dev::RowWalk w;
  if (!dev::row_walk(uint32_t(c / V), w)) return;
  const int ch = int(w.col) * V;
  for (int64_t r = w.row; r < rows; r += w.step) {
    float fa[V], fb[V];
    dev::load_vec<T, V>(a + r * as + ch, fa);
    dev::load_vec<T, V>(b + r * bs + ch, fb);
#pragma unroll
    for (int k = 0; k < V; ++k) fa[k] = dev::act<A, dev::kFastMath<T>>(__fadd_rn(fa[k], fb[k]));
    dev::to_code_units<To, V>(fa, inv_scale);
    dev::store_vec<To, V>(y + r * ys + ch, fa);
  }
}

// Codes are written after none or ReLU only: both are exact in f32, so the
// CPU emulation (quant::quantize_value of the f32 result) gives the same codes.
void expect_code_activation(Activation a, const CodeOut& code, const char* op) {
  if (code.on() && a != Activation::None && a != Activation::Relu)
    fail_runtime("cuda ", op, ": writing ", dtype_name(code.dt), " codes after ", activation_name(a), " (none or ReLU only)");
}

// dispatch_act, narrowed to none and ReLU when the output is codes (fewer kernels to build).
template <typename To, typename F>
void dispatch_out_act(Activation a, F&& f) {
  if constexpr (dev::kIsCode<To>) {
    if (a == Activation::Relu) f(std::integral_constant<Activation, Activation::Relu>{});
    else f(std::integral_constant<Activation, Activation::None>{});
  } else {
    detail::dispatch_act(a, std::forward<F>(f));
  }
}

}  // namespace

void add_strided_nhwc(const void* a, int a_stride, const void* b, int b_stride, void* y, int y_stride, int64_t rows, int c,
                      DType dt, Activation act_kind, cudaStream_t stream, const CodeOut& code) {
  if (rows <= 0 || c <= 0) return;
  if (a_stride < c || b_stride < c || y_stride < c)
    fail_runtime("cuda add_strided_nhwc: pixel strides ", a_stride, "/", b_stride, "/", y_stride, " below ", c, " channels");
  expect_code_activation(act_kind, code, "add_strided_nhwc");
  detail::dispatch_float_out(dt, code, "add_strided_nhwc", [&](auto t, auto o) {
    using T = decltype(t);
    using To = decltype(o);
    constexpr int kV = dev::kVec16Of<T, To>;
    const bool vec = c % kV == 0 && a_stride % kV == 0 && b_stride % kV == 0 && y_stride % kV == 0 &&
                     detail::aligned16(a) && detail::aligned16(b) && detail::aligned16(y);
    dispatch_out_act<To>(act_kind, [&](auto a_c) {
      constexpr Activation A = decltype(a_c)::value;
      const auto* ta = static_cast<const T*>(a);
      const auto* tb = static_cast<const T*>(b);
      auto* ty = static_cast<To*>(y);
      if (vec)
        detail::launch("add_strided_nhwc", add_strided_kernel<T, To, kV, A>, detail::grid_rows(rows, c / kV),
            detail::kThreads, 0, stream, ta, a_stride, tb, b_stride, ty, y_stride, rows, c, code.inv_scale);
      else
        detail::launch("add_strided_nhwc", add_strided_kernel<T, To, 1, A>, detail::grid_rows(rows, c), detail::kThreads, 0,
            stream, ta, a_stride, tb, b_stride, ty, y_stride, rows, c, code.inv_scale);
    });
  });
}

void add(const void* a, const void* b, void* y, DType dt, int64_t count, Activation act_kind, cudaStream_t stream,
         const CodeOut& code, int64_t b_period) {
  expect_code_activation(act_kind, code, "add");
  detail::dispatch_float_out(dt, code, "add", [&](auto t, auto o) {
    using T = decltype(t);
    using To = decltype(o);
    dispatch_out_act<To>(act_kind, [&](auto a_c) {
      constexpr Activation A = decltype(a_c)::value;
      if constexpr (dev::kIsCode<To>)
        launch_map<T, To, true>(a, b, y, count, AddCodeOp<A>{code.inv_scale}, stream, "add", b_period);
      else
        launch_map<T, T, true>(a, b, y, count, AddOp<A, dev::kFastMath<T>>{}, stream, "add", b_period);
    });
  });
}

void mul(const void* a, const void* b, void* y, DType dt, int64_t count, cudaStream_t stream, const CodeOut& code,
         int64_t b_period) {
  detail::dispatch_float_out(dt, code, "mul", [&](auto t, auto o) {
    using T = decltype(t);
    using To = decltype(o);
    launch_map<T, To, true>(a, b, y, count, MulOp{code.on() ? code.inv_scale : 1.f}, stream, "mul", b_period);
  });
}

void activation(const void* x, void* y, DType dt, int64_t count, Activation act_kind, cudaStream_t stream) {
  if (act_kind == Activation::None) {
    cast(x, dt, y, dt, count, stream);
    return;
  }
  detail::dispatch_float(dt, "activation", [&](auto t) {
    using T = decltype(t);
    detail::dispatch_act(act_kind, [&](auto a_c) {
      launch_map<T, T, false>(x, nullptr, y, count, ActOp<decltype(a_c)::value, dev::kFastMath<T>>{}, stream, "activation");
    });
  });
}

void batch_norm_nhwc(const void* x, void* y, DType dt, int64_t rows, int c, const float* scale, const float* shift,
                     Activation act_kind, cudaStream_t stream) {
  if (rows <= 0 || c <= 0) return;
  detail::dispatch_float(dt, "batch_norm_nhwc", [&](auto t) {
    using T = decltype(t);
    constexpr int kV = dev::kVec16<T>;
    const bool vec = c % kV == 0 && detail::aligned16(x) && detail::aligned16(y);
    const auto* tx = static_cast<const T*>(x);
    auto* ty = static_cast<T*>(y);
    detail::dispatch_act(act_kind, [&](auto a_c) {
      constexpr Activation A = decltype(a_c)::value;
      if (vec) {
        const int cols = c / kV;
        detail::launch("batch_norm_nhwc", batch_norm_kernel<T, kV, A>, detail::grid_rows((rows + 1) / 2, cols),
            detail::kThreads, 0, stream, tx, ty, rows, c, scale, shift);
      } else {
        detail::launch("batch_norm_nhwc", batch_norm_kernel<T, 1, A>, detail::grid_rows((rows + 1) / 2, c),
            detail::kThreads, 0, stream, tx, ty, rows, c, scale, shift);
      }
    });
  });
}

void mul_channel_nhwc(const void* x, const void* s, void* y, DType dt, int n, int hw, int c, cudaStream_t stream,
                      const CodeOut& code) {
  if (n <= 0 || hw <= 0 || c <= 0) return;
  const int64_t rows = int64_t(n) * hw;
  detail::dispatch_float_out(dt, code, "mul_channel_nhwc", [&](auto t, auto o) {
    using T = decltype(t);
    using To = decltype(o);
    constexpr int kV = dev::kVec16Of<T, To>;
    const auto* tx = static_cast<const T*>(x);
    const auto* ts = static_cast<const T*>(s);
    auto* ty = static_cast<To*>(y);
    if (c % kV == 0 && detail::aligned16(x) && detail::aligned16(s) && detail::aligned16(y)) {
      detail::launch("mul_channel_nhwc", mul_channel_kernel<T, To, kV>, detail::grid_rows(rows, c / kV), detail::kThreads,
          0, stream, tx, ts, ty, rows, hw, c, code.inv_scale);
    } else {
      detail::launch("mul_channel_nhwc", mul_channel_kernel<T, To, 1>, detail::grid_rows(rows, c), detail::kThreads, 0,
          stream, tx, ts, ty, rows, hw, c, code.inv_scale);
    }
  });
}

}  // namespace kiln::cuda
