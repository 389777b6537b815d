// The backend interface (DESIGN.md §3 "Backends"): what the builder and the
// runtime know of a backend. The builder asks `supports` and compiles with
// tuning, writing the compiled engine's record into the bundle; loading
// compiles again without tuning, replaying that record. Runtime code reaches
// backends only through this header, so it has no #ifdef per backend: each
// backend registers itself (register_backend_<name>, listed by CMake for the
// backends this kiln is built with, src/backends/registry.cpp.in).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "core/switches.hpp"
#include "ir/graph.hpp"
#include "kiln/kiln.hpp"

namespace kiln {

class Bundle;
struct RgbView;
struct PreprocessPlan;

struct CompileOptions {
  // true only in kiln build: choose tactics (by timing at opt level >= 3,
  // through the tactic cache) and record them. false (loading): replay the
  // bundle's record, never time.
  bool tune = false;
  int opt_level = 3;
  bool allow_tf32 = false;
  EngineSwitches switches;
  std::vector<int64_t> batches;        // build: batch sizes planned (and timed) up front besides the graph's
  std::vector<std::string> reference;  // node globs run by the plain reference (CPU backend only)
  std::string tactic_cache;            // build: tactic cache file ("" = none); never read at load
  const Bundle* bundle = nullptr;      // load: the bundle whose record is replayed
  std::string source;                  // prefix of messages, e.g. "model.bundle: " ("" at build)
  std::ostream* log = nullptr;         // notices
  std::function<void(int64_t done, int64_t total)> progress;  // build: per node while tactics are chosen
};

// Per-layer time of one engine call (ms), labelled with the node name.
struct LayerTime {
  std::string name;
  double ms = 0;
  // What one engine call launches for this layer, in order (CUDA: kernel
  // function names, memset/memcpy nodes by kind; empty on the CPU).
  std::vector<std::string> kernels;
  // Why `kernels` is empty on a backend that lists them (the listing, a
  // diagnostic capture, failed: the times stand, the lists are left out).
  std::string kernels_unavailable;
};

// Classification's post-processing where the logits are (run_images): per
// image the k largest logits' class ids (best first, equal logits: lower id
// first) and their softmax probabilities (exp in double, rounded once).
// Device times (ms, events) of run_images' stages: the upload of the images
// and tables, the pre-processing kernels after it, and the copy out of the
// post-processed results (0 when the outputs went through run()'s own copies).
struct ImageRunTimes {
  double upload_ms = 0, preprocess_ms = 0, download_ms = 0;
};

struct DeviceTopK {
  int output = 0;  // the logits' index among the engine's outputs
  int k = 0;
  bool done = false;          // set by the backend that computed them
  std::vector<int> ids;       // batch * k
  std::vector<float> probs;   // batch * k
};

// One context's state (activation memory, stream, captured graphs). Used by
// one thread at a time.
// One engine call's launches as the GPU ran them inside the replayed CUDA
// graph (kiln bench --trace): each kernel, memset or copy in execution order,
// the step (node name) that enqueued it, its start relative to the first
// launch's, and its duration. `unavailable` says why there is none (a backend
// without kernels, no CUPTI library); a diagnostic, like the kernel lists.
struct KernelSpan {
  std::string step, kernel;
  double start_us = 0, us = 0;
  std::string lane;  // "main" or "side" (the engine's second stream) where the trace knows; "" otherwise
};
struct CallTrace {
  std::vector<KernelSpan> spans;
  int replays = 0;            // graph replays traced; the spans are the last one's
  std::string unavailable;
  std::string note;           // e.g. why steps could not be attributed
};

class BackendContext {
 public:
  virtual ~BackendContext() = default;
  // Inputs and outputs in graph order, already checked by the runtime for
  // name, dtype (f32), shape, batch and byte sizes; the backend checks where
  // the memory is (host/device) for every view before it reads or writes any.
  // `stream`: see ExecutionContext::run.
  virtual void run(const std::vector<TensorView>& inputs, const std::vector<MutableTensorView>& outputs, int64_t batch,
                   void* stream) = 0;
  // Time of one engine call with the inputs of the last run at `batch` already
  // in place (docs/benchmarking.md): CPU wall clock, CUDA one graph replay.
  virtual double timed_call_ms(int64_t batch) = 0;
  // Per-layer times, mean over `rounds`, in execution order (after a run at `batch`).
  virtual std::vector<LayerTime> profile(int64_t batch, int rounds) = 0;
  virtual size_t kernels_per_call(int64_t batch) = 0;
  // The launches of one call inside a graph replay (after a run at `batch`).
  virtual CallTrace trace(int64_t /*batch*/, int replays) {
    CallTrace t;
    t.replays = replays;
    t.unavailable = "this backend launches no GPU kernels";
    return t;
  }
  virtual MemoryReport memory(int64_t batch) = 0;
  // Where this context's first calls went (ms and counts by phase: program
  // builds for batch sizes not built at load, graph capture); empty where
  // the backend keeps none.
  virtual std::vector<std::pair<std::string, double>> first_call_phases() const { return {}; }
  // Pre-processing on the backend's device (issue #11 part 4). When true,
  // run_images takes decoded 8-bit RGB images: image k goes through plans[k]
  // (image/image.hpp) into batch slot k of `input`, the engine's only input
  // (already checked by the runtime: [batch, 3, H, W], each plan's output
  // H x W), then the engine runs into `outputs` as run() does. The result is
  // bit for bit run_preprocess_plan's; returns the device times of its stages. CPU backends pre-process on the host
  // (false: run_images is never called).
  // `top` (optional): classification's softmax and top-k of output
  // top->output ([batch, classes]) on the device too (one small copy out
  // with the logits); a backend that cannot leaves top->done false and the
  // caller post-processes on the host.
  virtual bool preprocesses_on_device() const { return false; }
  virtual ImageRunTimes run_images(const std::vector<RgbView>& images, const std::vector<const PreprocessPlan*>& plans,
                                   const TensorView& input, const std::vector<MutableTensorView>& outputs, int64_t batch,
                                   DeviceTopK* top = nullptr);
};

// What compile returns: immutable, shared by every context of an engine.
// The graph given to compile must outlive it and its contexts.
class CompiledEngine {
 public:
  virtual ~CompiledEngine() = default;
  virtual std::unique_ptr<BackendContext> create_context() const = 0;
  // Bundle sections that record what was chosen (e.g. "tactics.<gpu>.json"),
  // written by the builder and replayed at load.
  virtual std::vector<std::pair<std::string, std::string>> record() const { return {}; }
  // Layers whose tactic this compile chose by timing (0 for a backend that never times, and at load).
  virtual int timed_layers() const { return 0; }
  // Where the backend's part of the load went (ms and counts by phase, e.g.
  // "cudnn_plan_build_ms"); empty where the backend keeps none.
  virtual std::vector<std::pair<std::string, double>> load_phases() const { return {}; }
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;
  // "" when the backend can run on this machine, else why not ("no CUDA device").
  virtual std::string available() const { return ""; }
  // "" when the backend runs every node of `g`, else the first reason, naming the node or value.
  virtual std::string supports(const Graph& g) const = 0;
  // Bytes each channel row is padded to before compiling (the pad_channels pass; 0: none).
  virtual int64_t channel_align_bytes() const { return 0; }
  // Throws Error naming what it refuses (the usage or input at fault, or a runtime failure).
  virtual std::shared_ptr<const CompiledEngine> compile(const Graph& g, const CompileOptions& options) const = 0;
};

class BackendRegistry {
 public:
  void add(std::unique_ptr<Backend> backend);
  // A backend kiln knows but this build leaves out, with why (e.g. no CUDA toolkit).
  void add_missing(const std::string& name, const std::string& why);
  const Backend* find(const std::string& name) const;
  // Throws Error(kind) naming `name` and the available backends, between `prefix` and `hint`.
  const Backend& get(const std::string& name, ErrorKind kind = ErrorKind::Usage, const std::string& prefix = "",
                     const std::string& hint = "") const;
  std::vector<std::string> names() const;  // the backends built in, registration order

 private:
  std::vector<std::unique_ptr<Backend>> backends_;
  std::vector<std::pair<std::string, std::string>> missing_;
};

const BackendRegistry& backend_registry();

// The memory-kind check of BackendContext::run: `problem(data, where)` says
// what is wrong with one buffer ("" if nothing); throws Error(Input) naming
// the first tensor at fault.
void check_memory_kinds(const std::vector<TensorView>& inputs, const std::vector<MutableTensorView>& outputs,
                        const std::function<std::string(const void* data, MemoryKind where)>& problem);

}  // namespace kiln
