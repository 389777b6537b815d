#include "backends/cpu/cpu_backend.hpp"

#include "ir/fusion_marks.hpp"
#include "backends/cpu/ref/ref.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <string>

#include "backends/cpu/kernels.hpp"
#include "core/broadcast.hpp"
#include "core/error.hpp"
#include "core/half.hpp"
#include "ir/attrs.hpp"
#include "ir/quant_form.hpp"

namespace kiln::cpu {

namespace {

// Integer values live in the f32 arena as exact integers (|v| <= 2^24, the
// range where floats hold every integer): top_k writes its indices so, and the
// one reader of integers is gather's index, which checks every index against
// its axis (at most 2^24 long) before it uses one.
constexpr int64_t kExactFloatInts = int64_t{1} << 24;
bool reads_as_index(const Node& n, size_t input) { return n.op == Op::Gather && input == 1; }
// i8 codes are read by dequantize and by quantized layers (x, weight, and a
// conv's 8-bit residual); they are exact small integers in the f32 arena.
bool reads_codes(const Node& n, size_t input) {
  return (n.op == Op::Dequantize && input == 0) || ((n.op == Op::Conv2d || n.op == Op::Linear) && input < 2) ||
         (n.op == Op::Conv2d && input == 3);
}

QuantScales quant_scales(const Value& v) {
  QuantScales s;
  if (!v.quant) fail_input("value '", v.name, "' has no quantization scales");
  s.scales = v.quant->scales;
  if (v.quant->axis >= 0) s.inner = split_at(v.shape, v.quant->axis).inner;
  return s;
}

}  // namespace

bool supports(const Graph& g, const Node& n) {
  for (size_t i = 0; i < n.inputs.size(); ++i)
    if (!dtype_is_float(g.values[n.inputs[i]].dtype) && !reads_as_index(n, i) &&
        !(g.values[n.inputs[i]].dtype == DType::I8 && reads_codes(n, i)))
      return false;
  return quant_node_problem(g, n).empty();
}

size_t activation_bytes(const Value& v) { return static_cast<size_t>(shape_numel(v.shape)) * sizeof(float); }

CpuProgram::CpuProgram(const Graph& g) : constants_(g.values.size(), nullptr) {
  // Integer constants are read only as gather indices; any other reader of one is refused.
  std::vector<char> index_only(g.values.size(), 1);
  for (const Node& n : g.nodes)
    for (size_t i = 0; i < n.inputs.size(); ++i)
      if (!reads_as_index(n, i) && !reads_codes(n, i)) index_only[n.inputs[i]] = 0;
  for (size_t v = 0; v < g.values.size(); ++v) {
    const auto& c = g.values[v].constant;
    if (!c) continue;
    if (c->dtype == DType::F32 && reinterpret_cast<uintptr_t>(c->blob.data) % alignof(float) == 0) {
      constants_[v] = reinterpret_cast<const float*>(c->blob.data);
    } else {
      // The CPU backend computes in f32: an integer constant becomes exact
      // floats for gather's index and is refused by name anywhere else.
      if (!dtype_is_float(c->dtype) && !index_only[v])
        fail_input("constant '", g.values[v].name, "' is ", dtype_name(c->dtype),
                   ": the CPU backend reads integer constants only as gather indices");
      converted_.push_back(c->to_f32());
      if (!dtype_is_float(c->dtype))
        for (float f : converted_.back())
          if (std::fabs(f) > static_cast<float>(kExactFloatInts))
            fail_input("constant '", g.values[v].name, "' holds ", f, ": the CPU backend keeps integers as f32, exact to 2^24");
      constants_[v] = converted_.back().data();
    }
  }
}

namespace {

void round_storage(DType t, float* p, int64_t n) {
  if (t == DType::F16 || t == DType::BF16)
    for (int64_t i = 0; i < n; ++i) p[i] = round_to_storage(t, p[i]);
}

int as_int(int64_t v) { return static_cast<int>(v); }

}  // namespace

PrologueAdds plan_prologue_adds(const Graph& g, bool enabled) {
  PrologueAdds a;
  a.add_of.assign(g.nodes.size(), -1);
  a.fused.assign(g.nodes.size(), 0);
  if (!enabled) return a;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const int add = input_add_of(g, i);  // the fusion mark fuse_conv_input_add set
    if (add < 0) continue;
    a.add_of[i] = add;
    a.fused[add] = 1;
    ++a.count;
  }
  return a;
}

