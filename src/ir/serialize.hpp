// graph.json + weights.bin: the optimized graph as (compact) JSON, and
// every constant's bytes concatenated with 64-byte alignment (mmapped at load
// and used in place). docs/bundle-format.md describes both.
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/tensor.hpp"
#include "ir/graph.hpp"

namespace kiln {

inline constexpr int kGraphFormat = 1;

struct SerializedGraph {
  std::string graph_json;
  std::vector<uint8_t> weights;
};

SerializedGraph serialize_graph(const Graph& g);
// A value's quantization as graph.json writes it: {"scales": [shortest
// f32 text], "axis": int, "dtype": name} (also `kiln inspect --scales`).
nlohmann::json quant_to_json(const QuantParams& q);
// Strict: unknown ops or dtypes, ids out of range, constants outside the
// weights blob, wrong input counts and shape mismatches are Error(Input)
// naming `source` (e.g. "model.bundle: graph.json") and the node/value.
Graph deserialize_graph(const std::string& graph_json, const Blob& weights, const std::string& source);

}  // namespace kiln
