// Internal to the CUDA backend: lowering graph nodes to program steps.
//
// build_program (cuda_program.cpp) shapes the graph for a batch, gathers the
// facts below (which nodes are fused into others, which values are channel
// views, what the bundle's plan says), plans memory, then calls lower_node
// for every node. Each op's lowering lives beside its kernels:
//   conv.cpp         Conv2d: cuDNN fused conv, kiln's depthwise and window conv
//   gemm_conv.cpp    Conv2d as im2col + cuBLASLt (switch gemm_conv), lower_Conv2d's candidate
//   linear.cpp       Linear: cuBLASLt, mlp_chain (fused chains), small_gemm (switch small_gemm)
//   pool.cpp         MaxPool2d, AvgPool2d, GlobalAvgPool
//   elementwise.cpp  BatchNorm, Activation, Add, Mul, Cast
//   layout.cpp       Flatten, Concat, Slice (views, split runs), engine inputs
//   se.cpp           the squeeze-excitation group (se_plan.hpp)
//   norm.cpp         LayerNorm, Softmax
//   matmul.cpp       MatMul: cuBLASLt (cublaslt_linear.hpp's MatMulOp)
//   shape_ops.cpp    Transpose, Reshape, UpsampleNearest, Gather, RowMajorIo
//   top_k.cpp        TopK
//   quant.cpp        Quantize, Dequantize and the quantized Conv2d / Linear (FP8)
//   ms_deform_attn.cpp  MsDeformAttn (one fused kernel)
//   elementwise.cpp  also InverseSigmoid
//   reference.cpp    any node matched by --reference: the plain reference on the host
// reached through lower_node's dispatch, generated from ops.def (lower.cpp):
// an op added to ops.def without a lower_<Op> does not link.
#pragma once
#include <algorithm>
#include <functional>
#include <initializer_list>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "backends/cuda/cuda_program.hpp"
#include "backends/cuda/kernels.hpp"
#include "backends/cuda/se_plan.hpp"
#include "backends/cuda/tactics.hpp"
#include "backends/cuda/weight_prefetch.hpp"
#include "backends/cuda/window_plan.hpp"
#include "runtime/views.hpp"

