// The plain reference: one naive implementation per op of ops.def, written to
// be read rather than to be fast (nested loops over NCHW indices, double
// accumulation). It is the yardstick of the op harness (tests/ops/): the
// optimized CPU backend and the CUDA backend are both compared against it.
//
// Precision: tensors are dense row-major f32 buffers holding values that are
// already at their storage precision (an f16 tensor holds f16 values). Each
// op computes in double and rounds its result once to the storage type of
// its output value (RNE, core/half.hpp), as an engine stores it.
#pragma once
#include <vector>

#include "ir/graph.hpp"

namespace kiln::ref {

using Buffer = std::vector<float>;

// Node n of g on dense inputs, one per n.inputs (constants included), shapes
// taken from g. Returns one buffer per output. Throws kiln::Error naming the
// node for an op it does not know.
std::vector<Buffer> run_reference(const Graph& g, const Node& n, const std::vector<Buffer>& inputs);

// The whole graph, node by node: `inputs` in g.inputs order (values at their
// storage precision); returns the graph outputs in g.outputs order.
std::vector<Buffer> run_reference_graph(const Graph& g, const std::vector<Buffer>& inputs);

// The activation functions in double; throws for an unknown kind.
double activate(Activation a, double x);

// What one op sees: its node, its graph (for shapes) and its input buffers.
struct OpArgs {
  const Graph& g;
  const Node& n;
  const std::vector<Buffer>& in;
  const Shape& in_shape(size_t i) const { return g.values.at(n.inputs.at(i)).shape; }
  const Shape& out_shape(size_t k = 0) const { return g.values.at(n.outputs.at(k)).shape; }
  bool has_input(size_t i) const { return n.inputs.size() > i; }
};

// One function per op (or op family), each in its own file; results before
// storage rounding (run_reference rounds). Ops with several outputs return
// one buffer per output; integer outputs (top_k's indices) hold exact
// integers as floats.
Buffer conv2d(const OpArgs& a);           // conv2d.cpp
Buffer batch_norm(const OpArgs& a);       // batch_norm.cpp
Buffer activation(const OpArgs& a);       // elementwise.cpp
Buffer add(const OpArgs& a);              // elementwise.cpp
Buffer mul(const OpArgs& a);              // elementwise.cpp
Buffer max_pool2d(const OpArgs& a);       // pool.cpp
Buffer avg_pool2d(const OpArgs& a);       // pool.cpp
Buffer global_avg_pool(const OpArgs& a);  // pool.cpp
Buffer linear(const OpArgs& a);           // linear.cpp
Buffer flatten(const OpArgs& a);          // shape_ops.cpp
Buffer concat(const OpArgs& a);           // shape_ops.cpp
Buffer slice(const OpArgs& a);            // shape_ops.cpp
Buffer cast(const OpArgs& a);             // shape_ops.cpp
std::vector<Buffer> top_k(const OpArgs& a);  // top_k.cpp: values, indices
Buffer layer_norm(const OpArgs& a);       // layer_norm.cpp
Buffer softmax(const OpArgs& a);          // softmax.cpp
Buffer matmul(const OpArgs& a);           // matmul.cpp
Buffer transpose(const OpArgs& a);        // shape_ops.cpp
Buffer reshape(const OpArgs& a);          // shape_ops.cpp
Buffer upsample_nearest(const OpArgs& a); // upsample.cpp
Buffer gather(const OpArgs& a);           // gather.cpp: indices read from floats holding integers
Buffer inverse_sigmoid(const OpArgs& a);  // elementwise.cpp
Buffer ms_deform_attn(const OpArgs& a);   // ms_deform_attn.cpp
Buffer quantize(const OpArgs& a);         // quant.cpp (quantized conv2d/linear: conv2d.cpp, linear.cpp)
Buffer dequantize(const OpArgs& a);       // quant.cpp
Buffer attention(const OpArgs& a);        // attention.cpp

}  // namespace kiln::ref
