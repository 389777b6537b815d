// The CPU backend runs every op of the op table (it is the reference backend).
// Activations are stored as f32; an f16/bf16 graph is emulated exactly by
// rounding each node's output to its storage type (RNE) and by using the
// narrow weights converted back to f32.
#pragma once
#include <map>
#include <memory>
#include <vector>

#include "backends/cpu/thread_pool.hpp"
#include "ir/graph.hpp"
#include "runtime/memory_planner.hpp"
#include "runtime/views.hpp"

namespace kiln::cpu {

bool supports(const Graph& g, const Node& n);

// Adds fused into the conv that reads them (Res2Net's chain adds): the conv
// gathers its im2col columns from both operands and the sum is never stored.
// The facts come from the graph: convs the fuse_conv_input_add pass marked
// input_add (ir/fusion_marks.hpp).
struct PrologueAdds {
  std::vector<int> add_of;  // per node: for a conv, the index of the add it reads through, else -1
  std::vector<char> fused;  // per node: an add that runs inside its conv
  int count = 0;
  const Node* add_for(const Graph& g, size_t node) const {
    return node < add_of.size() && add_of[node] >= 0 ? &g.nodes[add_of[node]] : nullptr;
  }
  // Keeps the add's operands alive through the conv's step (memory planner's live_until).
  std::map<int, int> live_until(const Graph& g) const;
};
// enabled = false plans no fused adds (nodes on the plain reference path need dense values).
PrologueAdds plan_prologue_adds(const Graph& g, bool enabled = true);

// Where activations live beyond the memory plan: channel views (slices,
// concat inputs written in place) and, for batches > 1, the same graph at
// batch 1 so nodes touching strided views run image by image; and the adds
// that run inside their conv.
struct CpuLayout {
  const ChannelViews* views = nullptr;
  const Graph* one = nullptr;  // batch-1 shapes, same value ids
  const PrologueAdds* adds = nullptr;
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
  // `prologue_add`: the add a conv reads through (its operands' pointers are in value_ptrs).
  void run_node(const Graph& shaped, const Node& n, const std::vector<float*>& value_ptrs, ThreadPool& pool,
                const ChannelViews* views = nullptr, const Node* prologue_add = nullptr) const;
  const float* constant(int value_id) const { return constants_[value_id]; }
  // Nodes (by index) that run the plain reference (src/backends/cpu/ref/)
  // instead of the optimized kernels: `kiln build --reference GLOB`, for
  // debugging numbers. They need dense values: plan without views or fused adds.
  void use_reference(std::vector<char> nodes) { reference_ = std::move(nodes); }
  bool any_reference() const;

 private:
  void run_reference_node(const Graph& shaped, const Node& n, const std::vector<float*>& value_ptrs) const;
  std::vector<char> reference_;
  std::vector<const float*> constants_;
  std::vector<std::vector<float>> converted_;
};

// Bytes the CPU backend stores for an activation (always f32).
size_t activation_bytes(const Value& v);

}  // namespace kiln::cpu
