// fp32 CPU kernels: the numerical reference of kiln and the fallback where no
// GPU exists. All tensors are dense NCHW (or [n, features]) row-major fp32
// buffers owned by the caller; kernels know nothing of the IR so they can be
// tested and benchmarked on their own. Invalid parameters throw via
// fail_runtime (the IR layer is expected to have validated shapes already).
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

#include "backends/cpu/thread_pool.hpp"
#include "core/activation.hpp"
#include "core/dtype.hpp"
#include "core/window.hpp"
#include "quant/layer.hpp"

namespace kiln::cpu {

struct Conv2dParams {
  int n = 1, c_in = 1, h = 1, w = 1, c_out = 1, kh = 1, kw = 1;
  int stride_h = 1, stride_w = 1;
  // Asymmetric padding because TensorFlow/ONNX "SAME" pads more at the end.
  int pad_t = 0, pad_l = 0, pad_b = 0, pad_r = 0;
  int dil_h = 1, dil_w = 1;
  int groups = 1;
  int out_h() const { return static_cast<int>(window_out_dim(h, kh, stride_h, pad_t, pad_b, dil_h)); }
  int out_w() const { return static_cast<int>(window_out_dim(w, kw, stride_w, pad_l, pad_r, dil_w)); }
};

// y = act(conv(x, w) + bias + residual).
// x [n, c_in, h, w]; w [c_out, c_in/groups, kh, kw]; bias [c_out] or nullptr;
// residual [n, c_out, out_h, out_w] or nullptr; y like residual. y must not
// alias x, w or residual (the GEMM writes y before the epilogue reads residual).
void conv2d(const Conv2dParams& p, const float* x, const float* w, const float* bias, const float* residual,
            Activation act, float* y, ThreadPool& pool);
// The same convolution of (x + x_add), the sum rounded to `sum_dtype`'s
// storage (as a separate add node would store it) and formed while the
// im2col columns are gathered, so the sum is never written out (Res2Net's
// chain add fused into the 3x3 conv that reads it). x_add like x.
void conv2d_of_sum(const Conv2dParams& p, const float* x, const float* x_add, DType sum_dtype, const float* w,
                   const float* bias, const float* residual, Activation act, float* y, ThreadPool& pool);

// y[n, out] = act(x[n, in] · w[out, in]^T + bias); bias [out] or nullptr.
// A linear node on x[..., in] passes n = its rows (all dims but the last).
void linear(int n, int in, int out, const float* x, const float* w, const float* bias, Activation act, float* y,
            ThreadPool& pool);

struct Pool2dParams {
  int n = 1, c = 1, h = 1, w = 1, kh = 1, kw = 1;
  int stride_h = 1, stride_w = 1;
  int pad_t = 0, pad_l = 0, pad_b = 0, pad_r = 0;
  bool ceil_mode = false;
  bool count_include_pad = true;  // avg only
  int out_h() const;
  int out_w() const;
};

// PyTorch's output-size rule generalised to asymmetric padding: in ceil mode
// the last window must start inside the input or the begin padding, otherwise
// it is dropped.
int pool_out_dim(int in, int k, int stride, int pad_begin, int pad_end, bool ceil_mode);

// Padding acts as -inf. Every pad must be smaller than its kernel size so no
// window is empty.
void max_pool2d(const Pool2dParams& p, const float* x, float* y, ThreadPool& pool);
// PyTorch AvgPool2d: with count_include_pad the divisor counts padded cells
// but never the cells a ceil_mode window reaches beyond the end padding;
// without it the divisor counts only real input cells.
void avg_pool2d(const Pool2dParams& p, const float* x, float* y, ThreadPool& pool);
// y[n, c] = mean of x[n, c, 0..hw).
void global_avg_pool(int n, int c, int hw, const float* x, float* y);

// y = act(a + b); y may alias a or b.
void add(int64_t count, const float* a, const float* b, Activation act, float* y);
// y = act(x); may run in place.
void activation(int64_t count, const float* x, Activation act, float* y);
// y[n, c, :] = x[n, c, :] * s[n, c] (squeeze-excitation scale); may run in place.
void mul_channel(int n, int c, int hw, const float* x, const float* s, float* y);
// Channel concat on NCHW: inputs are (pointer, channels) in output order.
void concat_channels(int n, int hw, const std::vector<std::pair<const float*, int>>& inputs, float* y);
// y = x[:, c_begin : c_begin + c_count] on NCHW.
void slice_channels(int n, int c_total, int hw, int c_begin, int c_count, const float* x, float* y);

// top_k along the middle axis of x [outer, extent, inner]: for each of the
// outer*inner rows, the k largest (largest = false: smallest) values in order,
// equal values by smaller index first, NaN above every number (torch.sort's
// order). values and indices are [outer, k, inner]; indices are stored as
// floats (the backend's activations are f32), exact since extent <= 2^24 is
// checked. Neither output may alias x.
void top_k(int64_t outer, int64_t extent, int64_t inner, int64_t k, bool largest, const float* x, float* values,
           float* indices, ThreadPool& pool);

// layer_norm over rows of c values: y = (x - mean) / sqrt(var + eps) * weight
// + bias (weight, bias may be null; a bias only with a weight), var the biased
// variance; mean and variance in f32 (two passes). May run in place.
void layer_norm(int64_t rows, int64_t c, const float* x, const float* weight, const float* bias, float eps, float* y,
                ThreadPool& pool);
// softmax along the middle axis of x [outer, extent, inner], in f32 with the
// line's max subtracted. May run in place.
void softmax(int64_t outer, int64_t extent, int64_t inner, const float* x, float* y, ThreadPool& pool);
// y[p] = a[p] · b[p] for p < batch: a[p] is [m, k] at a + p * a_stride, b[p]
// [k, n] at b + p * b_stride (stride 0: one operand shared by all), y dense
// [batch, m, n]; f32 accumulation (OpenBLAS). y must not alias a or b.
void matmul(int64_t batch, int64_t m, int64_t k, int64_t n, const float* a, int64_t a_stride, const float* b,
            int64_t b_stride, float* y, ThreadPool& pool);
// y = x permuted: y.shape[d] = shape[perm[d]] (torch.permute); y must not alias x.
void transpose(const std::vector<int64_t>& shape, const std::vector<int64_t>& perm, const float* x, float* y,
               ThreadPool& pool);
// Nearest upsampling of `planes` maps [h, w] by integer factors:
// y[p, i, j] = x[p, i / sh, j / sw].
void upsample_nearest(int64_t planes, int64_t h, int64_t w, int64_t sh, int64_t sw, const float* x, float* y,
                      ThreadPool& pool);
// The position of the first index that is not an integer in [0, extent), or -1.
int64_t first_bad_index(const float* index, int64_t count, int64_t extent);
// y[o, j, :] = x[o, index[o, j], :] with x [outer, extent, inner], index
// [outer, k] (integers held as floats; throws when one is out of range: check
// first_bad_index to name the node), y [outer, k, inner]; shared_x: x is
// [1, extent, inner], read for every o.
void gather(int64_t outer, int64_t extent, int64_t inner, int64_t k, const float* x, const float* index, float* y,
            ThreadPool& pool, bool shared_x = false);
// transformers' inverse_sigmoid: log(max(c, eps) / max(1 - c, eps)) with c =
// x clamped to [0, 1], in f32; NaN stays NaN. May run in place.
void inverse_sigmoid(int64_t count, const float* x, float eps, float* y);

// Multi-scale deformable attention (ms_deform_attn, docs/graph-ir.md): value
// [n, s, heads, d], ref [n, q, 4], off [n, q, heads, p, 2], logits
// [n, q, heads, p] -> y [n, q, heads * d]. Levels: (level_h[l], level_w[l])
// starting at row level_start[l] of s, points[l] points each. f32 throughout.
struct DeformAttnParams {
  int64_t n = 1, s = 1, heads = 1, d = 1, q = 1, p = 1;
  std::vector<int64_t> level_h, level_w, level_start, points;
  float offset_scale = 0.5f;
  bool discrete = false;
};
void ms_deform_attn(const DeformAttnParams& pr, const float* value, const float* ref, const float* off,
                    const float* logits, float* y, ThreadPool& pool);
// Multi-head attention (ops.def `attention`): q [n, lq, heads * d], k [n, lk,
// heads * d], v [n, lk, heads * dv] -> y [n, lq, heads * dv]; per head
// softmax(scale * q_h k_h^T) v_h, f32 throughout (attention.cpp).
struct AttentionParams {
  int64_t n = 1, lq = 1, lk = 1, heads = 1, d = 1, dv = 1;
  float scale = 1.f;
};
void attention(const AttentionParams& p, const float* q, const float* k, const float* v, float* y, ThreadPool& pool);
// The 8-bit ops (quant.cpp; docs/quantization.md "CPU emulation"). 8-bit
// buffers hold code values in code units. Scales per tensor (one) or per
// channel: element i takes scales[(i / inner) % scales.size()].
struct QuantScales {
  std::vector<float> scales;
  int64_t inner = 1;
};
// y = decode(encode(x * f32(1 / scale))), RNE, e4m3 saturating at 448, i8 in [-128, 127]; may run in place.
void quantize(int64_t count, const float* x, const QuantScales& s, DType code, float* y, ThreadPool& pool);
// y = code * scale (f32); may run in place.
void dequantize(int64_t count, const float* x, const QuantScales& s, float* y, ThreadPool& pool);
// Quantized conv2d / linear on code values: the exact sum of code products
// (DGEMM), then ep (quant/layer.hpp). residual: real values or null.
void qconv2d(const Conv2dParams& p, const float* x, const float* w, const float* residual, const quant::LayerEpilogue& ep,
             float* y, ThreadPool& pool);
void qlinear(int64_t rows, int64_t in, int64_t out, const float* x, const float* w, const quant::LayerEpilogue& ep, float* y,
             ThreadPool& pool);

// Sets OpenBLAS (process-global) to one thread, once: the pool does all the
// parallel work, so results do not depend on other contexts running at the
// same time (linear.cpp says why).
void use_single_threaded_blas();

}  // namespace kiln::cpu
