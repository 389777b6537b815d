// Internal to the CUDA backend: the per-batch program of an engine.
#pragma once
#include <functional>
#include <map>
#include <string>
#include <memory>
#include <mutex>
#include <vector>

#include "backends/cuda/cudnn_conv.hpp"
#include "backends/cuda/cuda_engine.hpp"
#include "backends/cuda/device_buffer.hpp"
#include "backends/cuda/cublaslt_linear.hpp"
#include "backends/cuda/tactics.hpp"
#include "backends/cuda/window_plan.hpp"
#include "runtime/memory_planner.hpp"

namespace kiln::cuda {

// A host function of the program (the plain reference of a --reference node,
// reference.cpp) as one context enqueues it: the context's pinned buffer, and
// the error it met (host functions may not throw; the context raises it).
struct HostCall {
  std::function<void(char* host)> fn;
  char* host = nullptr;
  std::string node, error;
};
using HostCalls = std::map<const void*, HostCall>;  // keyed by the step's own data

// Everything one enqueue of the program needs from its context.
struct Exec {
  cudaStream_t stream = nullptr;
  cudnnHandle_t cudnn = nullptr;
  char* arena = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  std::vector<const float*> staging_in;  // per graph input: f32 NCHW as given by the user
  int64_t* checks = nullptr;             // 3 int64 per Program::checks entry (Lowering::add_check)
  char* host = nullptr;                  // the context's pinned buffer (Program::host_staging_bytes)
  HostCalls* host_calls = nullptr;       // the context's host functions (stable addresses)
};

// The side lane of one enqueue (side_lane.cpp): its own stream, cuDNN handle
// and workspace in `x`, the fork event and one join event per side run.
struct SideLane {
  Exec x;
  cudaEvent_t fork = nullptr;
  std::vector<cudaEvent_t> done;
};

struct CudaEngine::Program {
  Graph shaped;
  MemoryPlan memory;
  std::vector<int64_t> view_bytes;  // per value: byte offset of a channel view inside its root's buffer
  int views_used = 0;               // slices read in place + concat inputs written in place
  std::vector<std::function<void(const Exec&)>> steps;  // one or more launches per node
  std::vector<std::string> step_names;                  // node name of each step (for profiles)
  std::vector<int> step_nodes;                          // node index of each step (-1: the engine inputs' conversion)
  // The side lane (plan_side_lane, schedule_side_lane): these steps run on a
  // second stream, forked before main-lane step fork_step and joined before
  // join_step (steps.size(): the end), in this order.
  struct SideLaneRun {
    std::vector<size_t> steps;
    size_t fork_step = 0, join_step = 0;
  };
  std::vector<SideLaneRun> side_runs;
  std::vector<char> step_on_side;  // per step
  std::vector<std::string> concat_masks;  // muls written by their concat's launch (plan key `concat_mask`)
  bool late_side_fork = false;            // side runs planned with switch late_side_fork (plan key `late_side_fork`)
  bool chain_side_fork = false;           // ... with switch chain_side_fork (plan key `chain_side_fork`)
  bool weight_prefetch = false;           // the program has insert_weight_prefetch's step (plan key `weight_prefetch`)
  bool prefetch_evict_last = false;       // ... whose lines are evict-last (plan key `prefetch_evict_last`)
  DeviceBuffer prefetch_ranges;           // that step's {address, bytes} pairs
  std::vector<std::string> linear_norms;  // layer norms run as small_gemm_norm with their projection (plan key `linear_norm`)
  bool side_lane_planned = false;  // the plan records `side_lane` (bundles before it: no side lane)
  // Enqueues every step on x.stream, the side runs on lane's stream (without
  // a lane: every step in order on x.stream, which is always correct).
  // after_step (kiln bench --trace): called with k right after step k's launches.
  void enqueue(const Exec& x, const SideLane* lane, const std::function<void(size_t)>* after_step = nullptr) const;
  // Per graph output: the value its f32 NCHW copy is converted from after the
  // graph: the output itself, or the 16-bit value an f32 cast widened when
  // that cast was folded into the conversion (plan_output_casts).
  std::vector<int> output_from;
  std::vector<std::string> step_kernels;                // what each step launches (the plan section)
  std::vector<std::string> window_blocks;  // the view blocks run as window convs (the plan's `window_conv`)
  bool channel_views = false;                // the plan's graph-wide decision on views
  // The view blocks of the shaped graph and their timing signatures (block
  // timing at opt level >= 3 reads them from the programs it compares).
  std::vector<ViewBlock> blocks;
  std::vector<BlockWindows> block_windows;
  std::vector<LayerSignature> block_signatures;
  // Handles the load's worker threads built cuDNN op graphs with
  // (prebuild_recorded_convs): declared before convs, so they outlive them.
  std::vector<std::unique_ptr<CudnnHandle>> build_handles;
  std::vector<std::unique_ptr<ConvOp>> convs;
  // Loading only: layer signature + recorded tactic -> the one op those layers share (conv.cpp).
  std::map<std::string, ConvOp*> shared_convs;
  std::vector<std::unique_ptr<LinearOp>> linears;
  std::vector<std::unique_ptr<MatMulOp>> matmuls;
  std::vector<std::unique_ptr<Fp8GemmOp>> fp8_gemms;  // quantized linears and 1x1 convs (quant.cpp)
  size_t workspace_bytes = 0;
  // Run-time checks (gather's index range): what each flag reports, naming
  // its node; the context reads the flags after every run.
  std::vector<std::string> checks;
  size_t staging_in_bytes = 0;
  size_t host_staging_bytes = 0;  // pinned host bytes per context (nodes on the plain reference)
  std::vector<size_t> staging_in_offsets;  // per graph input, in the staging buffer
  const void* value_ptr(const Exec& x, int v) const;
  // The plan as the bundle records it: graph-wide decisions, arena and
  // workspace bytes, every step (node, kernel or tactic) and every value's
  // [arena offset, view byte offset].
  nlohmann::json plan_json() const;
};

struct CudaEngine::Impl {
  const Graph* graph = nullptr;
  CudaOptions opts;
  GpuKey key;
  CudnnHandle cudnn;
  CublasLtHandle lt;
  std::map<int, DeviceBuffer> weights;                     // constant value id -> device copy (conv: KRSC)
  std::map<std::string, std::pair<DeviceBuffer, DeviceBuffer>> bn;  // node -> (scale, shift) f32
  std::map<std::string, DeviceBuffer> extra;               // per-node re-laid-out weights (e.g. depthwise tap-major)
  // Per batch: node name -> tactic name / timed microseconds (if timed).
  std::map<int64_t, std::map<std::string, std::string>> chosen;
  std::map<int64_t, std::map<std::string, float>> chosen_us;
  // Layer signature (op, dtype, shapes, attributes) -> tactic timed for it, so
  // repeated layers (e.g. resnet50's identical blocks) are timed once.
  TunedCache tuned;
  bool retuned = false;
  int timed_layers = 0;  // layers timed so far (builds only: loading never times)
  PhaseCounters load_phases;  // the constructor's (phase_counters.hpp)
  std::mutex mu;
  std::map<int64_t, std::shared_ptr<Program>> programs;

