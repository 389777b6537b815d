// The CUDA backend's engine and context. Host-only header (no CUDA types):
// the runtime holds these through pointers so nothing outside
// src/backends/cuda includes CUDA headers.
//
// Layout: activations NHWC in the engine precision; weights uploaded once per
// engine (conv filters KRSC). Per batch size, a Program holds the shaped
// graph, the memory plan and one op per node (cuDNN fused conv, cuBLASLt
// linear, kiln kernels). Per context: a stream, a cuDNN handle, a device
// arena and one CUDA graph per batch size, captured at first use and
// replayed afterwards.
#pragma once
#include "backends/cuda/phase_counters.hpp"
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <ostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backends/backend.hpp"
#include "core/switches.hpp"
#include "ir/graph.hpp"
#include "kiln/kiln.hpp"

namespace kiln::cuda {

// True when a CUDA device is usable; otherwise `why` says what is missing.
bool device_available(std::string* why);

// GPU name, driver and library versions: tactics are only reused under the same key.
struct GpuKey {
  std::string gpu;
  int driver = 0, cudnn = 0, cublaslt = 0;
  std::string str() const;
};
GpuKey current_gpu_key();
// File-name-safe GPU name for "tactics.<gpu>.json".
std::string gpu_slug(const std::string& gpu);

// Test hook (CudaOptions::fp8_fusion): which candidates a quantized FP8
// layer may take. Auto: the tactic selector times the fused ones (epilogue
// inside the cuDNN graph, or kiln's CUTLASS GEMM writing y) against the raw
// sum + quant_epilogue ones. Fused: only cuDNN's fused candidates where the
// layer has any. Unfused: neither kind is built. Cutlass: only the CUTLASS
// GEMM where it takes the layer (quant.cpp).
enum class Fp8Fusion { Auto, Fused, Unfused, Cutlass };

struct CudaOptions {
  Fp8Fusion fp8_fusion = Fp8Fusion::Auto;  // a test hook (op harness); builds leave it Auto
  int opt_level = 3;        // 0-2 heuristics only; 3: time 4 candidates; 4: 8; 5: all
  // Building (true): plan and, at opt level >= 3, time every batch in
  // `batches`. Loading (false): never time; each batch runs the bundle's
  // recorded choices, or heuristics (with a notice on `log`) for a batch the
  // bundle was not built for or a GPU/driver/library it was not built on.
  bool tune = false;
  std::vector<int64_t> batches;  // batch sizes to plan up front (empty: the graph's)
  bool allow_tf32 = false;  // f32 engines: TF32 off unless asked
  nlohmann::json tactics;   // tactics.<gpu>.json of the bundle, or null
  EngineSwitches switches;  // the bundle's fusion/launch switches (core/switches.hpp)
  // Node-name globs run by the plain reference on the host (kiln build
  // --reference; reference.cpp); each must match a node.
  std::vector<std::string> reference;
  // Tactic cache file read and written when timing ("" = none). Builds pass
  // BuildOptions::tactic_cache; loading passes none, so what a bundle runs
  // depends on the bundle and the GPU only.
  std::string tactic_cache;
  std::ostream* log = nullptr;
  // Called per graph node while the constructor builds and tunes the first
  // program (kiln build's progress bar); cleared afterwards, never called at run time.
  std::function<void(int64_t done, int64_t total)> progress;
};

class CudaEngine {
 public:
  // The graph must outlive the engine. Uploads weights, builds the program for
  // the graph's batch and selects tactics (from opts.tactics when its key
  // matches this GPU, else by heuristics/timing per opt level).
  CudaEngine(const Graph& g, const CudaOptions& opts);
  ~CudaEngine();
  // {"key": {...}, "opt_level", "batches": {"B": {"layers": {node: {tactic, time_us?}}}},
  //  "layers": the first batch's (what bundles before per-batch records had)}
  nlohmann::json tactics_json() const;
  bool retuned() const;  // the bundle's tactics were not for this GPU
  int timed_layers() const;  // layers whose tactic was chosen by timing in this engine
  // The constructor's phases (weights upload, program lowering, cuDNN graphs
  // and plan builds) on the constructing thread (phase_counters.hpp).
  const PhaseCounters& load_phases() const;

  struct Program;
  struct Impl;
  Impl& impl() { return *impl_; }

 private:
  std::unique_ptr<Impl> impl_;
};

class CudaContext {
 public:
  explicit CudaContext(std::shared_ptr<CudaEngine> engine);
  ~CudaContext();  // waits for the context's last call
  // Inputs already validated by the runtime (names, shapes); returns outputs.
  std::vector<Tensor> run(const std::vector<const Tensor*>& inputs_in_graph_order, int64_t batch);
  // f32 NCHW inputs and f32 outputs (host or device memory), in graph order,
  // checked by the runtime but for where the memory is (checked here, before
  // anything is enqueued). `stream` (cudaStream_t): nullptr = the context's
  // own, waited for; a caller's: enqueued only, waited for only when a view
  // is host memory. ExecutionContext::run (kiln.hpp) states the rules.
  void run(const std::vector<TensorView>& inputs, const std::vector<MutableTensorView>& outputs, int64_t batch,
           void* stream);
  // Writing the input in place (the GPU pre-processing does): staged_input
  // returns input k's staging buffer at `batch` (f32 NCHW, device memory),
  // capturing the batch size's graph first if needed and ordering `stream`
  // after this context's previous call; the caller fills it on `stream`,
  // then run_staged replays the graph on it and converts the outputs as run()
  // does (waited for when a view is host memory or stream is null).
  float* staged_input(int64_t batch, size_t k, void* stream);
  void run_staged(const std::vector<MutableTensorView>& outputs, int64_t batch, void* stream);
  // One CUDA-graph replay between two events (inputs already on the device).
  double timed_replay_ms(int64_t batch);
  size_t graph_nodes(int64_t batch);
  // Per-step GPU time (ms, mean over `rounds` eager runs, events between
  // steps), labelled with node names, and the kernels each step launches
  // (kernel_names.hpp: a diagnostic capture after the timed rounds). Eager
  // launches: the sum exceeds a graph replay.
  struct StepProfile {
    std::string name;
    double ms = 0;
    std::vector<std::string> kernels;
    std::string kernels_unavailable;  // why kernels is empty (the listing failed; times stand)
  };
  std::vector<StepProfile> profile(int64_t batch, int rounds);
  // The launches of one call inside a replay of a graph of the same steps
  // (kernel_trace.hpp; kiln bench --trace), the last of `replays`.
  CallTrace trace(int64_t batch, int replays);
  MemoryReport memory(int64_t batch);
  // Program builds (batch sizes not built at load) and graph captures of
  // this context's calls so far (phase_counters.hpp).
  const PhaseCounters& first_call_phases() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln::cuda
