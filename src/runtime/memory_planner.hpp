// Packs every activation into one arena. A value lives from the node that
// produces it (graph inputs: from the start) to its last reader (graph
// outputs: to the end); two values may share bytes when their lifetimes do
// not overlap. Every output of a multi-output node (top_k) has a lifetime of
// its own: an output nobody reads lives only during the node that writes it.
// Greedy by size, each placed at the lowest offset that does not collide with
// an already-placed value alive at the same time.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <vector>

#include "ir/graph.hpp"

namespace kiln {

struct MemoryPlan {
  std::vector<int64_t> offsets;  // per value id; -1 for constants
  size_t arena_bytes = 0;
  size_t naive_bytes = 0;  // sum of all activation sizes (no reuse)
};

// When a buffer is in use, as node indices (inclusive): from its first write
// (graph inputs: -1) to its last read (graph outputs: nodes.size()).
struct Lifetime {
  int first = 0, last = -1;
};

// Per value id: the lifetime of the buffer holding it (a view's is its
// root's, covering every view's writes and reads); constants get {0, -1}.
// alias_of, live_until and live_from as for plan_memory_with_views.
std::vector<Lifetime> value_lifetimes(const Graph& g, const std::function<int(int)>& alias_of,
                                      const std::map<int, int>& live_until = {},
                                      const std::map<int, int>& live_from = {});

// bytes_of gives the storage size of a non-constant value (backends store
// activations differently: the CPU backend keeps f32 even for f16 graphs).
MemoryPlan plan_memory(const Graph& g, const std::function<size_t(const Value&)>& bytes_of, size_t alignment = 64);

// Like plan_memory, but a value v with alias_of(v) = u >= 0 is a view of u's
// bytes (e.g. flatten): it gets u's offset, and u stays alive as long as
// any of its views is read.
// `live_until` (value -> node index) keeps a value alive through a later
// node than its last reader, for backends that fuse nodes and read an input
// at a later step; `live_from` (value -> node index) makes a value's buffer
// live from an earlier node than its producer, for a fused step that writes
// it early (the CUDA box refinement writes its cast's output).
MemoryPlan plan_memory_with_views(const Graph& g, const std::function<size_t(const Value&)>& bytes_of,
                                  const std::function<int(int)>& alias_of, size_t alignment = 64,
                                  const std::map<int, int>& live_until = {},
                                  const std::map<int, int>& live_from = {});

}  // namespace kiln
