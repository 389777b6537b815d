// The CUDA lowering of layer_norm and softmax (kernels in norm.cu). Both
// compute on row-major data: a 4-D input or output (stored NHWC) goes
// through the workspace (RowMajorIo, lower.hpp). Statistics, exponentials
// and sums are f32 for every storage type; the result is rounded once.
#include <algorithm>

#include "backends/cuda/lower.hpp"
#include "core/error.hpp"
#include "ir/attrs.hpp"

namespace kiln::cuda {

void plan_norm_adds(const Graph& g, GraphFacts& f) {
  for (size_t ni = 0; ni < g.nodes.size(); ++ni) {
    const Node& n = g.nodes[ni];
    if (n.op != Op::LayerNorm || f.fused_away[ni]) continue;
    const int sum = n.inputs[0];
    const Value& sv = g.values[sum];
    if (sv.producer < 0 || stored_nhwc(sv) || g.consumers(sum).size() != 1 ||
        std::find(g.outputs.begin(), g.outputs.end(), sum) != g.outputs.end())
      continue;
    const auto ai = static_cast<size_t>(sv.producer);
    const Node& add = g.nodes[ai];
    if (add.op != Op::Add || f.fused_away[ai] || add.activation() != Activation::None || code_out(g, sum).on() ||
        sv.dtype != g.values[n.outputs[0]].dtype || f.alias[sum] >= 0)
      continue;
    bool plain = true;
    for (int in : add.inputs) {
      const Value& iv = g.values[in];
      plain = plain && !iv.constant && iv.shape == sv.shape && iv.dtype == sv.dtype && !(f.use_views && f.cv.is_view(in));
    }
    if (!plain) continue;
    f.fused_away[ai] = 1;
    f.norm_adds[ni] = ai;
    for (int in : add.inputs) f.live_until[in] = std::max(f.live_until[in], static_cast<int>(ni));
  }
}

void lower_LayerNorm(Lowering& L, size_t ni) {
  const Node& n = L.g.nodes[ni];
  const Value& yv = L.g.values[n.outputs[0]];
  const int64_t c = yv.shape.back(), rows = shape_numel(yv.shape) / std::max<int64_t>(1, c);
  const Operand w = n.inputs.size() > 1 ? operand(L, n.inputs[1]) : Operand{},
                b = n.inputs.size() > 2 ? operand(L, n.inputs[2]) : Operand{};
  const bool has_w = n.inputs.size() > 1, has_b = n.inputs.size() > 2;
  const float eps = static_cast<float>(n.attr_float("eps", 1e-5));
  const DType dt = yv.dtype;
  if (const auto fused = L.f.norm_adds.find(ni); fused != L.f.norm_adds.end()) {  // layer_norm(a + r), plan_norm_adds
    const Node& add = L.g.nodes[fused->second];
    L.record(add.name, cat("inside ", n.name, " (no launch of its own)"));
    const RowMajorIo io(L, {}, {n.outputs[0]});
    L.reserve_workspace(io.scratch_bytes());
    const Operand a = operand(L, add.inputs[0]), r = operand(L, add.inputs[1]);
    L.step(io.kernel("add_layer_norm"), [=](const Exec& x) {
      layer_norm_rows(a(x), r(x), has_w ? w(x) : nullptr, has_b ? b(x) : nullptr, io.out(x, 0), dt, rows, as_int(c), eps,
                      x.stream);
      io.store(x);
    });
    return;
  }
  const RowMajorIo io(L, {n.inputs[0]}, {n.outputs[0]});
  L.reserve_workspace(io.scratch_bytes());
  L.step(io.kernel("layer_norm"), [=](const Exec& x) {
    io.load(x);
    layer_norm_rows(io.in(x, 0), nullptr, has_w ? w(x) : nullptr, has_b ? b(x) : nullptr, io.out(x, 0), dt, rows,
                    as_int(c), eps, x.stream);
    io.store(x);
  });
}

void lower_Softmax(Lowering& L, size_t ni) {
  const Node& n = L.g.nodes[ni];
  const AxisSplit a = softmax_split(L.g, n);
  const RowMajorIo io(L, {n.inputs[0]}, {n.outputs[0]});
  L.reserve_workspace(io.scratch_bytes());
  const DType dt = L.g.values[n.outputs[0]].dtype;
  L.step(io.kernel("softmax"), [=](const Exec& x) {
    io.load(x);
    softmax_axis(io.in(x, 0), io.out(x, 0), dt, a.outer, a.extent, a.inner, x.stream);
    io.store(x);
  });
}

}  // namespace kiln::cuda
