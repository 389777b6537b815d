// The CUDA lowering of layer_norm and softmax (kernels in norm.cu). Both
// compute on row-major data: a 4-D input or output (stored NHWC) goes
// through the workspace (RowMajorIo, lower.hpp). Statistics, exponentials
// and sums are f32 for every storage type; the result is rounded once.
#include "backends/cuda/lower.hpp"
#include "core/error.hpp"
#include "ir/attrs.hpp"

namespace kiln::cuda {

void lower_LayerNorm(Lowering& L, size_t ni) {
  const Node& n = L.g.nodes[ni];
  const Value& yv = L.g.values[n.outputs[0]];
  const int64_t c = yv.shape.back(), rows = shape_numel(yv.shape) / std::max<int64_t>(1, c);
  const RowMajorIo io(L, {n.inputs[0]}, {n.outputs[0]});
  L.reserve_workspace(io.scratch_bytes());
  const Operand w = n.inputs.size() > 1 ? operand(L, n.inputs[1]) : Operand{},
                b = n.inputs.size() > 2 ? operand(L, n.inputs[2]) : Operand{};
  const bool has_w = n.inputs.size() > 1, has_b = n.inputs.size() > 2;
  const float eps = static_cast<float>(n.attr_float("eps", 1e-5));
  const DType dt = yv.dtype;
  L.step(io.kernel("layer_norm"), [=](const Exec& x) {
    io.load(x);
    layer_norm_rows(io.in(x, 0), has_w ? w(x) : nullptr, has_b ? b(x) : nullptr, io.out(x, 0), dt, rows, as_int(c), eps,
                    x.stream);
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
