// Layout kernels: NCHW f32 <-> NHWC engine storage (transpose with the cast
// fused) and the strided channel copy behind concat and slice.
#include <algorithm>
#include <type_traits>

#include "backends/cuda/device_common.cuh"
#include "backends/cuda/kernels.hpp"

namespace kiln::cuda {
namespace {

using dev::from_f32;
using dev::to_f32;

constexpr int kTile = 32;
constexpr int kTileRows = 8;  // a 32x8 block moves a 32x32 tile, 4 elements per thread

// Per image: x is [c, hw], y is [hw, c]. Reads run along hw and writes along
// c, both coalesced; the tile row is padded by one word so the transposed
// reads from shared memory hit 32 different banks.
template <typename T>
__global__ void nchw_to_nhwc_kernel(const float* __restrict__ x, T* __restrict__ y, int c, int hw) {
  dev::enter_grid();
  __shared__ float tile[kTile][kTile + 1];
  const int p0 = blockIdx.x * kTile, c0 = blockIdx.y * kTile;
  const int64_t img = int64_t(blockIdx.z) * c * hw;
  for (int j = threadIdx.y; j < kTile; j += kTileRows) {
    const int ch = c0 + j, p = p0 + threadIdx.x;
    if (ch < c && p < hw) tile[j][threadIdx.x] = x[img + int64_t(ch) * hw + p];
  }
  __syncthreads();
  for (int j = threadIdx.y; j < kTile; j += kTileRows) {
    const int p = p0 + j, ch = c0 + threadIdx.x;
    if (ch < c && p < hw) y[img + int64_t(p) * c + ch] = from_f32<T>(tile[threadIdx.x][j]);
  }
}

// Few channels (RGB input): a 32-channel tile would leave most threads idle,
// so each thread writes one pixel's channels; reads stay coalesced per plane.
template <typename T>
__global__ void nchw_to_nhwc_small_c_kernel(const float* __restrict__ x, T* __restrict__ y, int c, int hw,
                                            int64_t pixels) {
  dev::enter_grid();
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t q = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; q < pixels; q += stride) {
    const int64_t b = q / hw, p = q % hw;
    const float* src = x + b * c * hw + p;
    T* dst = y + q * c;
    for (int ch = 0; ch < c; ++ch) dst[ch] = from_f32<T>(src[int64_t(ch) * hw]);
  }
}

// Per image: x is [hw, c] (engine type), y is [c, hw] in Y (f32 for engine
// outputs, the engine type for a flatten of a map wider than 1x1).
template <typename T, typename Y>
__global__ void nhwc_to_nchw_kernel(const T* __restrict__ x, Y* __restrict__ y, int c, int hw) {
  dev::enter_grid();
  __shared__ float tile[kTile][kTile + 1];
  const int c0 = blockIdx.x * kTile, p0 = blockIdx.y * kTile;
  const int64_t img = int64_t(blockIdx.z) * c * hw;
  for (int j = threadIdx.y; j < kTile; j += kTileRows) {
    const int p = p0 + j, ch = c0 + threadIdx.x;
    if (ch < c && p < hw) tile[j][threadIdx.x] = to_f32(x[img + int64_t(p) * c + ch]);
  }
  __syncthreads();
  for (int j = threadIdx.y; j < kTile; j += kTileRows) {
    const int ch = c0 + j, p = p0 + threadIdx.x;
    if (ch < c && p < hw) y[img + int64_t(ch) * hw + p] = from_f32<Y>(tile[threadIdx.x][j]);
  }
}

// Copies `cols` words per row between two row-strided buffers; Word is the
// widest unsigned type that every offset and stride allows (up to 16 bytes),
// so the copy is dtype-agnostic.
template <typename Word>
__global__ void copy_rows_kernel(const Word* __restrict__ x, int64_t x_stride, Word* __restrict__ y,
                                 int64_t y_stride, uint32_t cols, int64_t rows) {
  dev::enter_grid();
  dev::RowWalk w;
  if (!dev::row_walk(cols, w)) return;
  for (int64_t r = w.row; r < rows; r += w.step) y[r * y_stride + w.col] = x[r * x_stride + w.col];
}

template <typename Word>
void launch_copy_rows(const char* x, int64_t x_row_bytes, char* y, int64_t y_row_bytes, int64_t bytes,
                      int64_t rows, cudaStream_t stream) {
  const int64_t cols = bytes / int64_t(sizeof(Word));
  detail::launch("copy_channels_nhwc", copy_rows_kernel<Word>, detail::grid_rows(rows, cols), detail::kThreads, 0, stream,
      reinterpret_cast<const Word*>(x), x_row_bytes / int64_t(sizeof(Word)), reinterpret_cast<Word*>(y),
      y_row_bytes / int64_t(sizeof(Word)), uint32_t(cols), rows);
}

struct ConcatArgs {
  const void* x[kMaxConcatInputs];
  int c[kMaxConcatInputs];
  int begin[kMaxConcatInputs];
  int sh[kMaxConcatInputs], sw[kMaxConcatInputs];  // nearest-upsample factors (0: none; ConcatUpsample)
  int h, w;                                        // y's pixels per image, when some input is upsampled
  int n;
};

// The inputs and their column ranges in words of `word` units (chunks in
// those units' multiples), no upsample.
ConcatArgs concat_args(const std::vector<const void*>& xs, const std::vector<int64_t>& chunks, int64_t word) {
  ConcatArgs a{};
  a.n = int(xs.size());
  for (int k = 0, begin = 0; k < a.n; ++k) {
    a.x[k] = xs[k];
    a.c[k] = int(chunks[size_t(k)] / word);
    a.begin[k] = begin;
    begin += a.c[k];
  }
  return a;
}

// One thread per output element (Elem = the dtype's bit pattern: the copy is
// exact); the source input is found by a short scan of the channel offsets.
template <typename Elem, typename I>
__global__ void concat_kernel(ConcatArgs a, Elem* __restrict__ y, int y_c, I total) {
  dev::enter_grid();
  for (I i = I(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += I(gridDim.x) * blockDim.x) {
    const I r = i / y_c;
    const int ch = int(i - r * y_c);
    int k = 0;
    while (k + 1 < a.n && ch >= a.begin[k + 1]) ++k;
    I src = r;
    if (a.sh[k]) {  // y's pixel (i, j) of its image reads pixel (i / sh, j / sw) of the smaller map
      const I hw = I(a.h) * a.w, img = r / hw;
      const int p = int(r - img * hw), pi = p / a.w, pj = p - pi * a.w;
      src = (img * (a.h / a.sh[k]) + pi / a.sh[k]) * (a.w / a.sw[k]) + pj / a.sw[k];
    }
    y[i] = static_cast<const Elem*>(a.x[k])[src * a.c[k] + (ch - a.begin[k])];
  }
}

}  // namespace

namespace {

struct SplitArgs {
  void* y[kMaxSplitOutputs];
  int c[kMaxSplitOutputs];      // channels of output k
  int begin[kMaxSplitOutputs];  // its first channel in x
  int at[kMaxSplitOutputs + 1]; // prefix sums of c: output k owns columns [at[k], at[k+1]) of the joint space
  int n;
};

// One thread per element over the joint [rows, at[n]] space of n tensors
// side by side (tensor k owns columns [at[k], at[k+1])): f(k, r, ch, j) for
// tensor k's row r, channel ch, joint column j. Split and converting concat.
template <typename F>
__device__ __forceinline__ void joint_walk(const int* at, int n, int64_t total, F&& f) {
  const int cols = at[n];
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / cols;
    const int j = int(i - r * cols);
    int k = 0;
    while (k + 1 < n && j >= at[k + 1]) ++k;
    f(k, r, j - at[k], j);
  }
}

// The inverse of concat_kernel: exact copies of the bit patterns.
template <typename Elem>
__global__ void split_kernel(const Elem* __restrict__ x, int x_c, SplitArgs a, int64_t total) {
  dev::enter_grid();
  joint_walk(a.at, a.n, total, [&](int k, int64_t r, int ch, int) {
    static_cast<Elem*>(a.y[k])[r * a.c[k] + ch] = x[r * x_c + a.begin[k] + ch];
  });
}

// split_kernel where some outputs hold codes: kind[k] 0 copies, 1 writes e4m3,
// 2 writes i8 codes of f32(x * inv[k]).
struct SplitCodes {
  int kind[kMaxSplitOutputs];
  float inv[kMaxSplitOutputs];
};

template <typename Ti>
__global__ void split_codes_kernel(const Ti* __restrict__ x, int x_c, SplitArgs a, SplitCodes q, int64_t total) {
  dev::enter_grid();
  joint_walk(a.at, a.n, total, [&](int k, int64_t r, int ch, int) {
    const Ti v = x[r * x_c + a.begin[k] + ch];
    const int64_t at = r * a.c[k] + ch;
    if (q.kind[k] == 0) static_cast<Ti*>(a.y[k])[at] = v;
    else if (q.kind[k] == 1) static_cast<__nv_fp8_e4m3*>(a.y[k])[at] = from_f32<__nv_fp8_e4m3>(__fmul_rn(to_f32(v), q.inv[k]));
    else static_cast<int8_t*>(a.y[k])[at] = from_f32<int8_t>(__fmul_rn(to_f32(v), q.inv[k]));
  });
}

}  // namespace

