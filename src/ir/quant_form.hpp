// The graph form of 8-bit quantization (issue 13; docs/quantization.md
// "Graph form"): which values hold codes, which conv2d/linear nodes are
// quantized layers, and what each needs of Value::quant. The shape rules give
// the dtypes; quant_node_problem checks the scales (the verifier runs it, the
// kernels rely on it).
#pragma once
#include <string>

#include "ir/graph.hpp"

namespace kiln {

// The code types values of a graph may hold: f8e4m3 and i8.
inline bool is_8bit(DType t) { return t == DType::F8E4M3 || t == DType::I8; }
// The wide float types 8-bit values dequantize to.
inline bool is_wide_float(DType t) { return t == DType::F32 || t == DType::F16 || t == DType::BF16; }

// A conv2d or linear whose data input x is 8-bit (its weight is then 8-bit too).
bool is_quantized_layer(const Graph& g, const Node& n);

// The 16-bit producers that may write codes (attr out_dtype = a code type):
// max_pool2d, mul, add, concat and slice. The quantize pass folds the
// quantize that is a producer's only reader into it (docs/quantization.md
// "Producers that write codes"): the op computes in f32 from its wide inputs,
// as for an f32 output, and encodes once, code = encode(f32(y * f32(1 /
// scale))) with its output's one scale: one kernel instead of a 16-bit store
// and a quantize.
bool can_write_codes(Op op);
// Node n is such a producer and its output is 8-bit.
bool writes_codes(const Graph& g, const Node& n);

// Why node n's quantization parameters are unusable, or "": a quantize
// output, a dequantize input and a quantized layer's x carry Value::quant of
// their code type; a quantized layer's weight is a constant with one scale
// or one per output channel (axis 0); an 8-bit layer output has one scale,
// as has the output of a producer that writes codes; no other op reads an
// 8-bit value that has scales. Names the node and the value.
std::string quant_node_problem(const Graph& g, const Node& n);

}  // namespace kiln
