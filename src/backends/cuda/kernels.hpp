// kiln's own CUDA kernels for the memory-bound ops around convolutions and
// GEMMs. Activations live on the GPU as NHWC ([n, h, w, c]; 2-D tensors
// [n, c] as is) in the engine precision (f32, f16, bf16); kernels compute in
// f32 and round to nearest even on store.
//
// Every launcher only enqueues on the given stream: no allocation, no
// synchronisation, no host reads of device memory, so each can be captured
// into a CUDA graph. Launch errors are checked at each launch, so a bad
// configuration throws kiln::Error at the call site.
// Pointers need only element alignment; 16-byte aligned buffers whose channel
// counts are multiples of the vector width take a vectorised path.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "backends/cuda/quant_epilogue.hpp"
#include "core/activation.hpp"
#include "core/dtype.hpp"

namespace kiln::cuda {

// Programmatic dependent launch (dev::enter_grid in device_common.cuh): whether
// the kiln kernels this thread enqueues carry the PDL attribute. On unless a
// PdlDefault scope says otherwise; an engine context opens one (from the
// bundle's `pdl` switch, auto: by batch size) while it runs and captures its steps.
bool pdl_default();
class PdlDefault {
 public:
  explicit PdlDefault(bool on);
  ~PdlDefault();
  PdlDefault(const PdlDefault&) = delete;
  PdlDefault& operator=(const PdlDefault&) = delete;

