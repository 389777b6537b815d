// Internal view of a loaded engine, shared by the runtime, the tasks and the
// CLI (inspect, per-layer tools). Not part of the public API.
#pragma once
#include <map>
#include <memory>
#include <mutex>

#include <nlohmann/json.hpp>

#include "backends/cpu/cpu_backend.hpp"
#include "backends/cuda/cuda_engine.hpp"  // host-only header
#include "bundle/bundle.hpp"
#include "core/switches.hpp"
#include "ir/graph.hpp"
#include "kiln/kiln.hpp"
#include "runtime/memory_planner.hpp"
#include "runtime/views.hpp"

namespace kiln {

struct Engine::Impl {
  Bundle bundle;
  Graph graph;
  std::string family, task, backend, precision;
  std::vector<std::string> labels;
  std::string runtime_text;
  nlohmann::json provenance;
  EngineSwitches switches;  // provenance.build.switches: what the bundle was built to run
  int64_t max_batch = 4096;  // provenance.build.max_batch: larger inputs are refused
  std::vector<std::string> reference;  // provenance.build.reference: node globs run by the plain reference (CPU)
  std::unique_ptr<cpu::CpuProgram> cpu;
  std::shared_ptr<cuda::CudaEngine> cuda;  // set when the engine runs on the GPU
};

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
ShapedPlan plan_for_batch(const Graph& g, int64_t batch, const EngineSwitches& switches = {}, bool dense = false);

// labels.json: a JSON list of strings; Error(Input) naming `source` otherwise.
std::vector<std::string> parse_labels(const std::string& text, const std::string& source);

struct ExecutionContext::Impl {
  std::shared_ptr<const Engine> engine;
  std::map<int64_t, ShapedPlan> plans;  // per batch size: shapes are planned once
  // The CPU plan for `batch`, made on first use.
  const ShapedPlan& plan(int64_t batch) {
    auto it = plans.find(batch);
    if (it == plans.end()) it = plans.emplace(batch, plan_for_batch(engine->impl().graph, batch, engine->impl().switches,
                                                        !engine->impl().reference.empty())).first;
    return it->second;
  }
  std::vector<float> arena;
  int64_t last_batch = -1;
  std::shared_ptr<cuda::CudaContext> cuda;  // shared_ptr: CPU-only builds never see its destructor
};

// Time of one engine call as `kiln bench` defines it (docs/benchmarking.md):
// CPU: wall clock of the graph execution with inputs already in the arena;
// CUDA: one CUDA-graph replay between two events. Runs `inputs` once first
// if the shape is new (planning/capture are never timed).
double timed_engine_call_ms(ExecutionContext& ctx, const std::vector<Tensor>& inputs);
// Per-layer time of one engine call (ms, mean over rounds), in execution
// order, labelled with node names (a fused conv is one entry).
struct LayerTime {
  std::string name;
  double ms = 0;
};
std::vector<LayerTime> profile_layers(ExecutionContext& ctx, const std::vector<Tensor>& inputs, int rounds);

// Kernels (CPU: nodes) launched by one engine call.
size_t kernels_per_call(ExecutionContext& ctx);

}  // namespace kiln