void split_channels_nhwc(const void* x, int x_c, const std::vector<void*>& ys, const std::vector<int>& begins,
                         const std::vector<int>& cs, int64_t rows, DType dt, cudaStream_t stream,
                         const std::vector<CodeOut>& codes) {
  if (ys.size() != cs.size() || ys.size() != begins.size() || ys.empty() || ys.size() > size_t(kMaxSplitOutputs))
    fail_runtime("cuda split_channels_nhwc: ", ys.size(), " outputs (1..", kMaxSplitOutputs, "), ", begins.size(),
                 " offsets, ", cs.size(), " channel counts");
  SplitArgs a{};
  a.n = int(ys.size());
  for (int k = 0; k < a.n; ++k) {
    if (begins[k] < 0 || cs[k] < 0 || begins[k] + cs[k] > x_c)
      fail_runtime("cuda split_channels_nhwc: channels [", begins[k], ", +", cs[k], ") outside the input's ", x_c);
    a.y[k] = ys[k];
    a.c[k] = cs[k];
    a.begin[k] = begins[k];
    a.at[k + 1] = a.at[k] + cs[k];
  }
  const int64_t total = rows * a.at[a.n];
  if (total <= 0) return;
  if (std::any_of(codes.begin(), codes.end(), [](const CodeOut& c) { return c.on(); })) {
    if (codes.size() != ys.size())
      fail_runtime("cuda split_channels_nhwc: ", codes.size(), " output code types for ", ys.size(), " outputs");
    SplitCodes q{};
    for (int k = 0; k < a.n; ++k) {
      q.kind[k] = !codes[k].on() ? 0 : codes[k].dt == DType::F8E4M3 ? 1 : 2;
      q.inv[k] = codes[k].inv_scale;
    }
    detail::dispatch_float(dt, "split_channels_nhwc", [&](auto t) {
      using T = decltype(t);
      detail::launch("split_channels_nhwc", split_codes_kernel<T>, detail::grid_for(total), detail::kThreads, 0, stream,
          static_cast<const T*>(x), x_c, a, q, total);
    });
    return;
  }
  switch (dtype_size(dt)) {
    case 1: detail::launch("split_channels_nhwc", split_kernel<uint8_t>, detail::grid_for(total), detail::kThreads, 0,
                stream, static_cast<const uint8_t*>(x), x_c, a, total); break;
    case 2: detail::launch("split_channels_nhwc", split_kernel<uint16_t>, detail::grid_for(total), detail::kThreads, 0,
                stream, static_cast<const uint16_t*>(x), x_c, a, total); break;
    case 4: detail::launch("split_channels_nhwc", split_kernel<uint32_t>, detail::grid_for(total), detail::kThreads, 0,
                stream, static_cast<const uint32_t*>(x), x_c, a, total); break;
    default: fail_runtime("cuda split_channels_nhwc: unsupported element size ", dtype_size(dt));
  }
}