  std::shared_ptr<Program> program_for(int64_t batch);
  // The bundle's {node: {"tactic": ...}} for `batch` on this GPU, or null
  // (not built for that batch, or tactics from another GPU/driver/library).
  const nlohmann::json* recorded_layers(int64_t batch) const;
  // The tactic the bundle records for `node` at `batch` (fusion notes
  // stripped), or "": what its ConvOp builds first (cudnn_conv.hpp).
  std::string recorded_tactic(int64_t batch, const std::string& node) const;
  // The bundle's plan for `batch` on this GPU ({"window_conv" (block names, or
  // true/false in bundles before per-block choices), "channel_views",
  // "arena_bytes", "workspace_bytes", "steps", "values"}), or null.
  const nlohmann::json* recorded_plan(int64_t batch) const;
  std::shared_ptr<Program> build_program(int64_t batch);
  // The program of `batch` with the recorded plan (may be null) and, when
  // `window` is given, exactly those view blocks as window convs.
  std::shared_ptr<Program> lower_program(int64_t batch, const nlohmann::json* plan, const std::vector<char>* window);
  // At opt level >= 3 while building: each view block that can run as window
  // convs timed both ways (cuda_program.cpp); the program of the faster set.
  std::shared_ptr<Program> build_timing_blocks(int64_t batch);
};

}  // namespace kiln::cuda
