// The memset nodes of a captured call as kernel nodes (switch memset_kernels).
// Some cuDNN engines zero their output or workspace with cudaMemsetAsync
// inside their execute; captured, that is a memset node, and in RT-DETR
// r18vd's graph the stem conv after one started 13.2 us after the memset
// ended on an H100 (4-5 us on an H200; kiln bench --trace, sessions 31 and
// 33) where a kernel after a kernel starts within about 2 us. cuDNN gives no
// way to keep the memset out of its execute, so the captured graph is edited
// before it is instantiated: each memset node is replaced by a kiln fill
// kernel writing the same bytes, with the memset's edges (and their data).
#pragma once
#include <cuda_runtime.h>

#include <utility>
#include <vector>

namespace kiln::cuda {

// The nodes of `graph` (a capture's graph too), in the order CUDA lists them.
std::vector<cudaGraphNode_t> graph_nodes(cudaGraph_t graph);

// Replaces every memset node of `graph` (not instantiated) by a kernel node
// that writes the same bytes, keeping its dependencies and dependents.
// Returns (memset node, kernel node) pairs, in the order the graph lists them
// (the memset nodes are destroyed). Error(Runtime) naming the CUDA call that failed.
std::vector<std::pair<cudaGraphNode_t, cudaGraphNode_t>> memsets_to_kernels(cudaGraph_t graph);

}  // namespace kiln::cuda