namespace {

// concat_rows_masked: one thread per V-element word of y (V = 16 bytes of T
// where every chunk, c and address allow, else 1); a word never straddles a
// token row (c % V == 0), so its mask value is one.
template <typename T, int V>
__global__ void concat_masked_kernel(ConcatArgs a, T* __restrict__ y, T* __restrict__ y2, const T* __restrict__ mask, int y_c,
                                     int token_words, int64_t total) {
  dev::enter_grid();
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / y_c;
    const int col = int(i - r * y_c);
    int k = 0;
    while (k + 1 < a.n && col >= a.begin[k + 1]) ++k;
    const T* src = static_cast<const T*>(a.x[k]) + (r * a.c[k] + (col - a.begin[k])) * V;
    using Word = std::conditional_t<V == 1, T, uint4>;  // the copy moves bits (NaN payloads too)
    const Word word = *reinterpret_cast<const Word*>(src);
    *reinterpret_cast<Word*>(y + i * V) = word;
    const T* e = reinterpret_cast<const T*>(&word);
    const float m = dev::to_f32(mask[col / token_words]);
    float v[V];
#pragma unroll
    for (int j = 0; j < V; ++j) v[j] = dev::to_f32(e[j]) * m;
    dev::store_vec<T, V>(y2 + i * V, v);
  }
}

}  // namespace

