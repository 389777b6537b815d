// What one engine call launches, step by step (kiln bench --profile, kiln
// study's kernel table): a diagnostic capture of the program's steps into a
// throw-away CUDA graph, the graph's nodes in execution order, each named
// (kernels by their demangled function name, without parameters; memset,
// memcpy, host and other nodes by kind) and attributed to the step that
// enqueued it. The timed graph of the context is not touched.
#pragma once
#include <cuda_runtime.h>

#include <functional>
#include <string>
#include <vector>

namespace kiln::cuda {

// Captures run_step(0) .. run_step(steps - 1) on `stream` (thread-local
// capture mode) and returns, per step, the names of the graph nodes it added,
// in execution order. The stream must be idle and not capturing. With
// `memset_kernels` (the context's switch) the capture's memset nodes become
// fill kernels first, as in the context's own graph, and are named so.
std::vector<std::vector<std::string>> kernels_by_step(cudaStream_t stream, size_t steps,
                                                      const std::function<void(size_t)>& run_step,
                                                      bool memset_kernels = false);

// The nodes of the graph `stream` is capturing into (after step `step` of a
// diagnostic capture: an ended capture fails naming it).
std::vector<cudaGraphNode_t> capturing_nodes(cudaStream_t stream, size_t step);

// "kiln::cuda::(anonymous namespace)::map_kernel<...>(...)" -> the function
// name with its scope and without template arguments or parameters
// ("kiln::cuda::map_kernel"); names that do not demangle stay as they are.
std::string short_kernel_name(const std::string& mangled);

}  // namespace kiln::cuda
