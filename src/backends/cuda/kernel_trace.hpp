// One engine call's launches as the GPU ran them inside a CUDA-graph replay
// (kiln bench --trace): the in-graph timeline that per-layer profiles cannot
// give (they run each step alone, with its launch and a synchronisation) and
// that Nsight Systems would, where it is installed (it is not on kiln's GPU
// machine). Read through CUPTI's activity API, loaded with dlopen at trace
// time: kiln links no CUPTI, and a machine without it gets a clear reason.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "backends/backend.hpp"

namespace kiln::cuda {

// A kernel, memset or copy as CUPTI recorded it (ns, GPU timestamps).
struct TraceRecord {
  std::string name;  // short_kernel_name of a kernel; "memset", "memcpy"
  uint64_t start = 0, end = 0;
};

// Captures run_step(0) .. run_step(steps - 1) on `stream` into a throw-away
// graph, replays it `replays` times with CUPTI's kernel, memset and memcpy
// activity on, and returns every record. Error(Runtime) naming what failed
// (no libcupti, a CUPTI call's result).
std::vector<TraceRecord> trace_replays(cudaStream_t stream, size_t steps, const std::function<void(size_t)>& run_step,
                                       int replays);

// Host-side: the last call's spans. `listed` holds, per step, what the step
// launches (kernels_by_step); the records are sorted by start, the last
// `per_call` of them (per_call: the listed kernels, memsets and copies) are
// one replay, and the k-th is the k-th listed launch. Where the names
// disagree (a launch missing from the trace), the spans keep no step and
// `note` says so.
CallTrace attribute_trace(std::vector<TraceRecord> records, const std::vector<std::string>& step_names,
                          const std::vector<std::vector<std::string>>& listed, int replays);

}  // namespace kiln::cuda
