// Always-on phase counters of the CUDA program build (load and first call):
// where the seconds of Engine::load, create_context and the first call at a
// batch size go. Counted per thread (the thread that builds), so an engine
// takes the difference of two snapshots around its own work
// (CudaEngine::Impl::phases) and other threads' builds do not leak in.
// steady_clock, no switch: the cost is two clock reads per timed call.
#pragma once
#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace kiln::cuda {

struct PhaseCounter {
  double ms = 0;
  int64_t count = 0;
};

struct PhaseCounters {
  PhaseCounter cudnn_graph;       // validate + build_operation_graph + heuristics query, per cuDNN graph
  PhaseCounter cudnn_plan_build;  // build_plan_at_index (runtime-fused engines compile here)
  PhaseCounter lowering;          // whole program lowering (includes the two above)
  PhaseCounter graph_capture;     // eager warm-up run + capture + instantiate, per batch size
  PhaseCounter weights_upload;    // engine constants to the device
  PhaseCounters& operator+=(const PhaseCounters& o);
  PhaseCounters operator-(const PhaseCounters& o) const;
  // {"name_ms", ms} and {"name_count", count} pairs, in a fixed order.
  std::vector<std::pair<std::string, double>> items() const;
};

PhaseCounters& phase_counters();  // this thread's running totals

// Adds the scope's wall time (and one count) to a counter of this thread.
class PhaseTimer {
 public:
  explicit PhaseTimer(PhaseCounter* c) : c_(c), t0_(std::chrono::steady_clock::now()) {}
  ~PhaseTimer() {
    c_->ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0_).count();
    ++c_->count;
  }
  PhaseTimer(const PhaseTimer&) = delete;
  PhaseTimer& operator=(const PhaseTimer&) = delete;

 private:
  PhaseCounter* c_;
  std::chrono::steady_clock::time_point t0_;
};

}  // namespace kiln::cuda