void concat_rows_masked(const std::vector<const void*>& xs, const std::vector<int64_t>& chunk_elems, void* y, void* y2,
                        const void* mask, int64_t rows, int64_t c, DType dt, cudaStream_t stream) {
  if (xs.size() != chunk_elems.size() || xs.empty() || xs.size() > size_t(kMaxConcatInputs))
    fail_runtime("cuda concat_rows_masked: ", xs.size(), " inputs (1..", kMaxConcatInputs, "), ", chunk_elems.size(), " chunk sizes");
  if (c <= 0) fail_runtime("cuda concat_rows_masked: token rows of ", c, " elements");
  int64_t y_elems = 0;
  bool wide = c % 8 == 0;
  for (size_t k = 0; k < xs.size(); ++k) {
    if (chunk_elems[k] < 0 || chunk_elems[k] % c) fail_runtime("cuda concat_rows_masked: input ", k, " is not whole token rows of ", c);
    y_elems += chunk_elems[k];
    wide &= detail::aligned16(xs[k]);
  }
  if (rows <= 0 || y_elems <= 0) return;
  wide &= detail::aligned16(y) && detail::aligned16(y2);
  detail::dispatch_float(dt, "concat_rows_masked", [&](auto t) {
    using T = decltype(t);
    constexpr int V16 = 16 / int(sizeof(T));
    auto go = [&](auto vc) {
      constexpr int V = decltype(vc)::value;
      if (y_elems / V > int64_t(0x7fffffff)) fail_runtime("cuda concat_rows_masked: rows of ", y_elems, " elements");
      const ConcatArgs a = concat_args(xs, chunk_elems, V);
      const int y_c = int(y_elems / V);
      const int64_t total = rows * y_c;
      detail::launch("concat_rows_masked", concat_masked_kernel<T, V>, detail::grid_for(total), detail::kThreads, 0, stream, a,
                     static_cast<T*>(y), static_cast<T*>(y2), static_cast<const T*>(mask), y_c, int(c / V), total);
    };
    if (wide && c % V16 == 0) go(std::integral_constant<int, V16>{});
    else go(std::integral_constant<int, 1>{});
  });
}

