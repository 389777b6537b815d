// The CPU backend behind the backend interface (backends/backend.hpp): an
// engine is a CpuProgram; a context plans each batch size once (shapes,
// memory, channel views, fused adds) and owns the activation arena.
#pragma once
#include <cstdint>

#include "backends/cpu/cpu_backend.hpp"
#include "core/switches.hpp"
#include "ir/graph.hpp"
#include "runtime/memory_planner.hpp"
#include "runtime/views.hpp"

namespace kiln {

// Engine graph with shapes re-inferred for a batch size, plus its memory plan.
struct ShapedPlan {
  Graph graph;
  MemoryPlan memory;
  ChannelViews views;        // slices and in-place concat inputs (CPU backend)
  Graph one;                 // the graph at batch 1, for nodes that run image by image over strided views
  cpu::PrologueAdds adds;    // adds that run inside the conv reading them (CPU backend)
  cpu::CpuLayout layout() const { return {&views, &one, &adds}; }
};
// dense: no channel views or fused adds (nodes forced onto the plain reference need dense values).
ShapedPlan plan_for_batch(const Graph& g, int64_t batch, bool dense = false);

// `g` with every graph input's dimension 0 set to `batch` and shapes re-inferred.
Graph graph_at_batch(const Graph& g, int64_t batch);

}  // namespace kiln
