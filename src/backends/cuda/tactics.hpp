// The one tactic selector of the CUDA backend. Every op with alternatives
// (cuDNN engine configs, kiln's depthwise kernel, window-conv launch shapes,
// cuBLASLt algorithms, and whatever comes next) hands its candidates here.
// For one layer the choice is, in order:
//   1. the bundle: the tactic recorded for this node at this batch (only when
//      the bundle was built on this GPU, driver and library versions);
//   2. the build's cache: the tactic timed for the same layer signature
//      earlier in this build (resnet50's identical blocks are timed once) or
//      read from the tactic cache file;
//   3. timing, while building at opt level >= 3: the candidates (up to the opt
//      level's count, plus those marked `always_time`) on scratch buffers,
//      with one protocol: CUDA-graph replays of 16 back-to-back enqueues per
//      candidate, 5 rounds alternating over the candidates, median; within
//      1.5 % of the fastest the first in preference order (heuristic first)
//      wins, so a rebuild picks the same tactic (tactics.cpp);
//   4. the heuristic candidate, then any candidate that prepares.
// Loading a bundle never times (CudaOptions::tune is false there).
#pragma once
#include <cuda_runtime_api.h>

#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "backends/cuda/device_buffer.hpp"
#include "core/dtype.hpp"
#include "core/tensor.hpp"

namespace kiln::cuda {

inline constexpr size_t kWorkspaceCapForTuning = size_t(256) << 20;  // largest workspace a timed tactic may use

// Host-enqueue timing (ConvOp::autotune, and candidates that cannot be
// captured into a CUDA graph): two warm-up enqueues, then seven back to back
// with an event between consecutive ones (each interval is one enqueue); the
// median in microseconds. Synchronizes `s`; not for use during capture.
float time_enqueue_us(cudaStream_t s, const std::function<void()>& enqueue);

// What identifies a layer for timing: op, storage dtype, the shapes it reads
// and writes and every attribute that changes the work. Two layers with equal
// signatures run the same tactics equally fast, so one timing serves both.
struct LayerSignature {
  std::string op;
  DType dtype = DType::F32;
  std::vector<Shape> shapes;
  std::vector<std::pair<std::string, int64_t>> attrs;  // in a fixed order per op
  LayerSignature& attr(const std::string& key, int64_t v) {
    attrs.emplace_back(key, v);
    return *this;
  }
  // "conv f16 [1,64,56,56] [64,64,3,3] stride=1,..." : the tactic cache key.
  std::string str() const;
};

struct Candidate {
  std::string name;                    // recorded in the bundle and the cache
  std::function<bool()> prepare;       // make it the op's current tactic; false: it cannot run here
  // One enqueue on scratch buffers for timing; false: it cannot run with a
  // workspace of `ws_cap` bytes (so it is not timed). Unset: never timed.
  std::function<bool(cudaStream_t s, void* ws, size_t ws_cap)> run;
  bool always_time = false;            // timed even past the opt level's candidate count
};

struct TacticChoice {
  int index = -1;
  float us = -1.f;           // measured time, when timed in this build or cached
  std::string source;        // "bundle", "cache", "timed", "heuristic"
};

// Signature string -> (tactic name, microseconds).
using TunedCache = std::map<std::string, std::pair<std::string, float>>;

// Strips a fusion note ("... x3 +layer1.0.add") from a recorded tactic
// (bundles before the plan section kept both in one string).
std::string recorded_tactic_name(const std::string& recorded);

class TacticSelector {
 public:
  // recorded: the bundle's {node: {"tactic": ...}} for this batch, or null.
  TacticSelector(const nlohmann::json* recorded, TunedCache* cache, bool timing, int max_candidates);
  // The choice for node `node`; its candidate has been prepared (is current).
  // Throws Error(Runtime) naming the node when no candidate prepares.
  TacticChoice choose(const std::string& node, const LayerSignature& sig, const std::vector<Candidate>& cands,
                      int heuristic = 0);
  // The tactic the bundle recorded for `node` ("" when it recorded none).
  std::string recorded(const std::string& node) const;
  int timed_layers() const { return timed_layers_; }
  bool timing() const { return timing_; }
  cudaStream_t stream() const { return stream_.s; }
  // Synchronizes the timing stream (scratch buffers may then be freed).
  void finish();

 private:
  const nlohmann::json* recorded_;
  TunedCache* cache_;
  bool timing_;
  int max_candidates_;
  int timed_layers_ = 0;
  // Median microseconds per enqueue of each candidate cands[runs[k]] (all
  // prepared and run once), by the selection protocol of tactics.cpp; -1: not timed.
  std::vector<float> time_candidates(const std::vector<Candidate>& cands, const std::vector<int>& runs);
  Stream stream_;
  DeviceBuffer workspace_;
};

// How many candidates timing tries at an opt level: 3 -> 4, 4 -> 8, 5 -> all.
int max_candidates(int opt_level);

}  // namespace kiln::cuda