void concat_rows(const std::vector<const void*>& xs, const std::vector<int64_t>& chunk_bytes, void* y, int64_t rows,
                 cudaStream_t stream, const ConcatUpsample* up) {
  if (xs.size() != chunk_bytes.size() || xs.empty() || xs.size() > size_t(kMaxConcatInputs))
    fail_runtime("cuda concat_rows: ", xs.size(), " inputs (1..", kMaxConcatInputs, "), ", chunk_bytes.size(), " chunk sizes");
  if (up) {
    if (up->factors.size() != xs.size() || up->h <= 0 || up->w <= 0 || rows % (int64_t(up->h) * up->w))
      fail_runtime("cuda concat_rows: upsample factors for ", up->factors.size(), " of ", xs.size(), " inputs, ", rows,
                   " rows of ", up->h, "x", up->w, " images");
    for (const auto& [sh, sw] : up->factors)
      if (sh < 0 || sw < 0 || (sh > 0) != (sw > 0) || (sh && (up->h % sh || up->w % sw)))
        fail_runtime("cuda concat_rows: upsample factors ", sh, "x", sw, " do not divide ", up->h, "x", up->w);
  }
  // The widest word every chunk and address allows, as copy_channels_nhwc's rows.
  uint64_t bits = uint64_t(reinterpret_cast<uintptr_t>(y));
  int64_t y_bytes = 0;
  for (size_t k = 0; k < xs.size(); ++k) {
    if (chunk_bytes[k] < 0) fail_runtime("cuda concat_rows: input ", k, " has a negative chunk");
    bits |= uint64_t(reinterpret_cast<uintptr_t>(xs[k])) | uint64_t(chunk_bytes[k]);
    y_bytes += chunk_bytes[k];
  }
  if (rows <= 0 || y_bytes <= 0) return;
  const int word = bits % 16 == 0 ? 16 : bits % 8 == 0 ? 8 : bits % 4 == 0 ? 4 : bits % 2 == 0 ? 2 : 1;
  if (y_bytes / word > int64_t(0x7fffffff)) fail_runtime("cuda concat_rows: rows of ", y_bytes, " bytes (at most 2^31 words)");
  ConcatArgs a = concat_args(xs, chunk_bytes, word);
  for (int k = 0; up && k < a.n; ++k) a.sh[k] = up->factors[size_t(k)].first, a.sw[k] = up->factors[size_t(k)].second;
  a.h = up ? up->h : 0;
  a.w = up ? up->w : 0;
  const int y_c = int(y_bytes / word);
  const int64_t total = rows * y_c;
  auto go = [&](auto w) {
    using Word = decltype(w);
    if (total < int64_t(INT32_MAX))  // 32-bit index math where it fits (64-bit division is slow)
      detail::launch("concat_rows", concat_kernel<Word, int32_t>, detail::grid_for(total), detail::kThreads, 0, stream,
                     a, static_cast<Word*>(y), y_c, int32_t(total));
    else
      detail::launch("concat_rows", concat_kernel<Word, int64_t>, detail::grid_for(total), detail::kThreads, 0, stream,
                     a, static_cast<Word*>(y), y_c, total);
  };
  switch (word) {
    case 16: go(uint4{}); break;
    case 8: go(uint2{}); break;
    case 4: go(uint32_t{}); break;
    case 2: go(uint16_t{}); break;
    default: go(uint8_t{}); break;
  }
}

void concat_channels_nhwc(const std::vector<const void*>& xs, const std::vector<int>& cs, void* y, int64_t rows, DType dt,
                          cudaStream_t stream, const ConcatUpsample* up) {
  if (xs.size() != cs.size() || xs.empty()) fail_runtime("cuda concat_channels_nhwc: ", xs.size(), " inputs, ", cs.size(), " channel counts");
  int y_c = 0;
  for (int c : cs) y_c += c;
  if (rows <= 0 || y_c <= 0) return;
  if (xs.size() > size_t(kMaxConcatInputs)) {
    if (up) fail_runtime("cuda concat_channels_nhwc: upsampled inputs in a concat of more than ", kMaxConcatInputs, " inputs");
    int begin = 0;
    for (size_t k = 0; k < xs.size(); ++k) {
      copy_channels_nhwc(xs[k], cs[k], 0, y, y_c, begin, cs[k], rows, dt, stream);
      begin += cs[k];
    }
    return;
  }
  // The same bytes as a row-major concat of pixel rows: 16-byte words where
  // the channel counts and addresses allow (concat_rows).
  std::vector<int64_t> chunks;
  for (int c : cs) chunks.push_back(int64_t(c) * int64_t(dtype_size(dt)));
  concat_rows(xs, chunks, y, rows, stream, up);
}