std::map<int, int> PrologueAdds::live_until(const Graph& g) const {
  std::map<int, int> until;
  for (size_t c = 0; c < add_of.size(); ++c)
    if (add_of[c] >= 0)
      for (int v : g.nodes[add_of[c]].inputs) until[v] = std::max(until.count(v) ? until[v] : 0, static_cast<int>(c));
  return until;
}

void CpuProgram::run_node(const Graph& g, const Node& n, const std::vector<float*>& ptr, ThreadPool& pool,
                          const ChannelViews* views, const Node* prologue_add) const {
  auto in = [&](size_t i) -> const float* {
    int v = n.inputs[i];
    return constants_[v] ? constants_[v] : ptr[v];
  };
  const Value& out_v = g.values[n.outputs[0]];
  float* out = ptr[n.outputs[0]];
  const Shape& xs = g.values[n.inputs[0]].shape;
  const int64_t count = shape_numel(out_v.shape);
  switch (n.op) {
    case Op::Conv2d: {
      const Shape& ws = g.values[n.inputs[1]].shape;
      const ConvAttrs a = conv_attrs(n);
      Conv2dParams cp;
      cp.n = as_int(xs[0]), cp.c_in = as_int(xs[1]), cp.h = as_int(xs[2]), cp.w = as_int(xs[3]);
      cp.c_out = as_int(ws[0]), cp.kh = as_int(ws[2]), cp.kw = as_int(ws[3]);
      cp.stride_h = a.stride_h, cp.stride_w = a.stride_w, cp.dil_h = a.dil_h, cp.dil_w = a.dil_w, cp.groups = a.groups;
      cp.pad_t = a.pad_t, cp.pad_l = a.pad_l, cp.pad_b = a.pad_b, cp.pad_r = a.pad_r;
      const float* bias = n.inputs.size() > 2 ? in(2) : nullptr;
      const float* residual = n.inputs.size() > 3 ? in(3) : nullptr;
      if (is_quantized_layer(g, n)) {
        if (prologue_add) fail_runtime(n.name, ": a quantized conv2d cannot read through a fused add");
        qconv2d(cp, in(0), in(1), residual, quant::layer_epilogue(g, n, bias), out, pool);
      } else if (prologue_add) {
        conv2d_of_sum(cp, ptr[prologue_add->inputs[0]], ptr[prologue_add->inputs[1]],
                      g.values[prologue_add->outputs[0]].dtype, in(1), bias, residual, n.activation(), out, pool);
      } else {
        conv2d(cp, in(0), in(1), bias, residual, n.activation(), out, pool);
      }
      break;
    }
    case Op::BatchNorm: {
      const float *x = in(0), *sc = in(1), *b = in(2), *m = in(3), *var = in(4);
      const double eps = n.attr_float("eps", 1e-5);
      const int64_t c = xs[1], inner = count / (xs[0] * c);
      for (int64_t i = 0; i < count; ++i) {
        int64_t ch = (i / inner) % c;
        out[i] = static_cast<float>((x[i] - m[ch]) / std::sqrt(var[ch] + eps) * sc[ch] + b[ch]);
      }
      break;
    }
    case Op::Activation: activation(count, in(0), n.activation(), out); break;
    case Op::Add:
    case Op::Mul:
      if (const Shape& bs = g.values[n.inputs[1]].shape; constants_[n.inputs[1]] && broadcasts_per_image(bs, xs)) {
        // A constant repeated per image (core/broadcast.hpp): expanded once per run, image by image.
        const std::vector<float> b = broadcast_one_image(std::vector<float>(in(1), in(1) + shape_numel(bs)), bs, xs);
        const int64_t per = static_cast<int64_t>(b.size());
        for (int64_t at = 0; at < count; at += per) {
          if (n.op == Op::Add)
            add(per, in(0) + at, b.data(), n.activation(), out + at);
          else
            for (int64_t i = 0; i < per; ++i) out[at + i] = in(0)[at + i] * b[static_cast<size_t>(i)];
        }
      } else if (n.op == Op::Add) {
        add(count, in(0), in(1), n.activation(), out);
      } else if (g.values[n.inputs[1]].shape == xs) {
        for (int64_t i = 0; i < count; ++i) out[i] = in(0)[i] * in(1)[i];
      } else {
        mul_channel(as_int(xs[0]), as_int(xs[1]), as_int(xs[2] * xs[3]), in(0), in(1), out);
      }
      break;
    case Op::MaxPool2d:
    case Op::AvgPool2d: {
      const PoolAttrs a = pool_attrs(n);
      Pool2dParams pp;
      pp.n = as_int(xs[0]), pp.c = as_int(xs[1]), pp.h = as_int(xs[2]), pp.w = as_int(xs[3]);
      pp.kh = a.kh, pp.kw = a.kw, pp.stride_h = a.stride_h, pp.stride_w = a.stride_w;
      pp.pad_t = a.pad_t, pp.pad_l = a.pad_l, pp.pad_b = a.pad_b, pp.pad_r = a.pad_r;
      pp.ceil_mode = a.ceil_mode;
      pp.count_include_pad = a.count_include_pad;
      if (n.op == Op::MaxPool2d) max_pool2d(pp, in(0), out, pool);
      else avg_pool2d(pp, in(0), out, pool);
      break;
    }
    case Op::GlobalAvgPool: global_avg_pool(as_int(xs[0]), as_int(xs[1]), as_int(xs[2] * xs[3]), in(0), out); break;
    case Op::Flatten:
    case Op::Cast: std::memcpy(out, in(0), static_cast<size_t>(count) * sizeof(float)); break;
    case Op::Linear: {  // x[..., K] as [rows, K]
      const Shape& ws = g.values[n.inputs[1]].shape;
      if (is_quantized_layer(g, n)) {
        qlinear(ws[1] > 0 ? shape_numel(xs) / ws[1] : 0, ws[1], ws[0], in(0), in(1),
                quant::layer_epilogue(g, n, n.inputs.size() > 2 ? in(2) : nullptr), out, pool);
        break;
      }
      linear(as_int(ws[1] > 0 ? shape_numel(xs) / ws[1] : 0), as_int(ws[1]), as_int(ws[0]), in(0), in(1),
             n.inputs.size() > 2 ? in(2) : nullptr, n.activation(), out, pool);
      break;
    }
    case Op::LayerNorm: {
      const int64_t c = xs.back();
      layer_norm(count / c, c, in(0), n.inputs.size() > 1 ? in(1) : nullptr, n.inputs.size() > 2 ? in(2) : nullptr,
                 static_cast<float>(n.attr_float("eps", 1e-5)), out, pool);
      break;
    }
    case Op::Softmax: {
      const AxisSplit a = softmax_split(g, n);
      softmax(a.outer, a.extent, a.inner, in(0), out, pool);
      break;
    }
    case Op::MatMul: {
      const MatMulDims d = matmul_dims(g, n);
      matmul(d.batch, d.m, d.k, d.n, in(0), d.a_stride(), in(1), d.b_stride(), out, pool);
      break;
    }
    case Op::Transpose: transpose(xs, n.attr_ints("perm"), in(0), out, pool); break;
    case Op::Reshape: std::memcpy(out, in(0), static_cast<size_t>(count) * sizeof(float)); break;
    case Op::UpsampleNearest: {
      const UpsampleAttrs a = upsample_attrs(n);
      upsample_nearest(xs[0] * xs[1], xs[2], xs[3], a.sh, a.sw, in(0), out, pool);
      break;
    }
    case Op::Gather: {
      const GatherDims d = gather_dims(g, n);
      if (d.extent > kExactFloatInts)
        fail_input(n.name, ": gather along an axis of ", d.extent, " elements (the CPU backend holds indices as f32, exact to 2^24)");
      if (const int64_t bad = first_bad_index(in(1), d.outer * d.k, d.extent); bad >= 0)
        fail_input(n.name, ": gather index ", in(1)[bad], " (row ", bad / std::max<int64_t>(1, d.k), ", position ",
                   bad % std::max<int64_t>(1, d.k), ") is not an integer in [0, ", d.extent, ")");
      gather(d.outer, d.extent, d.inner, d.k, in(0), in(1), out, pool, d.shared_x());
      break;
    }
    case Op::MsDeformAttn: {
      const DeformAttnDims d = deform_attn_dims(g, n);
      DeformAttnParams pr;
      pr.n = d.n, pr.s = d.s, pr.heads = d.heads, pr.d = d.d, pr.q = d.q, pr.p = d.p;
      pr.level_h = d.level_h, pr.level_w = d.level_w, pr.level_start = d.level_start, pr.points = d.points;
      pr.offset_scale = static_cast<float>(d.offset_scale), pr.discrete = d.discrete;
      ms_deform_attn(pr, in(0), in(1), in(2), in(3), out, pool);
      break;
    }
    case Op::Attention: {
      const AttentionDims d = attention_dims(g, n);
      const AttentionParams pr{d.n, d.lq, d.lk, d.heads, d.d, d.dv, static_cast<float>(d.scale)};
      attention(pr, in(0), in(1), in(2), out, pool);
      break;
    }
    case Op::InverseSigmoid:
      inverse_sigmoid(count, in(0), static_cast<float>(n.attr_float("eps", 1e-5)), out);
      break;
    case Op::Quantize: quantize(count, in(0), quant_scales(out_v), out_v.dtype, out, pool); break;
    case Op::Dequantize: dequantize(count, in(0), quant_scales(g.values[n.inputs[0]]), out, pool); break;
    case Op::Concat: {  // row-major along any axis: `rows` rows, each the inputs' chunks side by side
      const int64_t rows = split_at(out_v.shape, axis_attr(n, out_v.shape.size(), 1)).outer;
      if (rows == 0) break;
      const int64_t row_out = count / rows;
      int64_t off = 0;
      for (size_t i = 0; i < n.inputs.size(); ++i) {
        const int64_t chunk = shape_numel(g.values[n.inputs[i]].shape) / rows;
        if (!(views && views->parent[n.inputs[i]] == n.outputs[0]))  // in place: its producer wrote it here
          for (int64_t r = 0; r < rows; ++r)
            std::memcpy(out + r * row_out + off, in(i) + r * chunk, static_cast<size_t>(chunk) * sizeof(float));
        off += chunk;
      }
      break;
    }
    case Op::TopK: {  // values into `out`, indices (as exact floats) into the second output
      const TopKAttrs a = top_k_attrs(g, n);
      if (a.extent > kExactFloatInts) fail_input(n.name, ": top_k over more than 2^24 elements (indices are stored as f32)");
      top_k(a.outer, a.extent, a.inner, a.k, a.largest, in(0), out, ptr[n.outputs[1]], pool);
      break;
    }
    case Op::Slice: {
      // A window of its input: nothing to copy. (A slice whose output is written
      // in place into a concat is a view of the concat, not of its input: it copies.)
      if (views && views->is_view(n.outputs[0]) && views->parent[n.outputs[0]] == n.inputs[0]) return;
      int64_t start = n.attr_int("start"), end = n.attr_int("end");
      if (n.attr_int("axis") == 1 && xs.size() == 4) {
        slice_channels(as_int(xs[0]), as_int(xs[1]), as_int(xs[2] * xs[3]), as_int(start), as_int(end - start), in(0), out);
        break;
      }
      // Any other axis, row-major: `outer` rows of x, each giving the window [start, end) * inner.
      const AxisSplit a = split_at(xs, axis_attr(n, xs.size(), 1));
      const int64_t row_in = a.extent * a.inner, chunk = (end - start) * a.inner;
      for (int64_t r = 0; r < a.outer; ++r)
        std::memcpy(out + r * chunk, in(0) + r * row_in + start * a.inner, static_cast<size_t>(chunk) * sizeof(float));
      break;
    }
    default: fail_runtime(n.name, ": the CPU backend has no kernel for op ", op_name(n.op));
  }
  // A producer that writes codes encodes its f32 result once (ir/quant_form.hpp).
  if (writes_codes(g, n)) quantize(count, out, quant_scales(out_v), out_v.dtype, out, pool);
  else round_storage(out_v.dtype, out, count);
}