namespace kiln::cuda {

// RT-DETR's box refinement around one f32 add, y = act(f32(delta) +
// inverse_sigmoid(ref)), as one launch (plan_box_refines): the nodes it
// takes in (kNoNode where absent) and the values it reads and writes. The
// initial reference points (sigmoid(head + picked anchors)) add ref as it is.
struct BoxRefine {
  size_t widen = kNoNode;   // cast delta -> f32 read only by the add
  size_t inverse = kNoNode; // inverse_sigmoid(ref) read only by the add (kNoNode with ref set: ref added as it is)
  size_t narrow = kNoNode;  // cast of y to 16 bits (written by the same launch)
  int delta = -1, ref = -1;
};

// RT-DETR's box head chain, its box refinement and the next query position
// head chain in one mlp_chain launch (plan_mlp_chains): the refinement's add
// node (a plan_box_refines entry with a narrowing cast) and the second
// chain's linears; every node of them runs inside the first chain's launch.
struct MlpChainLink {
  size_t refine = kNoNode;
  std::vector<size_t> next;
};

// The adds a layer_norm's launch takes in (plan_norm_adds; kNoNode where none):
// the residual add it reads through, and an add of its output and a value
// computed before it (RT-DETR's query + position), written by the same launch.
struct NormAdds {
  size_t residual = kNoNode;
  size_t pos = kNoNode;
  int pos_value = -1;  // the add's other operand
  size_t widen = kNoNode;  // a cast of the 16-bit output to f32, written by the same launch
};

// A slice along the last axis of a row-major value, read in place by its
// readers as a window of each row (plan_row_windows): the value, the
// window's first element in a row, and the row's length.
struct RowWindow {
  int src = -1;
  int64_t offset = 0, ld = 0;
  size_t slice = kNoNode;  // the slice node
};

// A concat input produced by a nearest upsample read by the concat alone
// (plan_upsample_concats): the concat reads `src` (the upsample's input)
// with the factors, and the upsample has no step of its own.
struct UpsampleRead {
  int src = -1;
  int sh = 1, sw = 1;
  size_t upsample = kNoNode;
};

// Nodes that run on the side lane (plan_side_lane, side_lane.cpp): a chain of
// convs, pools or linears, each read by the next alone, enqueued on a second
// stream once node `fork` has run and waited for before node `join` runs.
struct SideRun {
  std::vector<size_t> nodes;
  int fork = -1;  // the last node (launch) whose result the run reads; -1: engine inputs only
  int join = 0;   // the first node (launch) that reads the run's result; nodes.size(): the output conversion
};

// The facts of one shaped graph that decide how its nodes run.
struct GraphFacts {
  std::vector<char> fused_away;   // nodes with no step of their own
  std::vector<char> folded_cast;  // casts folded into the engine-input copy
  std::vector<char> split_done;   // slices copied by the first slice of their run
  std::vector<int> alias;         // value -> the value whose bytes it shares (-1: its own)
  std::map<int, int> live_until;  // value -> the last node index whose step reads it
  std::map<int, int> live_from;   // value -> the first node index whose step writes it (before its producer)
  std::map<size_t, NormAdds> norm_adds;  // layer_norm node -> the adds run inside it (plan_norm_adds)
  std::map<size_t, BoxRefine> box_refines;  // add node -> its fused box refinement (plan_box_refines)
  std::map<int, RowWindow> windows;  // slice output -> the row window its readers read (plan_row_windows)
  std::map<int, int> output_from;  // graph output -> the 16-bit value converted instead (plan_output_casts)
  std::map<std::pair<size_t, size_t>, UpsampleRead> upsample_reads;  // (concat, input) read through its upsample (plan_upsample_concats)
  std::map<size_t, int> wide_linears;  // f32 linear -> the 16-bit value it reads instead of its widening cast (plan_wide_linears)
  std::map<size_t, std::vector<size_t>> mlp_chains;  // launch node (last linear, or a layer norm) -> the chain's linears in order (plan_mlp_chains)
  std::map<size_t, size_t> mlp_chain_sums;  // chain launch node -> the add of its output it writes too (plan_mlp_chains)
  std::map<size_t, MlpChainLink> mlp_chain_links;  // chain launch node -> the box refinement and chain it runs too (plan_mlp_chains)
  std::map<size_t, size_t> concat_masks;  // row-major concat -> the mul by a per-token constant its launch writes too (plan_concat_masks)
  std::set<size_t> linear_norms;  // layer norms whose one-linear chain runs as small_gemm_norm (plan_mlp_chains)
  std::vector<SideRun> side_runs;  // plan_side_lane, in node order of their first nodes
  bool late_side_fork = false;     // plan_side_lane's late_fork (switch late_side_fork or the plan's record)
  bool chain_side_fork = false;    // plan_side_lane's chain_fork (switch chain_side_fork or the plan's record)
  bool weight_prefetch = false;    // insert_weight_prefetch after lowering (switch weight_prefetch or the plan's record)
  bool prefetch_evict_last = false;  // ... its lines evict-last (switch prefetch_evict_last or the plan's record)
  SePlan se;
  ChannelViews cv;
  WindowPlan wp;
  // The view blocks (window_plan.hpp) of the graph's marked views, whether
  // each can run as window convs, and which do (1) or run cuDNN convs over
  // copies (0: their views are cleared from cv).
  std::vector<ViewBlock> blocks;
  std::vector<BlockWindows> block_windows;
  std::vector<char> window;
  bool window_mode = false;  // some block runs as window convs over channel views
  bool use_views = false;    // channel views in use (window mode, or switch cuda_views)
  bool split_always = false;  // switch fuse_split on: every marked split run is one launch
  // Nodes on the plain reference (--reference, reference.cpp); when any is,
  // the graph runs dense: no views, window convs, SE or split-run fusion.
  std::vector<char> reference;
  bool dense = false;
  std::map<size_t, std::unique_ptr<ConvOp>> view_convs;  // conv node -> its strided cuDNN op (views without window mode)

