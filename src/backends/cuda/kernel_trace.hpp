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
#include <map>
#include <string>
#include <vector>

#include "backends/backend.hpp"

namespace kiln::cuda {

// A kernel, memset or copy as CUPTI recorded it (ns, GPU timestamps).
struct TraceRecord {
  std::string name;  // short_kernel_name of a kernel; "memset", "memcpy"
  uint64_t start = 0, end = 0;
  uint64_t node = 0;  // CUPTI's id of the graph node that ran it (0: none)
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

// The engine's own call as a graph (both lanes, kiln bench --trace): what
// trace_call_replays returns. CUPTI reports a replay's launches by the id of
// the node in the executable graph, a clone of the captured node made at
// instantiation; `original_of` maps a clone's id back (CUPTI's
// GRAPHNODE_CLONED callback), `step_of_node` maps a captured kernel, memset or
// copy node's id to the step that enqueued it.
struct GraphTrace {
  std::vector<TraceRecord> records;
  std::map<uint64_t, size_t> step_of_node;
  std::map<uint64_t, uint64_t> original_of;
};

// Captures one engine call into a throw-away graph: enqueue_call(after_step)
// enqueues it on `stream` (and on any stream it forks from there, the side
// lane), calling after_step(k) right after step k's launches, whichever
// stream they went to; the nodes the capture gained since the last
// after_step are step k's. Then replays it `replays` times with CUPTI's
// kernel, memset and memcpy activity on. With `memset_kernels` the captured
// graph's memset nodes become fill kernels first, as the engine's own capture
// does under that switch (graph_memsets.hpp); each keeps its memset's step.
// Error(Runtime) naming what failed.
GraphTrace trace_call_replays(cudaStream_t stream,
                              const std::function<void(const std::function<void(size_t)>&)>& enqueue_call,
                              int replays, bool memset_kernels = false);

// Host-side: the last replay's spans of a GraphTrace, each attributed through
// its node to its step, in start order, with the step's lane (`on_side`: per
// step, nonzero where it runs on the side lane). Error(Runtime) where the
// records cannot be attributed (no node ids, ids of no captured node, a node
// never recorded): the caller then traces the steps on one stream instead.
CallTrace attribute_call_trace(const GraphTrace& g, const std::vector<std::string>& step_names,
                               const std::vector<char>& on_side, int replays);

}  // namespace kiln::cuda