 private:
  bool prev_;
};

// Engine input: host layout float NCHW (already on the device) to NHWC in
// the engine storage type, cast fused into the transpose.
void nchw_f32_to_nhwc(const float* x, void* y, DType ydt, int n, int c, int h, int w, cudaStream_t stream);
// The reverse, for tests and for engine outputs that stay 4-D: NHWC of xdt
// to float NCHW.
void nhwc_to_nchw_f32(const void* x, DType xdt, float* y, int n, int c, int h, int w, cudaStream_t stream);
// The same transpose in one storage type: NHWC [n,h,w,c] -> NCHW [n,c,h,w] (the
// logical order of a flatten of a map wider than 1x1).
void nhwc_to_nchw(const void* x, void* y, DType dt, int n, int c, int h, int w, cudaStream_t stream);

// y = x converted from xdt to ydt (RNE). x == y is allowed when xdt == ydt.
// i32/i64 on either side (index values): f32 -> integer takes floats holding
// integers exactly; any other float (fractions, NaN, out of range) becomes the
// type's minimum, which gather reports as a bad index. Integer -> float is
// exact up to 2^24.
void cast(const void* x, DType xdt, void* y, DType ydt, int64_t count, cudaStream_t stream);

// The output of a 16-bit producer that writes codes (ir/quant_form.hpp
// writes_codes: max_pool2d, mul, add, concat with an 8-bit out_dtype): y =
// encode(f32(result * inv_scale)) in code type dt, inv_scale = f32(1 / scale)
// as quantize uses it. The default (dt not a code type) stores the inputs' type.
struct CodeOut {
  DType dt = DType::F32;
  float inv_scale = 1.f;
  bool on() const { return dt == DType::F8E4M3 || dt == DType::I8; }
};

// y = act(a + b); y may alias a or b (not when writing codes). Codes: act none or ReLU.
// b_period > 0: b holds b_period elements read at e modulo b_period (a constant
// repeated per image, core/broadcast.hpp).
void add(const void* a, const void* b, void* y, DType dt, int64_t count, Activation act, cudaStream_t stream,
         const CodeOut& code = {}, int64_t b_period = 0);
// y = a * b, elementwise, b as add's; y may alias a.
void mul(const void* a, const void* b, void* y, DType dt, int64_t count, cudaStream_t stream, const CodeOut& code = {},
         int64_t b_period = 0);
// The same on channel windows: rows = n*h*w pixels of c channels, each tensor
// with its own pixel stride (elements from one pixel to the next, >= c).
void add_strided_nhwc(const void* a, int a_stride, const void* b, int b_stride, void* y, int y_stride, int64_t rows, int c,
                      DType dt, Activation act, cudaStream_t stream, const CodeOut& code = {});

// y = act(x); may run in place.
void activation(const void* x, void* y, DType dt, int64_t count, Activation act, cudaStream_t stream);

// Inference batch norm folded to an affine map: y[r, ch] = act(x[r, ch] *
// scale[ch] + shift[ch]) over rows = n*h*w. scale/shift are f32 on the device.
void batch_norm_nhwc(const void* x, void* y, DType dt, int64_t rows, int c, const float* scale,
                     const float* shift, Activation act, cudaStream_t stream);

// Squeeze-excitation scale: y[n, p, ch] = x[n, p, ch] * s[n, ch] for p < hw;
// s is in the engine dtype. May run in place.
void mul_channel_nhwc(const void* x, const void* s, void* y, DType dt, int n, int hw, int c, cudaStream_t stream,
                      const CodeOut& code = {});

// The caller computes out_h/out_w with PyTorch's rule (cpu::pool_out_dim);
// ceil mode is implied by them. pad_b/pad_r matter for the avg-pool divisor
// with count_include_pad: windows are clipped to the padded input first.
struct PoolShape {
  int n, h, w, c, out_h, out_w, kh, kw, stride_h, stride_w, pad_t, pad_l;
  bool count_include_pad;
  int pad_b, pad_r;
  int x_stride = 0, y_stride = 0;  // pixel strides in elements (channel windows of wider buffers); 0: c
};
// Padding acts as -inf (a window made only of padding yields -inf).
void max_pool_nhwc(const void* x, void* y, DType dt, const PoolShape& s, cudaStream_t stream, const CodeOut& code = {});
// PyTorch AvgPool2d divisor rule (see cpu::avg_pool2d).
void avg_pool_nhwc(const void* x, void* y, DType dt, const PoolShape& s, cudaStream_t stream);

// y[n, ch] = mean of x[n, 0..hw, ch].
void global_avg_pool_nhwc(const void* x, void* y, DType dt, int n, int hw, int c, cudaStream_t stream);

// Depthwise conv (groups == c == k), NHWC: y = act(conv(x, w) + bias + residual).
// The filter is tap-major [kh*kw][c] (depthwise_weights_tap_major converts
// PyTorch's [c,1,kh,kw]); bias [c] and residual (y's shape) may be null.
struct DepthwiseShape {
  int n, h, w, c, out_h, out_w, kh, kw, stride_h, stride_w, pad_t, pad_l, dil_h, dil_w;
};
std::vector<float> depthwise_weights_tap_major(const float* w, int c, int kh, int kw);
void depthwise_conv_nhwc(const void* x, const void* w_tap_major, const void* bias, const void* residual, void* y, DType dt,
                         const DepthwiseShape& s, Activation act, cudaStream_t stream);

// kiln's tensor-core conv for channel windows (window_conv.cu): y = act(conv(x
// [+ x_add], w) + bias) with x, x_add and y each a channel window of a wider
// NHWC buffer (pointer at the window's first channel + pixel stride), so
// Res2Net's chunk convs read the 1x1 output in place, add the previous
// chunk's result while loading (rounded to dt as a stored add would be) and
// write into the concat. f16/bf16, any kernel size/stride/pad/dilation; c and
// k multiples of 8; filter KRSC, bias [k] (or null) in dt.
// `groups` > 1 runs that many convs of this shape in one launch: conv j reads
// x + j * x_group_step and writes y + j * y_group_step (elements), with filter
// j at w + j * k*r*s*c and bias j at bias + j * k (a first Res2Net block's
// independent chunk convs; no x_add then).
struct WindowConvShape {
  int n, h, w, c, k, r, s, out_h, out_w, stride_h, stride_w, pad_t, pad_l, dil_h, dil_w;
  int x_stride, x_add_stride, y_stride;  // pixel strides in elements (>= c, c, k)
  int groups = 1;
  int64_t x_group_step = 0, y_group_step = 0;
};
// A side job of the same launch: an average pool of another window over the
// conv's output pixels (pool.n/out_h/out_w equal the conv's; strides in
// pool.x_stride/y_stride), or an exact copy when the pool is 1x1, stride 1,
// unpadded. Res2Net's pass-through chunk (pooled in first blocks, copied in
// chained ones) then costs no kernel of its own. pool.c even.
struct WindowSide {
  const void* src = nullptr;
  void* dst = nullptr;
  PoolShape pool{};
};
// Launch shape override for tuning and tests: n tile width 8*nt (1, 2, 4) and
// warps splitting K (1..16, a power of two); 0 = chosen from the shape.
struct WindowLaunch {
  int nt = 0, warps = 0;
};
// Empty when window_conv_nhwc takes this shape (and side job), else why not.
std::string window_conv_unsupported(DType dt, const WindowConvShape& s, const PoolShape* side = nullptr);
void window_conv_nhwc(const void* x, const void* x_add, const void* w_krsc, const void* bias, void* y, DType dt,
                      const WindowConvShape& s, Activation act, cudaStream_t stream, const WindowSide& side = {},
                      WindowLaunch launch = {});
// The launch shape window_conv_nhwc picks for s (for reports and tests).
WindowLaunch window_conv_launch(const WindowConvShape& s);

// kiln's implicit-GEMM conv for dense convs (igemm_conv.cu), a candidate of
// the conv selector: y = act(conv(x, w) + bias + residual), f16/bf16 NHWC,
// groups 1, any kernel size/stride/pad/dilation, c and k multiples of 8;
// filter KRSC, bias [k] (or null), residual [n*out_h*out_w][k] dense (or
// null), all in dt and 16-byte aligned. x_stride/y_stride: pixel strides in
// elements (0: c / k; else multiples of 8).
struct IgemmConvShape {
  int n, h, w, c, k, r, s, out_h, out_w, stride_h, stride_w, pad_t, pad_l, dil_h, dil_w;
  int x_stride = 0, y_stride = 0;
};

// kiln's direct conv for convs with few input channels (direct_conv.cu: an RGB
// stem), a candidate of the conv selector: y = act(conv(x, w) + bias +
// residual), f16/bf16 NHWC, groups 1, c <= 4, k a multiple of 8, the f32
// filter share of 8 outputs within 48 KiB; x dense [n, h, w, c], filter KRSC,
// bias [k] (or null), residual and y dense [n * out_h * out_w][k]; y, bias and
// residual 16-byte aligned. Its shape is the implicit-GEMM conv's, without
// pixel strides (x_stride and y_stride 0).
using DirectConvShape = IgemmConvShape;
inline constexpr int kMaxDirectConvChannels = 4;
inline constexpr size_t kMaxDirectConvFilterBytes = size_t(48) << 10;
inline constexpr const char* kDirectConvTactic = "kiln direct conv";
// The direct conv reading the engine's NCHW f32 input itself (its conversion step dropped).
inline constexpr const char* kDirectConvNchwTactic = "kiln direct conv nchw";
// Empty when direct_conv_nhwc runs this shape, else why not.
std::string direct_conv_unsupported(DType dt, const DirectConvShape& s);
void direct_conv_nhwc(const void* x, const void* w_krsc, const void* bias, const void* residual, void* y, DType dt,
                      const DirectConvShape& s, Activation act, cudaStream_t stream);
// The same conv reading x as the engine's NCHW f32 input (each value rounded
// to dt as it is loaded: the input's NHWC cast and the conv in one launch).
void direct_conv_nchw_f32(const float* x, const void* w_krsc, const void* bias, const void* residual, void* y, DType dt,
                          const DirectConvShape& s, Activation act, cudaStream_t stream);

// A launch shape: a block's output tile bm x bn (64x32, 64x64, 128x64,
// 64x128) and `splits` blocks of one cluster splitting K (1, 2, 4); or, with
// th > 0, the halo form: patches of th x (bm / th) output pixels (8x16, 8x8)
// x bn channels (32, 64) whose input window is loaded once for every tap;
// `persist`: its persistent variant (the block's filter share loaded once,
// patches walked in turn).
struct IgemmTile {
  int bm = 64, bn = 64, splits = 1, th = 0;
  bool persist = false;
};
// "kiln igemm 64x64 s2" / "kiln igemm halo 8x16 n64" / "kiln igemm halo persistent 8x16 n64":
// the tactic name a tile is recorded under.
std::string igemm_tile_name(const IgemmTile& t);
// Empty when igemm_conv_nhwc runs this shape with this tile, else why not.
std::string igemm_conv_unsupported(DType dt, const IgemmConvShape& s, const IgemmTile& t);
// The tiles worth timing for s (every one igemm_conv_unsupported accepts or not: check it).
std::vector<IgemmTile> igemm_conv_tiles(const IgemmConvShape& s);
void igemm_conv_nhwc(const void* x, const void* w_krsc, const void* bias, const void* residual, void* y, DType dt,
                     const IgemmConvShape& s, Activation act, const IgemmTile& t, cudaStream_t stream);

// The im2col matrix of kiln's GEMM conv (gemm_conv.cu, gemm_conv.hpp): from
// a dense NHWC x [n, h, w, c], cols [n * out_h * out_w, r * s * c] row-major,
// each row an output pixel's receptive field in filter-tap-major order (tap
// (i, j) at columns (i * s + j) * c ..., the order of a KRSC filter's rows),
// zero where the tap falls in the padding. A pure copy: any element type of
// `dt`'s size; copies 16, 8 or 4 bytes at a time where c's bytes and the
// pointers allow. cols must not overlap x.
struct Im2colShape {
  int n, h, w, c, r, s, out_h, out_w, stride_h, stride_w, pad_t, pad_l, dil_h, dil_w;
};
void im2col_nhwc(const void* x, void* cols, DType dt, const Im2colShape& s, cudaStream_t stream);

// Squeeze-excitation MLP: s[n, :] = act2(W2 · act1(W1 · g[n, :] + b1) + b2),
// g [n, c] (pooled), W1 [cr, c], W2 [c, cr], all in dt; two launches, the
// hidden vector in `workspace` (se_mlp_workspace_bytes). The hidden vector is
// rounded to dt like the two-conv graph stores it.
size_t se_mlp_workspace_bytes(int n, int cr);
void se_mlp(const void* g, const void* w1, const void* b1, const void* w2, const void* b2, void* s, DType dt, int n, int c,
            int cr, Activation act1, Activation act2, void* workspace, size_t workspace_bytes, cudaStream_t stream);
// The MLP and the scale it gates, in two launches: y = x * s with x, y NHWC
// [n, hw, c] and s as se_mlp computes it (never stored); equal to se_mlp
// followed by mul_channel_nhwc. y may be x.
void se_mlp_scale(const void* g, const void* w1, const void* b1, const void* w2, const void* b2, const void* x, void* y,
                  DType dt, int n, int hw, int c, int cr, Activation act1, Activation act2, void* workspace,
                  size_t workspace_bytes, cudaStream_t stream);

// Channel concat of up to kMaxConcatInputs NHWC tensors in one launch
// (Res2Net concatenates 4-8 chunks per block: one kernel instead of one copy
// per chunk). xs[k] has cs[k] channels; rows = n*h*w. More inputs: one
// copy_channels_nhwc per input.
inline constexpr int kMaxConcatInputs = 8;
// Inputs of a concat read through a nearest upsample (plan_upsample_concats):
// input k with factors[k] = {sh, sw} ({0, 0}: read as it is) holds
// (h / sh) x (w / sw) pixels per image, and y's row r (image n, pixel i, j of
// h x w) takes its row (n * (h / sh) + i / sh) * (w / sw) + j / sw.
struct ConcatUpsample {
  int h = 0, w = 0;
  std::vector<std::pair<int, int>> factors;
};
void concat_channels_nhwc(const std::vector<const void*>& xs, const std::vector<int>& cs, void* y, int64_t rows, DType dt,
                          cudaStream_t stream, const ConcatUpsample* up = nullptr);
// Row-major concat along any axis: each of y's `rows` rows (rows = the extents
// before the axis multiplied) is the inputs' rows of chunk_bytes[k] bytes side by
// side; up to kMaxConcatInputs inputs, one launch moving the widest word every
// chunk and address allows (RT-DETR's memory: three levels' token rows).
void concat_rows(const std::vector<const void*>& xs, const std::vector<int64_t>& chunk_bytes, void* y, int64_t rows,
                 cudaStream_t stream, const ConcatUpsample* up = nullptr);

// concat_rows of row-major [rows, S_k, c] inputs along axis 1 (bytes of
// elements dt, chunk_elems[k] = S_k * c) that also writes y2 = y * mask, mask
// [S] one value per token row of y (a [1, S, 1] constant broadcast over the
// rows and c): T(f32(y) * f32(mask[s])), the bits of the mul step it replaces
// (RT-DETR's memory and its valid-anchor mask, plan_concat_masks). One launch.
void concat_rows_masked(const std::vector<const void*>& xs, const std::vector<int64_t>& chunk_elems, void* y, void* y2,
                        const void* mask, int64_t rows, int64_t c, DType dt, cudaStream_t stream);

// A channel concat that writes codes (CodeOut): y[r, begin_k + i] =
// encode(f32(xs[k][r * strides[k] + i] * inv_scale)), inputs of type xdt, each
// with its pixel stride (a channel window of a wider buffer, or cs[k]); one
// launch per kMaxConcatInputs inputs. y is dense (sum cs channels).
void concat_to_codes_nhwc(const std::vector<const void*>& xs, const std::vector<int>& strides, const std::vector<int>& cs,
                          DType xdt, void* y, int64_t rows, const CodeOut& code, cudaStream_t stream);

// The inverse in one launch: ys[k] (cs[k] channels) = channels [begins[k],
// begins[k] + cs[k]) of x (x_c channels), for up to kMaxSplitOutputs outputs
// (Res2Net's chunk slices of the 1x1 output: one kernel instead of one per chunk).
// codes: empty, or one per output: an output whose CodeOut is on holds codes
// (a slice that writes codes: encode(f32(x * inv_scale))), the others copies.
inline constexpr int kMaxSplitOutputs = 8;
void split_channels_nhwc(const void* x, int x_c, const std::vector<void*>& ys, const std::vector<int>& begins,
                         const std::vector<int>& cs, int64_t rows, DType dt, cudaStream_t stream,
                         const std::vector<CodeOut>& codes = {});

// y[r, y_c_begin + i] = x[r, x_c_begin + i] for i < c_count, r < rows
// (rows = n*h*w): writes one input of a channel concat, or reads a slice.
void copy_channels_nhwc(const void* x, int x_c, int x_c_begin, void* y, int y_c, int y_c_begin, int c_count,
                        int64_t rows, DType dt, cudaStream_t stream);


// ---- transformer ops (issue 12) ---------------------------------------------
// Their values are row-major in logical order (4-D float values are NHWC; the
// lowerings convert, see lower.hpp's RowMajorIo).

// y in row-major order of `shape` (rank <= kMaxStridedRank), y[i0..ir] =
// x[sum_d i_d * x_strides[d]] (strides in elements, 0 repeats): transpose,
// NHWC <-> NCHW relayouts, reshape across layouts and nearest upsampling
// (shape_ops.cu). Moves elem_bytes-sized elements (1, 2, 4 or 8) unchanged.
inline constexpr int kMaxStridedRank = 8;
struct StridedCopy {
  int rank = 0;
  int64_t shape[kMaxStridedRank] = {};
  int64_t x_strides[kMaxStridedRank] = {};
};
void strided_copy(const void* x, void* y, size_t elem_bytes, const StridedCopy& s, cudaStream_t stream);
// The copy strided_copy launches: the same bytes moved, with extent-1 axes
// dropped, contiguous axes merged and, where x's innermost axis is contiguous
// and the addresses allow, up to 16 bytes per word (word_bytes in: the
// element size; out: the word size). Host code, tested without a GPU.
StridedCopy simplify_strided_copy(const StridedCopy& s, size_t& word_bytes, uintptr_t x_addr, uintptr_t y_addr);

// gather (shape_ops.cu): x as [outer, extent, inner], index [outer, k] (i64 or
// i32), y[o, j, r] = x[o, index[o, j], r] (shared_x: x is [1, extent, inner],
// read as x[0, index[o, j], r] for every o). An index outside [0, extent) reads
// row 0 and is reported in `flag` (3 int64: set, the index, its position
// o * k + j; the first such index wins). The caller zeroes the flag and checks it.
void gather_rows(const void* x, const void* index, DType index_dt, void* y, size_t elem_bytes, int64_t outer,
                 int64_t extent, int64_t inner, int64_t k, bool shared_x, int64_t* flag, cudaStream_t stream);

// layer_norm over rows of c contiguous elements (norm.cu): statistics in f32,
// weight/bias [c] in dt or null, one warp per row. The other pointers are
// optional (null: not read or written), each what the step it stands for
// would compute (plan_norm_adds): x2 (x's shape): the rows are x + x2 rounded
// to dt first, as an add step stores them; y_pos: y + pos, as an add step;
// y_f32: y widened to f32, as a cast step.
struct LayerNormIo {
  const void* x = nullptr;
  const void* x2 = nullptr;
  const void* weight = nullptr;
  const void* bias = nullptr;
  void* y = nullptr;
  const void* pos = nullptr;
  void* y_pos = nullptr;
  float* y_f32 = nullptr;
};
void layer_norm_rows(const LayerNormIo& io, DType dt, int64_t rows, int c, float eps, cudaStream_t stream);
// softmax of x seen as [outer, extent, inner] along extent (norm.cu), f32 math,
// one warp per (outer, inner) row; inner == 1 is the contiguous fast case.
void softmax_axis(const void* x, void* y, DType dt, int64_t outer, int64_t extent, int64_t inner, cudaStream_t stream);
// log(max(x', eps) / max(1 - x', eps)) with x' = clamp(x, 0, 1), f32 math (elementwise.cu).
void inverse_sigmoid(const void* x, void* y, DType dt, int64_t count, float eps, cudaStream_t stream);
// RT-DETR's box refinement in one launch (elementwise.cu, plan_box_refines):
// y = act(f32(delta) + inverse_sigmoid(ref, eps)) in f32 (act none or
// sigmoid; ref null: act(f32(delta)); eps < 0: act(f32(delta) + ref), the
// initial reference points from the picked anchors' logits), and with y_narrow (not null) y rounded
// to narrow_dt (f16/bf16) too; the bits of the cast, inverse_sigmoid, add (or
// activation) and cast kernels it replaces.
void box_refine(const void* delta, DType delta_dt, const float* ref, float eps, float* y, void* y_narrow, DType narrow_dt,
                int64_t count, Activation act_kind, cudaStream_t stream);

// A chain of linear layers in one launch (mlp_chain.cu, plan_mlp_chains):
// x [rows, k0] (f16/bf16, row-major) -> y [rows, n of the last layer]. Each
// layer: w packed by mlp_chain_pack (linear.cpp) to [n_pad / 8][k_pad / 32]
// 32 lanes x 16 bytes, zero past n and k; b f32 [n_pad], zero past n; every
// layer's n_pad is the next one's k_pad (a multiple of 32), the last one's a
// multiple of 8; widths up to kMaxMlpWidth. `cluster` blocks (1, 2 or 4)
// share each 16 rows (mlp_chain_cluster picks it for the rows).
// With norm: the last layer's rows z = T(T(product) + res) (res = norm->io.x2,
// [rows, n]), then y = layer_norm(z) (weight, bias: T or null; f32
// statistics), and y_pos = T(y + pos), y_f32 = f32(y) where given, as
// layer_norm_rows takes its io.
// With sum (no norm): also y_sum = T(f32(y) + f32(add_to)), add_to and y_sum
// [rows, n] of the chain's type (RT-DETR's query + position embedding, the
// add the unfused graph runs after the query position head).
inline constexpr int kMaxMlpChain = 6;  // layers one launch takes (plan_mlp_chains plans up to 4, links up to 6)
inline constexpr int kMaxMlpWidth = 1024;
struct MlpChainNorm {
  LayerNormIo io;  // x2: the residual (res above); weight, bias, pos, y_pos, y_f32; x and y unused (y: mlp_chain's)
  float eps = 1e-5f;
};
struct MlpChainSum {
  const void* add_to = nullptr;
  void* y = nullptr;
};
// RT-DETR's box refinement between two chains run as one (plan_mlp_chains'
// links: the box head, the refinement, the next query position head): layer
// `layer` (no activation) gives delta [rows, n]; y = act(f32(T(delta)) +
// inverse_sigmoid(ref, eps)) in f32 (eps < 0: + ref as it is; act none or
// sigmoid), written to y (f32) and, rounded, to y_narrow (null: not
// written); the rounded rows are the next layer's input. box_refine's bits.
struct MlpChainRefine {
  int layer = -1;
  const float* ref = nullptr;
  float eps = -1.f;
  Activation act = Activation::None;
  float* y = nullptr;
  void* y_narrow = nullptr;
};
struct MlpChainLayer {
  const void* w = nullptr;
  const float* b = nullptr;
  int k_pad = 0, n = 0, n_pad = 0;
  Activation act = Activation::None;  // none, ReLU or GELU
};
int mlp_chain_cluster(int64_t rows, int sms);
// Multiprocessors of the current device (read once per process).
int device_sm_count();
void mlp_chain(const void* x, void* y, DType dt, int64_t rows, int k0, const MlpChainLayer* layers, int count, int cluster,
               cudaStream_t stream, const MlpChainNorm* norm = nullptr, const MlpChainSum* sum = nullptr,
               const MlpChainRefine* refine = nullptr);

// y [m, n] = act(x [m, k] w [n, k]^T + b [n]) for f16/bf16 (small_gemm.cu), f32
// sums rounded once: kiln's small linear with PDL (the weight panel staged
// before the wait). m up to kMaxSmallGemmRows, k a multiple of 16 up to
// kMaxSmallGemmK, n a multiple of 8, act none, ReLU or GELU (erf, on the
// product rounded to the storage type, as the unfused activation step), b may
// be null, operands 16-byte aligned. tile_m: rows a block owns, 16 or 64 (0:
// 16). Switch small_gemm (auto: small_gemm_preferred's shapes; tests:
// CudaSmallGemm.* and the probe in tests/gpu).
inline constexpr int kMaxSmallGemmK = 512;
inline constexpr int64_t kMaxSmallGemmRows = 4096;  // past it cuBLASLt's big tiles win (8400 rows: 3x slower)
void small_gemm(const void* x, const void* w, const void* b, void* y, DType dt, int m, int n, int k, Activation act,
                cudaStream_t stream, int tile_m = 0);
// Why small_gemm does not take these operands ("" when it does).
std::string small_gemm_unsupported(DType dt, int64_t m, int n, int k, Activation act);
// Whether switch small_gemm's auto setting takes a linear of this shape (one
// small_gemm_unsupported takes): the shapes where it beat cuBLASLt inside the
// engine's graph (small_gemm.cu says which and by how much).
bool small_gemm_preferred(int64_t m, int n, int k, Activation act = Activation::None);

// A post-norm's projection, its residual add and the layer norm in one launch
// (small_gemm.cu, small_gemm_norm; plan_mlp_chains plans it as a one-linear
// chain inside the norm): z = T(T(act(x [m, k] w [n, k]^T + b)) + io.x2), then
// io.y = layer_norm(z) with io.weight, io.bias (T or null) and eps, and
// io.y_pos = T(y + io.pos), io.y_f32 = f32(y) where given: the bits of
// small_gemm (f32 sums, one rounding), the add step and layer_norm_rows.
// f16/bf16; m up to kMaxSmallGemmRows, k a multiple of 16 up to
// kMaxSmallGemmNormK, n a multiple of 16 up to kMaxSmallGemmNormWidth (one
// block holds all of w and 16 whole rows), act none or ReLU, every pointer
// 16-byte aligned. io.x is unused.
inline constexpr int kMaxSmallGemmNormK = 256;
inline constexpr int kMaxSmallGemmNormWidth = 256;
void small_gemm_norm(const void* x, const void* w, const void* b, DType dt, int m, int n, int k, Activation act,
                     const LayerNormIo& io, float eps, cudaStream_t stream);
// Why small_gemm_norm does not take these operands ("" when it does).
std::string small_gemm_norm_unsupported(DType dt, int64_t m, int n, int k, Activation act);

// top_k along extent of x seen as [outer, extent, inner] (top_k.cu): values
// [outer, k, inner] in dt, indices (int64) likewise, sorted, equal values by
// smaller index first, NaN above every number; one block per row (radix select
// on a 64-bit key of value and index, then a rank count of the k winners), or
// for rows of 4096..196608 elements one cluster of 8 blocks per row (the same
// result bit for bit). `path` OneBlock keeps one block (engines built with
// --disable cluster_top_k; tests, probes).
inline constexpr int kMaxCudaTopK = 2048;
enum class TopKPath { Auto, OneBlock };
void top_k_rows(const void* x, void* values, int64_t* indices, DType dt, int64_t outer, int64_t extent, int64_t inner,
                int k, bool largest, cudaStream_t stream, TopKPath path = TopKPath::Auto);

// ---- FP8 e4m3 (quant.cu; issue 13, docs/cuda-backend.md "FP8") ----
// Values are walked in stored order; the scale of flat index i is
// scales[(i / inner) % extent] (extent 1: one scale for the tensor), so a
// per-channel scale along any logical axis is its stored stride and extent.
// quantize: code = encode(x * inv_scale) (RNE, saturating at +-448);
// dequantize: f32(code * scale), then rounded to ydt. Scales on the device, f32.
void quantize_e4m3(const void* x, DType xdt, void* y, int64_t count, const float* inv_scales, int64_t inner,
                   int64_t extent, cudaStream_t stream);
void dequantize_e4m3(const void* x, void* y, DType ydt, int64_t count, const float* scales, int64_t inner, int64_t extent,
                     cudaStream_t stream);
// y [rows, y_cols] = x [rows, cols] with zero columns appended (1-byte elements).
void pad_rows_u8(const void* x, int64_t rows, int cols, void* y, int y_cols, cudaStream_t stream);
// The epilogue of a quantized conv2d / linear: QuantEpilogue (quant_epilogue.hpp).
// acc: [rows, acc_ld] f32 (the raw sums, acc_ld >= k: padded channels are
// skipped); residual [rows, k] in rdt (f32/f16/bf16, or e4m3 codes with
// e.residual_scale) or null; y [rows, k] in ydt.
void quant_epilogue(const float* acc, int acc_ld, const QuantEpilogue& e, const void* residual, DType rdt, void* y,
                    DType ydt, int64_t rows, int k, cudaStream_t stream);

// ms_deform_attn (ms_deform_attn.cu): RT-DETR v2's multi-scale deformable
// attention core, one block per (image, query). value [n, s, heads, d], ref
// [n, q, 4], offsets [n, q, heads, p, 2], logits [n, q, heads, p] and y
// [n, q, heads * d], all row-major in dt. Softmax, sampling locations and
// bilinear (or discrete) weights in f32 in the CPU kernel's order, f32 sums,
// one rounding of y. Levels and pairs are bounded (checked at lowering).
inline constexpr int kMaxDeformLevels = 16;
inline constexpr int kMaxDeformPairs = 1536;  // heads * p: 32 bytes of shared memory each
struct DeformAttnShape {
  int64_t n = 1, s = 1, q = 1;
  int heads = 1, d = 1, p = 1, levels = 1;
  int64_t level_h[kMaxDeformLevels] = {}, level_w[kMaxDeformLevels] = {}, level_start[kMaxDeformLevels] = {};
  int points[kMaxDeformLevels] = {};
  float offset_scale = 0.5f;
  bool discrete = false;
  // Elements between consecutive rows: value's tokens, offsets' and logits'
  // queries; 0 is packed (heads * d, heads * p * 2, heads * p). More where an
  // operand is a window of a wider row (plan_row_windows: offsets and logits
  // as slices of one projection).
  int64_t value_ld = 0, off_ld = 0, logit_ld = 0;
};
// Block: one block per query, a thread per output channel. Warp (switch
// warp_deform): one warp per query, 16-byte value loads, where
// ms_deform_warp_ok and the value and y pointers are 16-byte aligned (else
// the block form). The same bits either way.
enum class DeformPath { Block, Warp };
bool ms_deform_warp_ok(const DeformAttnShape& s, DType dt);
void ms_deform_attn(const void* value, const void* ref, const void* offsets, const void* logits, void* y, DType dt,
                    const DeformAttnShape& s, cudaStream_t stream, DeformPath path = DeformPath::Block);

// attention (attention.cu): q [n, lq, heads * d], k [n, lk, heads * d], v
// [n, lk, heads * dv] -> y [n, lq, heads * dv], row-major in dt; per head
// softmax(scale * q_h k_h^T) v_h with f32 scores, softmax and sums, one
// rounding of y. Two kernels. Tensor cores (attention_uses_mma: f16/bf16, d
// and dv multiples of 16 up to kMaxAttentionMmaWidth, and at launch 16-byte
// aligned q, k, v, y): flash-attention style on mma.sync, k and v streamed
// through shared memory in 64-key tiles, any lk; the one extra rounding is
// the softmax weights to dt before they multiply v (the normaliser stays the
// f32 sum). Otherwise the exact f32 kernel: one block per (image, head, 16
// queries); k and v of the head in shared memory when they fit
// (attention_kv_in_shared), else read from global memory; beyond
// attention_fits (a warp's scores of one query row in shared memory) the
// lowering refuses the node (also on the tensor-core path, whose misaligned
// fallback is that kernel).
struct AttentionShape {
  int64_t n = 1;
  int lq = 1, lk = 1, heads = 1, d = 1, dv = 1;
  float scale = 1.f;
  // Elements between consecutive token rows of q, k and v: 0 is heads * d
  // (heads * dv for v), rows packed; more where an operand is a window of a
  // wider row (plan_row_windows: q and k as slices of one projection). Images
  // are lq (lk) rows apart. y is always packed.
  int64_t q_ld = 0, k_ld = 0, v_ld = 0;
  bool vec = false;  // set by attention(): k and v rows load as 16-byte vectors
  // The tensor-core kernel's key split (1, 2 or 4 warps sharing a query
  // group); 0: by the grid (mma_split: the least that gives every SM a block).
  int split = 0;
  // Its query groups of 16 rows a block (attention_mma_form_ok); 0: 4 / split
  // (blocks of 4 warps), or with `wide` at split 4 attention_wide_groups.
  int groups = 0;
  // Switch wide_attention: at split 4 a block takes 2 or 4 query groups
  // (8 or 16 warps), so each block's copy of a head's k and v serves 32 or
  // 64 queries instead of 16. The same bits: every warp computes what it
  // would in a block of 4.
  bool wide = false;
};
bool attention_mma_form_ok(int split, int groups);
// The wide form's query groups: the most (4, then 2) that still give half of
// the `sms` SMs a block, else 1.
int attention_wide_groups(int64_t lq, int64_t heads, int64_t n, int sms);
inline constexpr size_t kMaxAttentionSmem = 200 * 1024;
inline constexpr int kMaxAttentionMmaWidth = 128;
bool attention_uses_mma(const AttentionShape& s, DType dt);
bool attention_kv_in_shared(const AttentionShape& s);
bool attention_fits(const AttentionShape& s);
void attention(const void* q, const void* k, const void* v, void* y, DType dt, const AttentionShape& s, cudaStream_t stream);

}  // namespace kiln::cuda