namespace {

// Pointer of value v for image b (b = 0 with dense values gives the whole
// tensor). Views live inside their root: channel offset * H*W into each image
// of the root, whose images are C_root * H*W apart.
float* value_ptr(const Graph& g, const MemoryPlan& plan, const ChannelViews* views, float* arena, int v, int64_t b) {
  if (plan.offsets[v] < 0) return nullptr;
  float* base = reinterpret_cast<float*>(reinterpret_cast<char*>(arena) + plan.offsets[v]);
  const Shape& s = g.values[v].shape;
  if (!views || !views->is_view(v)) return base + (s.empty() || s[0] == 0 ? 0 : b * (shape_numel(s) / s[0]));
  const int r = views->root(v);
  const Shape& rs = g.values[r].shape;
  const int64_t hw = rs[2] * rs[3];
  return base + b * rs[1] * hw + views->root_offset(v) * hw;
}

// Runs every node; nodes touching a strided view (batch > 1) run image by image.
template <typename Fn>
void for_each_node(const Graph& g, const MemoryPlan& plan, float* arena, const CpuLayout& layout, Fn&& fn) {
  std::vector<float*> ptr(g.values.size(), nullptr);
  const int64_t batch = g.inputs.empty() ? 1 : g.values[g.inputs[0]].shape[0];
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    if (layout.adds && layout.adds->fused[i]) continue;  // runs inside the conv that reads it
    const Node* add = layout.adds ? layout.adds->add_for(g, i) : nullptr;
    auto for_reads = [&](auto&& f) {  // the node's inputs and those of the add it reads through
      for (int v : n.inputs) f(v);
      if (add)
        for (int v : add->inputs) f(v);
    };
    bool strided = false;
    if (layout.views && batch > 1) {
      for_reads([&](int v) { strided |= layout.views->is_view(v); });
      for (int o : n.outputs) strided |= layout.views->is_view(o);
    }
    if (strided && !layout.one) fail_runtime(n.name, ": strided views need the batch-1 graph");
    const int64_t items = strided ? batch : 1;
    for (int64_t b = 0; b < items; ++b) {
      for_reads([&](int v) { ptr[v] = value_ptr(g, plan, layout.views, arena, v, b); });
      for (int o : n.outputs) ptr[o] = value_ptr(g, plan, layout.views, arena, o, b);
      fn(i, strided ? *layout.one : g, ptr);
    }
  }
}

}  // namespace