  // Nothing fused, no views; flattens and reshapes that keep their input's
  // bytes are aliases of it (flatten_is_alias, reshape_is_alias).
  void start(const Graph& g);
  // v is a channel view in use (its bytes inside its root's, at a pixel stride).
  bool viewed(int v) const { return use_views && cv.is_view(v); }
  // A fused step reads v at node index `node`: v's buffer stays live until then.
  void live_through(int v, int node) {
    auto [it, fresh] = live_until.try_emplace(v, node);
    if (!fresh) it->second = std::max(it->second, node);
  }
};

// A value's device address in one enqueue; small, copied into step closures.
struct ValuePtr {
  const CudaEngine::Program* p = nullptr;
  void* operator()(const Exec& x, int v) const { return const_cast<void*>(p->value_ptr(x, v)); }
};

inline int as_int(int64_t v) { return static_cast<int>(v); }

// Layout assignment. The IR's semantics are logical (NCHW for 4-D maps); the
// CUDA backend stores 4-D activations NHWC and every other rank in its
// logical row-major order. Ops whose meaning crosses the two get a transpose:
// a flatten of a 4-D map is a byte alias only when its NHWC bytes are already
// in NCHW order (1x1 maps, or one channel); otherwise it runs nhwc_to_nchw.
// Engine inputs: 4-D ones are transposed NCHW -> NHWC, others only cast.
// Integer values (indices) and constants (uploaded as the graph holds them)
// are row-major at every rank.
// 4-D activations of a float type or of 8-bit codes (e4m3 counts as float, i8 does not) are NHWC.
inline bool stored_nhwc(const Value& v) {
  return v.shape.size() == 4 && (dtype_is_float(v.dtype) || v.dtype == DType::I8) && !v.constant;
}
inline bool flatten_is_alias(const Graph& g, const Node& flatten) {
  const Shape& s = g.values[flatten.inputs[0]].shape;
  return !stored_nhwc(g.values[flatten.inputs[0]]) || s[1] == 1 || s[2] * s[3] == 1;
}
// A reshape keeps row-major order, so it is a byte alias of its input when
// both are stored row-major (not NHWC) and the input is not a constant.
inline bool reshape_is_alias(const Graph& g, const Node& reshape) {
  const Value &x = g.values[reshape.inputs[0]], &y = g.values[reshape.outputs[0]];
  return !stored_nhwc(x) && !stored_nhwc(y) && !x.constant;
}
inline void GraphFacts::start(const Graph& g) {
  fused_away.assign(g.nodes.size(), 0);
  folded_cast.assign(g.nodes.size(), 0);
  split_done.assign(g.nodes.size(), 0);
  alias.assign(g.values.size(), -1);
  for (const Node& n : g.nodes)
    if ((n.op == Op::Flatten && flatten_is_alias(g, n)) || (n.op == Op::Reshape && reshape_is_alias(g, n)))
      alias[n.outputs[0]] = n.inputs[0];
}
inline size_t value_bytes(const Value& v) { return static_cast<size_t>(shape_numel(v.shape)) * dtype_size(v.dtype); }

struct Lowering {
  CudaEngine::Impl& m;
  CudaEngine::Program& p;
  const Graph& g;  // p.shaped
  int64_t batch;
  GraphFacts& f;
  TacticSelector& tactics;
  ValuePtr ptr;

