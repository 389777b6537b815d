#include "backends/cpu/cpu_backend.hpp"

#include <chrono>
#include <cstring>

#include "backends/cpu/kernels.hpp"
#include "core/error.hpp"
#include "core/half.hpp"
#include "ir/attrs.hpp"

namespace kiln::cpu {

bool supports(const Graph& g, const Node& n) {
  for (int in : n.inputs)
    if (!dtype_is_float(g.values[in].dtype)) return false;
  return true;
}

size_t activation_bytes(const Value& v) { return static_cast<size_t>(shape_numel(v.shape)) * sizeof(float); }

CpuProgram::CpuProgram(const Graph& g) : constants_(g.values.size(), nullptr) {
  for (size_t v = 0; v < g.values.size(); ++v) {
    const auto& c = g.values[v].constant;
    if (!c) continue;
    if (c->dtype == DType::F32 && reinterpret_cast<uintptr_t>(c->blob.data) % alignof(float) == 0) {
      constants_[v] = reinterpret_cast<const float*>(c->blob.data);
    } else {
      converted_.push_back(c->to_f32());
      constants_[v] = converted_.back().data();
    }
  }
}

namespace {

void round_storage(DType t, float* p, int64_t n) {
  if (t == DType::F16)
    for (int64_t i = 0; i < n; ++i) p[i] = round_f16(p[i]);
  else if (t == DType::BF16)
    for (int64_t i = 0; i < n; ++i) p[i] = round_bf16(p[i]);
}

int as_int(int64_t v) { return static_cast<int>(v); }

}  // namespace

void CpuProgram::run_node(const Graph& g, const Node& n, const std::vector<float*>& ptr, ThreadPool& pool) const {
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
      conv2d(cp, in(0), in(1), n.inputs.size() > 2 ? in(2) : nullptr, n.inputs.size() > 3 ? in(3) : nullptr,
             n.activation(), out, pool);
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
    case Op::Add: add(count, in(0), in(1), n.activation(), out); break;
    case Op::Mul:
      if (g.values[n.inputs[1]].shape == xs) {
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
    case Op::Linear: {
      const Shape& ws = g.values[n.inputs[1]].shape;
      linear(as_int(xs[0]), as_int(ws[1]), as_int(ws[0]), in(0), in(1), n.inputs.size() > 2 ? in(2) : nullptr,
             n.activation(), out, pool);
      break;
    }
    case Op::Concat: {
      if (n.attr_int("axis") != 1 || xs.size() != 4) fail_runtime(n.name, ": CPU concat supports NCHW channel axis only");
      std::vector<std::pair<const float*, int>> parts;
      for (size_t i = 0; i < n.inputs.size(); ++i) parts.push_back({in(i), as_int(g.values[n.inputs[i]].shape[1])});
      concat_channels(as_int(xs[0]), as_int(xs[2] * xs[3]), parts, out);
      break;
    }
    case Op::Slice: {
      if (n.attr_int("axis") != 1 || xs.size() != 4) fail_runtime(n.name, ": CPU slice supports NCHW channel axis only");
      int64_t start = n.attr_int("start"), end = n.attr_int("end");
      slice_channels(as_int(xs[0]), as_int(xs[1]), as_int(xs[2] * xs[3]), as_int(start), as_int(end - start), in(0), out);
      break;
    }
  }
  round_storage(out_v.dtype, out, count);
}

namespace {
std::vector<float*> value_pointers(const Graph& g, const MemoryPlan& plan, float* arena) {
  std::vector<float*> ptr(g.values.size(), nullptr);
  for (size_t v = 0; v < g.values.size(); ++v)
    if (plan.offsets[v] >= 0) ptr[v] = reinterpret_cast<float*>(reinterpret_cast<char*>(arena) + plan.offsets[v]);
  return ptr;
}
}  // namespace

void CpuProgram::run(const Graph& g, const MemoryPlan& plan, float* arena, ThreadPool& pool) const {
  const auto ptr = value_pointers(g, plan, arena);
  for (const Node& n : g.nodes) run_node(g, n, ptr, pool);
}

void CpuProgram::run_profiled(const Graph& g, const MemoryPlan& plan, float* arena, ThreadPool& pool,
                              std::vector<double>* node_ms) const {
  const auto ptr = value_pointers(g, plan, arena);
  node_ms->resize(g.nodes.size(), 0.0);
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    run_node(g, g.nodes[i], ptr, pool);
    (*node_ms)[i] += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  }
}

}  // namespace kiln::cpu
