// The CPU backend runs every op of the op table (it is the reference backend).
// Activations are stored as f32; an f16/bf16 graph is emulated exactly by
// rounding each node's output to its storage type (RNE) and by using the
// narrow weights converted back to f32.
#pragma once
#include <memory>
#include <vector>

#include "backends/cpu/thread_pool.hpp"
#include "ir/graph.hpp"
#include "runtime/memory_planner.hpp"
#include "runtime/views.hpp"

namespace kiln::cpu {

bool supports(const Graph& g, const Node& n);

// Where activations live beyond the memory plan: channel views (slices,
// concat inputs written in place) and, for batches > 1, the same graph at
// batch 1 so nodes touching strided views run image by image.
struct CpuLayout {
  const ChannelViews* views = nullptr;
  const Graph* one = nullptr;  // batch-1 shapes, same value ids
};

class CpuProgram {
 public:
  // Converts constants to f32 once (f32 constants are used in place).
  explicit CpuProgram(const Graph& g);
  // `shaped` is the engine graph with shapes inferred for the batch at hand
  // (same value ids). Activations live in `arena` at plan.offsets.
  void run(const Graph& shaped, const MemoryPlan& plan, float* arena, ThreadPool& pool, const CpuLayout& layout = {}) const;
  // Like run, adding each node's wall time (ms) to (*node_ms)[node index].
  void run_profiled(const Graph& shaped, const MemoryPlan& plan, float* arena, ThreadPool& pool,
                    std::vector<double>* node_ms, const CpuLayout& layout = {}) const;
  // Runs one node on dense (or per-image) pointers; a slice that is a view
  // and concat inputs already in place copy nothing.
  void run_node(const Graph& shaped, const Node& n, const std::vector<float*>& value_ptrs, ThreadPool& pool,
                const ChannelViews* views = nullptr) const;
  const float* constant(int value_id) const { return constants_[value_id]; }

 private:
  std::vector<const float*> constants_;
  std::vector<std::vector<float>> converted_;
};

// Bytes the CPU backend stores for an activation (always f32).
size_t activation_bytes(const Value& v);

}  // namespace kiln::cpu