namespace {

struct ConcatCodeArgs {
  const void* x[kMaxConcatInputs];
  int c[kMaxConcatInputs];       // channels of input k
  int stride[kMaxConcatInputs];  // its pixel stride (elements)
  int at[kMaxConcatInputs + 1];  // prefix sums of c: input k owns columns [at[k], at[k+1]) of this launch
  int n;
};

// One thread per output element of this launch's inputs (y_c the output's
// channels, y_begin the first one this launch writes): the value as f32,
// times inv_scale, encoded (CodeOut).
template <typename Ti, typename To>
__global__ void concat_codes_kernel(ConcatCodeArgs a, To* __restrict__ y, int y_c, int y_begin, int64_t total,
                                    float inv_scale) {
  dev::enter_grid();
  joint_walk(a.at, a.n, total, [&](int k, int64_t r, int ch, int j) {
    const float v = to_f32(static_cast<const Ti*>(a.x[k])[r * a.stride[k] + ch]);
    y[r * y_c + y_begin + j] = from_f32<To>(__fmul_rn(v, inv_scale));
  });
}

}  // namespace

void concat_to_codes_nhwc(const std::vector<const void*>& xs, const std::vector<int>& strides, const std::vector<int>& cs,
                          DType xdt, void* y, int64_t rows, const CodeOut& code, cudaStream_t stream) {
  if (xs.size() != cs.size() || xs.size() != strides.size() || xs.empty())
    fail_runtime("cuda concat_to_codes_nhwc: ", xs.size(), " inputs, ", strides.size(), " strides, ", cs.size(), " channel counts");
  if (!code.on()) fail_runtime("cuda concat_to_codes_nhwc: output type ", dtype_name(code.dt), " is not a code type");
  int y_c = 0;
  for (size_t k = 0; k < cs.size(); ++k) {
    if (cs[k] < 0 || strides[k] < cs[k])
      fail_runtime("cuda concat_to_codes_nhwc: input ", k, " has ", cs[k], " channels at pixel stride ", strides[k]);
    y_c += cs[k];
  }
  if (rows <= 0 || y_c <= 0) return;
  detail::dispatch_float_out(xdt, code, "concat_to_codes_nhwc", [&](auto t, auto o) {
    using Ti = decltype(t);
    using To = decltype(o);
    if constexpr (dev::kIsCode<To>) {
      for (size_t first = 0, begin = 0; first < xs.size(); first += kMaxConcatInputs) {
        ConcatCodeArgs a{};
        a.n = int(std::min(xs.size() - first, size_t(kMaxConcatInputs)));
        for (int k = 0; k < a.n; ++k) {
          a.x[k] = xs[first + k];
          a.c[k] = cs[first + k];
          a.stride[k] = strides[first + k];
          a.at[k + 1] = a.at[k] + a.c[k];
        }
        const int64_t total = rows * a.at[a.n];
        if (total > 0)
          detail::launch("concat_to_codes_nhwc", concat_codes_kernel<Ti, To>, detail::grid_for(total), detail::kThreads, 0,
              stream, a, static_cast<To*>(y), y_c, int(begin), total, code.inv_scale);
        begin += size_t(a.at[a.n]);
      }
    }
  });
}

void nchw_f32_to_nhwc(const float* x, void* y, DType ydt, int n, int c, int h, int w, cudaStream_t stream) {
  if (n <= 0 || c <= 0 || h <= 0 || w <= 0) return;
  if (n > 65535) fail_runtime("cuda nchw_f32_to_nhwc: batch ", n, " exceeds the grid limit 65535");
  const int hw = h * w;
  detail::dispatch_storage(ydt, "nchw_f32_to_nhwc", [&](auto t) {
    using T = decltype(t);
    T* ty = static_cast<T*>(y);
    if (c <= 4) {
      const int64_t pixels = int64_t(n) * hw;
      detail::launch("nchw_f32_to_nhwc", nchw_to_nhwc_small_c_kernel<T>, detail::grid_for(pixels), detail::kThreads, 0,
          stream, x, ty, c, hw, pixels);
    } else {
      const dim3 grid((hw + kTile - 1) / kTile, (c + kTile - 1) / kTile, n);
      detail::launch("nchw_f32_to_nhwc", nchw_to_nhwc_kernel<T>, grid, dim3(kTile, kTileRows), 0, stream, x, ty, c, hw);
    }
  });
}