  const void* weight(int v) const {
    const DeviceBuffer& b = m.weights.at(v);
    note_read(b.get(), b.size());
    return b.get();
  }
  int pixel_stride(int v) const { return as_int(g.values[f.cv.root(v)].shape[1]); }  // channels of v's root buffer
  bool strided(int v) const { return f.viewed(v); }
  int stride_or_0(int v) const { return strided(v) ? pixel_stride(v) : 0; }
  // Appends a step; `kernel` says what it launches (the plan section and
  // `kiln inspect` show it). The step is labelled with the current node.
  void step(const std::string& kernel, std::function<void(const Exec&)> fn);
  // The tactic chosen for node `n` (and its time when measured or cached).
  void record(const std::string& node, const std::string& tactic, float us = -1.f);
  // A per-engine device buffer (re-laid-out weights ...) made once under `key`.
  const void* engine_buffer(const std::string& key, const std::function<DeviceBuffer()>& make);
  // engine_buffer holding a copy of `bytes` host bytes.
  const void* engine_copy(const std::string& key, const void* data, size_t bytes);
  std::string node_name;  // the node being lowered
  int node_index = -1;    // its index (-1: the engine inputs' conversion)
  // The engine constants each node's lowering took (weight(), engine_buffer()),
  // by node index: what switch weight_prefetch pulls into L2 (weight_prefetch.hpp).
  // Kept only for a program that inserts the prefetch.
  mutable std::map<int, std::vector<DeviceRange>> weight_reads{};
  void note_read(const void* at, size_t bytes) const {
    if (f.weight_prefetch && at && bytes) weight_reads[node_index].push_back({at, bytes});
  }
  // Grows the per-context workspace to at least `bytes` (steps use it one at a time).
  void reserve_workspace(size_t bytes) { p.workspace_bytes = std::max(p.workspace_bytes, bytes); }
  // A run-time check of node `node`: a 3-int64 device flag (Exec::checks + 3 *
  // index) its kernel sets; the context reads every flag after a run, fails
  // naming the node (CudaEngine::Program::checks) and zeroes them again.
  int add_check(const std::string& what);
};

// A value's device address in one enqueue, constants included (their upload).
struct Operand {
  ValuePtr ptr;
  int v = -1;
  const void* constant = nullptr;
  void* operator()(const Exec& x) const { return constant ? const_cast<void*>(constant) : ptr(x, v); }
};
inline Operand operand(const Lowering& L, int v) {
  return {L.ptr, v, L.g.values[v].constant ? L.weight(v) : nullptr};
}

// Offset of the n-th 256-byte-aligned block after `bytes` of workspace.
inline size_t align256(size_t bytes) { return (bytes + 255) / 256 * 256; }

// The strided copy (kernels.hpp) that writes y = permute(x, perm), each side
// in its stored layout (row-major, or NHWC for 4-D floats): transpose, the
// NHWC <-> row-major relayouts (identity perm) and reshape across layouts.
StridedCopy permute_copy(const Shape& x, bool x_nhwc, const std::vector<int64_t>& perm, bool y_nhwc);

// Row-major operands for a kernel that computes on logical row-major data
// (layer_norm, softmax, matmul, top_k, gather): each 4-D float input stored
// NHWC is transposed into the workspace before the kernel (load) and each
// such output is written there and transposed into place after it (store).
// The step uses workspace [0, scratch_bytes()); values stored row-major are
// used in place. Copyable into step closures (shape_ops.cpp).
class RowMajorIo {
 public:
  RowMajorIo(const Lowering& L, const std::vector<int>& ins, const std::vector<int>& outs);
  size_t scratch_bytes() const { return scratch_; }
  const void* in(const Exec& x, size_t k) const { return at(x, ins_[k]); }
  void* out(const Exec& x, size_t k) const { return at(x, outs_[k]); }
  void load(const Exec& x) const;
  void store(const Exec& x) const;
  // The step's kernel name with its relayouts: "softmax" or "softmax +2 nhwc relayouts".
  std::string kernel(const std::string& name) const;

