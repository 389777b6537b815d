// `kiln build --reference GLOB` on the CUDA backend: the matched nodes run the
// plain reference (src/backends/cpu/ref/) on the host, inside the CUDA stream,
// so a suspect layer can be checked in place while every other layer runs its
// GPU kernels. Per node, one step:
//   copy each non-constant input device -> pinned host (its stored dtype and
//   layout), a host function (cudaLaunchHostFunc; CUDA graphs capture it)
//   that converts to the reference's dense f32 NCHW, runs the reference op and
//   converts its result back to the stored dtype and layout, then copy the
//   output host -> device.
// The pinned buffers belong to each execution context (Exec::host), so two
// contexts never share them. A host function may not call CUDA or throw: a
// failure is kept in the context's HostCall and raised by its next call
// (CudaContext checks after every run it synchronizes, and before every run).
// The graph runs "dense" when any node is on the reference (GraphFacts::dense:
// no channel views, window convs, squeeze-excitation or split-run fusion), as
// the CPU backend does, so every referenced value is one dense buffer.
#include <cstring>

#include "backends/cpu/ref/ref.hpp"
#include "backends/cuda/cuda_check.hpp"
#include "backends/cuda/lower.hpp"
#include "core/error.hpp"
#include "core/half.hpp"

namespace kiln::cuda {

namespace {

// One value as the host function sees it.
struct HostValue {
  DType dtype = DType::F32;
  Shape shape;      // logical (NCHW for 4-D)
  bool nhwc = false;  // stored NHWC (layout assignment, lower.hpp)
  size_t offset = 0;  // in the context's pinned buffer
  size_t bytes = 0;
};

float load(const char* p, DType t, size_t i) {
  switch (t) {
    case DType::F32: {
      float v;
      std::memcpy(&v, p + i * 4, 4);
      return v;
    }
    case DType::F16: {
      uint16_t h;
      std::memcpy(&h, p + i * 2, 2);
      return f16_to_f32(h);
    }
    case DType::BF16: {
      uint16_t h;
      std::memcpy(&h, p + i * 2, 2);
      return bf16_to_f32(h);
    }
    default: fail_runtime("reference on CUDA: no host conversion for ", dtype_name(t));
  }
}

void store(char* p, DType t, size_t i, float v) {
  switch (t) {
    case DType::F32: std::memcpy(p + i * 4, &v, 4); return;
    case DType::F16: {
      const uint16_t h = f32_to_f16(v);
      std::memcpy(p + i * 2, &h, 2);
      return;
    }
    case DType::BF16: {
      const uint16_t h = f32_to_bf16(v);
      std::memcpy(p + i * 2, &h, 2);
      return;
    }
    default: fail_runtime("reference on CUDA: no host conversion for ", dtype_name(t));
  }
}

// Index of logical NCHW element (n, c, y, x) in NHWC storage.
size_t nhwc_index(const Shape& s, size_t logical) {
  const size_t C = s[1], H = s[2], W = s[3];
  const size_t x = logical % W, y = logical / W % H, c = logical / (W * H) % C, n = logical / (W * H * C);
  return ((n * H + y) * W + x) * C + c;
}

ref::Buffer to_logical(const char* host, const HostValue& v) {
  ref::Buffer b(static_cast<size_t>(shape_numel(v.shape)));
  for (size_t i = 0; i < b.size(); ++i) b[i] = load(host, v.dtype, v.nhwc ? nhwc_index(v.shape, i) : i);
  return b;
}

void from_logical(const ref::Buffer& b, char* host, const HostValue& v) {
  for (size_t i = 0; i < b.size(); ++i) store(host, v.dtype, v.nhwc ? nhwc_index(v.shape, i) : i, b[i]);
}

bool host_convertible(DType t) { return t == DType::F32 || t == DType::F16 || t == DType::BF16; }

// What the host function of one referenced node needs: a one-node graph (shapes and
// attributes; constants are passed as buffers), the constant inputs converted once,
// and where each value sits in the context's pinned buffer.
struct RefNode {
  Graph one;                                   // values 0..k-1: inputs, then outputs
  std::vector<std::optional<ref::Buffer>> constants;  // per input: its value when constant
  std::vector<HostValue> ins, outs;
  void run(char* host) const {
    std::vector<ref::Buffer> in(ins.size());
    for (size_t i = 0; i < ins.size(); ++i) in[i] = constants[i] ? *constants[i] : to_logical(host + ins[i].offset, ins[i]);
    const std::vector<ref::Buffer> out = ref::run_reference(one, one.nodes[0], in);
    for (size_t k = 0; k < outs.size(); ++k) from_logical(out.at(k), host + outs[k].offset, outs[k]);
  }
};

void CUDART_CB run_host_call(void* p) {
  auto* c = static_cast<HostCall*>(p);
  if (!c->error.empty()) return;  // raised at the next call; do not pile up more
  try {
    c->fn(c->host);
  } catch (const std::exception& e) {
    c->error = e.what();
  } catch (...) {
    c->error = "unknown error";
  }
}

}  // namespace

void lower_reference(Lowering& L, size_t ni) {
  const Graph& g = L.g;
  const Node& n = g.nodes[ni];
  auto r = std::make_shared<RefNode>();
  Node copy = n;
  copy.inputs.clear();
  copy.outputs.clear();
  auto add_value = [&](int v, std::vector<HostValue>& list) {
    const Value& val = g.values[v];
    if (!val.constant && !host_convertible(val.dtype))
      fail_input(n.name, ": the plain reference on CUDA (--reference) takes f32, f16 and bf16 values; ", val.name, " is ",
                 dtype_name(val.dtype));
    Value slot;
    slot.name = val.name;
    slot.dtype = val.dtype;
    slot.shape = val.shape;
    r->one.values.push_back(slot);
    HostValue h{val.dtype, val.shape, stored_nhwc(val), L.p.host_staging_bytes, value_bytes(val)};
    if (!val.constant) L.p.host_staging_bytes += (h.bytes + 255) / 256 * 256;
    list.push_back(h);
    return static_cast<int>(r->one.values.size()) - 1;
  };
  for (int v : n.inputs) {
    copy.inputs.push_back(add_value(v, r->ins));
    const Value& val = g.values[v];
    r->constants.push_back(val.constant ? std::optional<ref::Buffer>(val.constant->to_f32()) : std::nullopt);
  }
  for (int v : n.outputs) {
    copy.outputs.push_back(add_value(v, r->outs));
    r->one.values.back().producer = 0;
  }
  r->one.nodes.push_back(std::move(copy));
  std::vector<int> dev_in, dev_out;
  for (int v : n.inputs) dev_in.push_back(g.values[v].constant ? -1 : v);
  for (int v : n.outputs) dev_out.push_back(v);
  const ValuePtr ptr = L.ptr;
  L.step("plain reference (host)", [=](const Exec& x) {
    if (!x.host || !x.host_calls) fail_runtime(r->one.nodes[0].name, ": no pinned host buffer for the plain reference");
    for (size_t i = 0; i < dev_in.size(); ++i)
      if (dev_in[i] >= 0)
        KILN_CUDA_CHECK(cudaMemcpyAsync(x.host + r->ins[i].offset, ptr(x, dev_in[i]), r->ins[i].bytes,
                                        cudaMemcpyDeviceToHost, x.stream));
    HostCall& call = (*x.host_calls)[r.get()];
    call.host = x.host;
    call.node = r->one.nodes[0].name;
    call.fn = [r](char* host) { r->run(host); };
    KILN_CUDA_CHECK(cudaLaunchHostFunc(x.stream, run_host_call, &call));
    for (size_t k = 0; k < dev_out.size(); ++k)
      KILN_CUDA_CHECK(cudaMemcpyAsync(ptr(x, dev_out[k]), x.host + r->outs[k].offset, r->outs[k].bytes,
                                      cudaMemcpyHostToDevice, x.stream));
  });
}

}  // namespace kiln::cuda