namespace {

// x [n, hw, c] in T -> y [n, c, hw] in Y.
template <typename Y>
void launch_nhwc_to_nchw(const char* what, const void* x, DType xdt, Y* y, int n, int c, int h, int w, cudaStream_t stream) {
  if (n <= 0 || c <= 0 || h <= 0 || w <= 0) return;
  if (n > 65535) fail_runtime("cuda ", what, ": batch ", n, " exceeds the grid limit 65535");
  const int hw = h * w;
  if ((hw + kTile - 1) / kTile > 65535) fail_runtime("cuda ", what, ": ", hw, " pixels per image is too many");
  detail::dispatch_storage(xdt, what, [&](auto t) {
    using T = decltype(t);
    const dim3 grid((c + kTile - 1) / kTile, (hw + kTile - 1) / kTile, n);
    detail::launch(what, nhwc_to_nchw_kernel<T, Y>, grid, dim3(kTile, kTileRows), 0, stream, static_cast<const T*>(x), y, c, hw);
  });
}

}  // namespace

void nhwc_to_nchw_f32(const void* x, DType xdt, float* y, int n, int c, int h, int w, cudaStream_t stream) {
  launch_nhwc_to_nchw("nhwc_to_nchw_f32", x, xdt, y, n, c, h, w, stream);
}

void nhwc_to_nchw(const void* x, void* y, DType dt, int n, int c, int h, int w, cudaStream_t stream) {
  detail::dispatch_storage(dt, "nhwc_to_nchw", [&](auto t) {
    using T = decltype(t);
    launch_nhwc_to_nchw("nhwc_to_nchw", x, dt, static_cast<T*>(y), n, c, h, w, stream);
  });
}

void copy_channels_nhwc(const void* x, int x_c, int x_c_begin, void* y, int y_c, int y_c_begin, int c_count,
                        int64_t rows, DType dt, cudaStream_t stream) {
  if (rows <= 0 || c_count <= 0) return;
  if (x_c_begin < 0 || y_c_begin < 0 || x_c_begin + c_count > x_c || y_c_begin + c_count > y_c)
    fail_runtime("cuda copy_channels_nhwc: channels [", x_c_begin, ", +", c_count, ") of ", x_c, " -> [", y_c_begin,
                 ", +", c_count, ") of ", y_c, " out of range");
  const int64_t es = int64_t(dtype_size(dt));
  const char* xb = static_cast<const char*>(x) + x_c_begin * es;
  char* yb = static_cast<char*>(y) + y_c_begin * es;
  const int64_t x_row = x_c * es, y_row = y_c * es, bytes = c_count * es;
  // Whole rows on both sides: one contiguous block, which the copy engine moves.
  if (x_row == bytes && y_row == bytes) {
    KILN_CUDA_CHECK(cudaMemcpyAsync(yb, xb, size_t(rows * bytes), cudaMemcpyDeviceToDevice, stream));
    return;
  }
  const uint64_t bits = uint64_t(reinterpret_cast<uintptr_t>(xb)) | uint64_t(reinterpret_cast<uintptr_t>(yb)) |
                        uint64_t(x_row) | uint64_t(y_row) | uint64_t(bytes);
  if (bits % 16 == 0) launch_copy_rows<uint4>(xb, x_row, yb, y_row, bytes, rows, stream);
  else if (bits % 8 == 0) launch_copy_rows<uint2>(xb, x_row, yb, y_row, bytes, rows, stream);
  else if (bits % 4 == 0) launch_copy_rows<uint32_t>(xb, x_row, yb, y_row, bytes, rows, stream);
  else if (bits % 2 == 0) launch_copy_rows<uint16_t>(xb, x_row, yb, y_row, bytes, rows, stream);
  else launch_copy_rows<uint8_t>(xb, x_row, yb, y_row, bytes, rows, stream);
}

}  // namespace kiln::cuda