 private:
  struct Io {
    Operand where;
    Shape shape;
    size_t elem_bytes = 0;
    bool nhwc = false;
    size_t off = 0;  // in the workspace, when nhwc
  };
  void* at(const Exec& x, const Io& io) const;
  std::vector<Io> ins_, outs_;
  size_t scratch_ = 0;
};

// Node `ni` on the plain reference, inside the stream (reference.cpp).
void lower_reference(Lowering& L, size_t ni);

// One per op of ops.def, defined in the files listed above.
#define KILN_OP(E, ...) void lower_##E(Lowering& L, size_t ni);
#include "ir/ops.def"
#undef KILN_OP

// Fusion groups a node leads instead of its own op's lowering.
void lower_se_mlp(Lowering& L, size_t ni);        // second SE conv: both convs as one se_mlp step
void lower_se_mlp_scale(Lowering& L, size_t ni);  // SE mul: convs + gate as one se_mlp_scale step
void lower_window_conv(Lowering& L, size_t lead); // a window-conv launch (conv.cpp)

// The cuDNN description of Conv2d node n (pixel strides 0: dense), conv.cpp.
ConvDesc conv_desc(const Graph& g, const Node& n, bool allow_tf32, int x_stride, int y_stride);
// Loading: builds the cuDNN plans of the convs whose recorded tactic is a
// cuDNN engine config on worker threads, one op per layer signature and
// tactic, into p.shared_convs (lower_Conv2d takes them from there). A conv
// whose op does not build here is left to lower_Conv2d, which reports it.
void prebuild_recorded_convs(Lowering& L);

// kiln's GEMM conv (gemm_conv.hpp, gemm_conv.cpp): im2col + cuBLASLt, a candidate of lower_Conv2d.
class GemmConvOp;
// Switch gemm_conv is on and the GEMM conv takes d (gemm_conv_unsupported).
bool gemm_conv_on(const Lowering& L, const ConvDesc& d);
// The op to time for conv d when gemm_conv_on and cuBLASLt offers an algorithm; else null.
std::shared_ptr<GemmConvOp> gemm_conv_op(const Lowering& L, const ConvDesc& d);
// The step of conv n as op with its selected algorithm; reserves its workspace.
void gemm_conv_step(Lowering& L, const Node& n, std::shared_ptr<const GemmConvOp> op);
// Loading conv n recorded with a gemm_conv tactic: records it, adds its step
// and returns true (false when `recorded` names no gemm_conv tactic). A
// record that cannot be replayed exactly (switch off, the conv not taken, the
// algorithm not offered by cuBLASLt's heuristic) is Error(Input) naming n.
bool lower_recorded_gemm_conv(Lowering& L, const Node& n, const ConvDesc& d, const std::string& recorded);

// 8-bit quantization (quant.cpp): FP8 quantize/dequantize and quantized
// conv2d/linear; why node n of that kind cannot run on CUDA (INT8, grouped
// FP8 convs ...), naming it, or "" (also "" for every other node).
std::string quant_refusal(const Graph& g, const Node& n);
// Value v as a producer that writes codes stores it (ir/quant_form.hpp
// writes_codes): its code type and f32(1 / scale); off for any other value.
CodeOut code_out(const Graph& g, int v);
void lower_quantized_conv(Lowering& L, size_t ni);    // a quantized conv2d (is_quantized_layer)
void lower_quantized_linear(Lowering& L, size_t ni);  // a quantized linear

// The first node of `g` whose op the CUDA backend does not lower yet, as the
// error compile would give, or "" (the backend's supports()).
std::string lowering_refusal(const Graph& g);

// ms_deform_attn's 4-D inputs (value, logits) that are reshapes of row-major
// values read only by ms_deform_attn: the reshape is fused away and its
// output aliases its input, so the kernel reads the row-major bytes in place
// (ms_deform_attn.cpp). Called by plan_fusions, not for dense graphs.
void plan_deform_inputs(const Graph& g, GraphFacts& f);
// Token rows of a map: transpose(reshape(x, [N, C, H*W]), [0, 2, 1]) with x a
// 4-D map stored NHWC is [N, H*W, C] row-major, x's own bytes: both nodes are
// fused away and the tokens alias x (shape_ops.cpp; RT-DETR's encoder input
// and decoder memory). Called by plan_fusions, not for dense graphs.
void plan_token_rows(const Graph& g, GraphFacts& f);

// The operand of two-input node `add` that is not v.
inline int other_input(const Node& add, int v) { return add.inputs[0] == v ? add.inputs[1] : add.inputs[0]; }

// A plain add reading y (no activation, no codes, row-major operands of y's
// shape and type, none a constant or channel view, not fused away) whose other
// operand is produced before node `at`, so at's launch can write the sum as a
// second output (RT-DETR's query + position: plan_norm_adds after a layer
// norm, plan_mlp_chains after the query position head); kNoNode if none (norm.cpp).
size_t earlier_sum_reader(const Graph& g, const GraphFacts& f, int y, size_t at);

// The first cast reading v to one of `to` that no plan has taken yet, or
// kNoNode (plan_norm_adds' f32 copy, plan_box_refines' narrowed reference).
inline size_t free_cast_reader(const Graph& g, const GraphFacts& f, int v, std::initializer_list<DType> to) {
  for (int c : g.consumers(v)) {
    const auto ci = static_cast<size_t>(c);
    const DType t = g.values[g.nodes[ci].outputs[0]].dtype;
    if (g.nodes[ci].op == Op::Cast && !f.fused_away[ci] && !f.folded_cast[ci] && std::find(to.begin(), to.end(), t) != to.end())
      return ci;
  }
  return kNoNode;
}
// Node `node` runs inside node `at`'s step, which writes its output early:
// fused away, its output's buffer live from `at` (GraphFacts::live_from).
inline void write_early(const Graph& g, GraphFacts& f, size_t node, size_t at) {
  f.fused_away[node] = 1;
  const auto [it, fresh] = f.live_from.try_emplace(g.nodes[node].outputs[0], static_cast<int>(at));
  if (!fresh) it->second = std::min(it->second, static_cast<int>(at));
}

// Adds around a layer_norm run inside its launch (norm.cpp; layer_norm_rows'
// x2 and y_pos), both fused away:
// - a residual add read only by the layer norm (post-norm "LN(x + f(x))", 11 in
//   r18vd): the layer norm reads both operands;
// - an add of the layer norm's output and a value produced before the layer
//   norm (RT-DETR's decoder "query + position" after the self-attention's layer
//   norm, one per layer): the launch writes the sum too (its buffer lives from
//   the layer norm's step, GraphFacts::live_from);
// - a cast of a 16-bit layer norm's output to f32 (RT-DETR's enc_output.1 feeding
//   the f32 score head), written by the same launch (live_from likewise).
// Taken for adds of row-major activations of the layer norm's shape and type,
// no activation, no codes; the residual sum no engine output.
void plan_norm_adds(const Graph& g, GraphFacts& f);

// A nearest upsample of an NHWC map read only by a channel concat (RT-DETR's
// FPN: upsample the lateral map, concat it with the backbone level) runs inside
// the concat's launch: the concat reads the smaller map at (i / sh, j / sw),
// the upsample is fused away and its output has no bytes of its own (an
// alias of its input, which lives until the concat). Taken for concats of
// 16-bit or f32 maps (no codes, no channel views, at most kMaxConcatInputs
// inputs); layout.cpp. Called by plan_fusions after the view plan.
void plan_upsample_concats(const Graph& g, GraphFacts& f);
// A mul of a row-major concat's output [N, S, C] (along axis 1, 16-bit or
// f32, no codes) by a constant [1, S, 1] of its type — one value per token
// row, RT-DETR's memory times its valid-anchor mask — runs inside the
// concat's launch (concat_rows_masked): the mul is fused away and its output
// written by that launch (live from it). layout.cpp; after plan_token_rows.
// `recorded` (a load: the bundle's plan lists the muls under `concat_mask`;
// null while building): only those muls; a plan without the key, none.
void plan_concat_masks(const Graph& g, GraphFacts& f, const std::set<std::string>* recorded = nullptr);

// An f32-island linear whose input is a cast of a 16-bit row-major activation
// read by it alone (RT-DETR's enc_score_head reading the 16-bit encoder output
// widened): the cast is fused away and the linear runs as a 16-bit GEMM with
// f32 accumulation, f32 bias and f32 output (cuBLASLt's mixed output type),
// its weights rounded to the input's type as every 16-bit layer's are. The
// product's inputs are the same 16-bit values; the scores stay f32 for top-k,
// which is what the island is for (linear.cpp). Called by plan_fusions before
// plan_norm_adds, which would otherwise write the f32 copy.
void plan_wide_linears(const Graph& g, GraphFacts& f);

// RT-DETR's box refinement, ref' = sigmoid(delta + inverse_sigmoid(ref)) with
// its f32 island's casts (16-bit delta widened, ref' narrowed for the next
// layer's query head): four launches per decoder layer as nodes, one here
// (elementwise.cpp; box_refine in kernels.hpp). Taken for an f32 add with
// activation none or sigmoid whose second input is an inverse_sigmoid of an
// f32 value of its shape read by it alone, and whose first is an f32 value or
// a cast to f32 read by it alone; a cast of the sum to f16/bf16 is written by
// the same launch (its buffer lives from the add's step, GraphFacts::live_from).
void plan_box_refines(const Graph& g, GraphFacts& f);
// Chains of small 16-bit linears, each read by the next alone, run as one
// mlp_chain launch at the last one (linear.cpp; switch fuse_mlp); a chain
// (of one linear or more) whose last result a layer norm reads through its
// fused residual add (plan_norm_adds) runs inside the norm's launch when
// `norms`. `sms`: the GPU's multiprocessors (mlp_chain_cluster).
// Which post-norm projections run as small_gemm_norm (switch linear_norm): at
// build (`recorded` null) those small_gemm_norm takes, up to `max_rows` rows,
// none when `on` is false (the switch's auto setting until it is measured on
// a GPU); at load the layer norms the bundle's plan names (`recorded`), as built.
struct LinearNormRule {
  bool on = true;
  int64_t max_rows = std::numeric_limits<int64_t>::max();
  const std::set<std::string>* recorded = nullptr;
};
// chains: plain chains and (norms) chains inside a post-norm (switch fuse_mlp);
// ln: one-linear chains inside a post-norm as small_gemm_norm.
void plan_mlp_chains(const Graph& g, GraphFacts& f, int sms, bool chains, bool norms, const LinearNormRule& ln);
// A layer norm's operands besides its input and output (norm.cpp): weight,
// bias, eps and, with plan_norm_adds' adds, the position add's operand and
// output and the f32 copy. norm_operands records the adds as inside the
// norm's launch; fill sets those pointers of a launch's LayerNormIo.
struct NormOperands {
  Operand w, b, pos;
  bool has_w = false, has_b = false;
  int y_pos = -1, y_f32 = -1;
  float eps = 1e-5f;
  ValuePtr ptr;
  void fill(const Exec& x, LayerNormIo& io) const;
};
NormOperands norm_operands(Lowering& L, size_t ln, const NormAdds* adds);
// plan_mlp_chains' launch at node `at` (linear.cpp; lower_Linear and lower_LayerNorm call it).
void lower_mlp_chain(Lowering& L, size_t at, const std::vector<size_t>& chain);

// Slices along the last axis of a row-major activation whose readers can
// read a window of each row in place (RT-DETR's q and k as slices of one
// projection, the sampling offsets and attention logits as slices of
// another): attention (any input), and ms_deform_attn's offsets and logits
// through the reshape that aliases them. Such a slice is fused away, its
// output a RowWindow of the source and a byte alias of it (never written: no
// arena bytes of its own; the source lives until the last reader); the readers take the source's address plus the offset and the row length
// as their row stride (shape_ops.cpp). Called by plan_fusions after
// plan_deform_inputs.
void plan_row_windows(const Graph& g, GraphFacts& f);
// The row window input v of a reader is, following reshapes that alias their
// input (the ms_deform_attn reshapes); null when v is no window.
const RowWindow* row_window(const Lowering& L, int v);
// Input `k` of `reader` as the kernel reads it when it is a row window: the
// source's address + the window's offset, rows `ld` elements apart (`on`
// false otherwise: the caller reads it as usual). Records the slice's note.
struct WindowRead {
  bool on = false;
  Operand src;
  size_t offset = 0;  // bytes
  int64_t ld = 0;     // elements
  const void* at(const Exec& x) const { return static_cast<const char*>(src(x)) + offset; }
};
WindowRead window_read(Lowering& L, const Node& reader, size_t k);

// A graph output that is an f32 cast of a 16-bit activation (the `logits`
// cast of every fp16/bf16 engine): the cast is fused away and the output
// conversion after the graph, which casts to f32 anyway, reads the 16-bit
// value (exact widening; one launch fewer per call). That value then lives
// to the end of the program. cuda_program.cpp.
void plan_output_casts(const Graph& g, GraphFacts& f);

// The side lane (side_lane.cpp): runs of convs, pools and linears off the
// critical path go to a second stream inside the captured graph, so they
// overlap the main lane's launches (RT-DETR: the backbone's shortcut
// branches, the encoder's input projections and CSP branches, the decoder's
// value projections). A run is a chain of such nodes, each read by the next
// alone; it forks after the last launch that writes what it reads and joins
// before the first launch that reads its result, and is taken only when at
// least one main-lane launch lies between the two. Every value the run reads
// or writes lives (GraphFacts::live_from/live_until) from the fork to the
// join, so no main-lane value shares its bytes while the two lanes run.
// Launch positions come from the fusion plans above (a fused node runs at the
// launch that computes it, early or late); a run next to a fused node whose
// launch is not known is not taken. Call last in plan_fusions; not for dense
// graphs, window convs, channel views or squeeze-excitation plans. With
// `late_fork` (switch late_side_fork), a run whose window holds a main-lane
// top_k of at most 8 rows before the run's first node forks right before the
// top_k instead. With `chain_fork` (switch chain_side_fork), a run whose
// window holds a main-lane mlp_chain launch before the run's first node forks
// right after the chain instead (not a run whose window holds such a top_k).
void plan_side_lane(const Graph& g, GraphFacts& f, bool late_fork = false, bool chain_fork = false);
// Per node: the index of the node whose launch computes it (itself when it
// has a launch of its own), kPassThrough for byte aliases (no launch: their
// readers read the source), kUnknownLaunch for fused nodes no plan accounts for.
inline constexpr int kPassThrough = -2, kUnknownLaunch = -3;
std::vector<int> launch_nodes(const Graph& g, const GraphFacts& f);
// After lowering: the side runs' steps, fork and join steps (Program::side_runs).
void schedule_side_lane(CudaEngine::Program& p, const GraphFacts& f);
// The side runs in the order enqueue takes them: by fork step, then join step.
void sort_side_runs(CudaEngine::Program& p);
// Switch weight_prefetch, after schedule_side_lane (weight_prefetch.cpp): the
// L2 prefetch step of the program's last steps' weights, on a side run of its
// own from the first main-lane step of that tail to the end; nothing when no
// tail of steps holds constants that fit (weight_prefetch.hpp).
void insert_weight_prefetch(Lowering& L);

// Lowers node `ni` (nothing for fused-away nodes): the dispatch over ops.def.
void lower_node(Lowering& L, size_t ni);
// The NCHW f32 -> NHWC steps of the engine inputs (layout.cpp), first in every program.
void lower_engine_inputs(Lowering& L);

}  // namespace kiln::cuda
