// Internal view of a loaded engine, shared by the runtime, the tasks and the
// CLI (inspect, per-layer tools). Not part of the public API.
#pragma once
#include <map>
#include <memory>
#include <mutex>

#include <nlohmann/json.hpp>

#include "backends/backend.hpp"
#include "backends/cpu/cpu_backend.hpp"
#include "backends/cpu/cpu_engine.hpp"  // ShapedPlan, plan_for_batch
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
  std::shared_ptr<const CompiledEngine> compiled;  // by backend `backend`, replaying the bundle's record
  // Where Engine::load's time went: "bundle_read_ms" (open, digests, graph
  // and JSON sections), "backend_compile_ms", then the backend's own phases
  // (CompiledEngine::load_phases). `kiln bench --json`'s load_breakdown_ms.
  std::vector<std::pair<std::string, double>> load_phases;

  // Output shapes at a batch size (every input's dimension 0), inferred once per size.
  const std::vector<Shape>& output_shapes(int64_t batch) const;

 private:
  mutable std::mutex shapes_mutex_;
  mutable std::map<int64_t, std::vector<Shape>> output_shapes_;
};

// labels.json: a JSON list of strings; Error(Input) naming `source` otherwise.
std::vector<std::string> parse_labels(const std::string& text, const std::string& source);

struct ExecutionContext::Impl {
  std::shared_ptr<const Engine> engine;
  std::unique_ptr<BackendContext> backend;
  int64_t last_batch = -1;
  // The batch of the last run, else the one the bundle was built for.
  int64_t batch_or_built() const {
    const Graph& g = engine->impl().graph;
    return last_batch >= 0 ? last_batch : g.values[g.inputs[0]].shape[0];
  }
};

// Time of one engine call as `kiln bench` defines it (docs/benchmarking.md):
// CPU: wall clock of the graph execution with inputs already in the arena;
// CUDA: one CUDA-graph replay between two events. Runs `inputs` once first
// if the shape is new (planning/capture are never timed).
double timed_engine_call_ms(ExecutionContext& ctx, const std::vector<Tensor>& inputs);
// Per-layer time of one engine call (ms, mean over rounds), in execution
// order, labelled with node names (a fused conv is one entry).
std::vector<LayerTime> profile_layers(ExecutionContext& ctx, const std::vector<Tensor>& inputs, int rounds);
// The launches of one engine call as the GPU ran them in a graph replay
// (BackendContext::trace; kiln bench --trace): the last of `replays`.
CallTrace trace_call(ExecutionContext& ctx, const std::vector<Tensor>& inputs, int replays);

// Pre-processing on the context's device (BackendContext::run_images): true
// when its backend has it (CUDA), false on the CPU backend.
bool preprocesses_on_device(ExecutionContext& ctx);
// Image k (decoded 8-bit RGB) through plans[k] into batch slot k of the
// engine's only input, then one engine call; outputs in host memory. Checks
// that the engine has one input of [N, 3, H, W] with each plan's H x W and N
// within its largest batch (Error(Input) naming the input); `times`
// receives the device times of the uploads, pre-processing and copy out
// (zeros on the host path). `top`: softmax
// and top-k on the device too where the backend can (BackendContext::run_images;
// top->done says whether it did).
std::vector<Tensor> run_images(ExecutionContext& ctx, const std::vector<RgbView>& images,
                               const std::vector<const PreprocessPlan*>& plans, ImageRunTimes* times = nullptr,
                               DeviceTopK* top = nullptr);

// Kernels (CPU: nodes) launched by one engine call.
size_t kernels_per_call(ExecutionContext& ctx);

// Where the context's first calls went (BackendContext::first_call_phases):
// `kiln bench --json`'s first_call_breakdown_ms. Empty on the CPU backend.
std::vector<std::pair<std::string, double>> first_call_phases(ExecutionContext& ctx);

}  // namespace kiln