bool CpuProgram::any_reference() const {
  for (char r : reference_)
    if (r) return true;
  return false;
}

void CpuProgram::run_reference_node(const Graph& g, const Node& n, const std::vector<float*>& ptr) const {
  std::vector<ref::Buffer> in;
  for (int v : n.inputs) {
    const float* p = constants_[v] ? constants_[v] : ptr[v];
    in.emplace_back(p, p + shape_numel(g.values[v].shape));
  }
  const auto out = ref::run_reference(g, n, in);
  for (size_t k = 0; k < n.outputs.size(); ++k) std::copy(out[k].begin(), out[k].end(), ptr[n.outputs[k]]);
}

void CpuProgram::run(const Graph& g, const MemoryPlan& plan, float* arena, ThreadPool& pool, const CpuLayout& layout) const {
  for_each_node(g, plan, arena, layout, [&](size_t i, const Graph& shapes, const std::vector<float*>& ptr) {
    if (i < reference_.size() && reference_[i]) return run_reference_node(shapes, shapes.nodes[i], ptr);
    run_node(shapes, shapes.nodes[i], ptr, pool, layout.views, layout.adds ? layout.adds->add_for(shapes, i) : nullptr);
  });
}

void CpuProgram::run_profiled(const Graph& g, const MemoryPlan& plan, float* arena, ThreadPool& pool,
                              std::vector<double>* node_ms, const CpuLayout& layout) const {
  node_ms->resize(g.nodes.size(), 0.0);
  for_each_node(g, plan, arena, layout, [&](size_t i, const Graph& shapes, const std::vector<float*>& ptr) {
    const auto t0 = std::chrono::steady_clock::now();
    if (i < reference_.size() && reference_[i]) run_reference_node(shapes, shapes.nodes[i], ptr);
    else run_node(shapes, shapes.nodes[i], ptr, pool, layout.views, layout.adds ? layout.adds->add_for(shapes, i) : nullptr);
    (*node_ms)[i] += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  });
}

}  // namespace kiln::cpu
