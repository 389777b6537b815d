// kernels_by_step (kernel_names.hpp). Kernel nodes name their function through
// the driver API (cuGraphKernelNodeGetParams, cuFuncGetName / cuKernelGetName:
// cuDNN and cuBLASLt launch through the driver, so the runtime's
// cudaKernelNodeParams::func is no runtime stub for their kernels); the entry
// points come from cudaGetDriverEntryPointByVersion, so kiln links no libcuda.
#include "backends/cuda/kernel_names.hpp"
#include "core/kernel_label.hpp"

#include <cuda.h>
#include <cxxabi.h>

#include <cstdlib>
#include <map>
#include <memory>

#include "backends/cuda/cuda_check.hpp"
#include "backends/cuda/graph_memsets.hpp"
#include "core/error.hpp"

namespace kiln::cuda {

namespace {

using GetParamsFn = CUresult (*)(CUgraphNode, CUDA_KERNEL_NODE_PARAMS*);
using FuncNameFn = CUresult (*)(const char**, CUfunction);
using KernelNameFn = CUresult (*)(const char**, CUkernel);

struct DriverNames {
  GetParamsFn get_params = nullptr;
  FuncNameFn func_name = nullptr;
  KernelNameFn kernel_name = nullptr;
};

// The driver entry points, looked up once (null where the driver lacks one:
// then kernels are named "kernel").
const DriverNames& driver_names() {
  static const DriverNames d = [] {
    DriverNames r;
    auto get = [](const char* symbol, unsigned version, void** out) {
      cudaDriverEntryPointQueryResult q{};
      if (cudaGetDriverEntryPointByVersion(symbol, out, version, cudaEnableDefault, &q) != cudaSuccess ||
          q != cudaDriverEntryPointSuccess) {
        cudaGetLastError();
        *out = nullptr;
      }
    };
    get("cuGraphKernelNodeGetParams", 12000, reinterpret_cast<void**>(&r.get_params));
    get("cuFuncGetName", 12030, reinterpret_cast<void**>(&r.func_name));
    get("cuKernelGetName", 12030, reinterpret_cast<void**>(&r.kernel_name));
    return r;
  }();
  return d;
}

std::string node_name(cudaGraphNode_t node) {
  cudaGraphNodeType type{};
  KILN_CUDA_CHECK(cudaGraphNodeGetType(node, &type));
  switch (type) {
    case cudaGraphNodeTypeKernel: break;
    case cudaGraphNodeTypeMemset: return "memset";
    case cudaGraphNodeTypeMemcpy: return "memcpy";
    case cudaGraphNodeTypeHost: return "host function";
    case cudaGraphNodeTypeEmpty: return "empty";
    case cudaGraphNodeTypeEventRecord: return "event record";
    case cudaGraphNodeTypeWaitEvent: return "event wait";
    default: return cat("graph node type ", static_cast<int>(type));
  }
  const DriverNames& d = driver_names();
  if (!d.get_params) return "kernel";
  CUDA_KERNEL_NODE_PARAMS p{};
  if (d.get_params(reinterpret_cast<CUgraphNode>(node), &p) != CUDA_SUCCESS) return "kernel";
  const char* name = nullptr;
  if (p.func && d.func_name && d.func_name(&name, p.func) == CUDA_SUCCESS && name) return short_kernel_name(name);
  if (p.kern && d.kernel_name && d.kernel_name(&name, p.kern) == CUDA_SUCCESS && name) return short_kernel_name(name);
  return "kernel";
}

// The graph's nodes in an execution order: Kahn's order over the edges,
// ties in the order cudaGraphGetNodes lists them (a one-stream capture is a
// chain, so the order is the enqueue order).
std::vector<cudaGraphNode_t> execution_order(cudaGraph_t g) {
  size_t n = 0;
  KILN_CUDA_CHECK(cudaGraphGetNodes(g, nullptr, &n));
  std::vector<cudaGraphNode_t> nodes(n);
  if (n) KILN_CUDA_CHECK(cudaGraphGetNodes(g, nodes.data(), &n));
  std::map<cudaGraphNode_t, size_t> index;
  for (size_t i = 0; i < n; ++i) index[nodes[i]] = i;
  std::vector<size_t> waiting(n, 0);
  std::vector<std::vector<size_t>> next(n);
  for (size_t i = 0; i < n; ++i) {
    size_t k = 0;
    KILN_CUDA_CHECK(cudaGraphNodeGetDependentNodes(nodes[i], nullptr, nullptr, &k));
    // With edge data: PDL's programmatic edges make a query without it
    // "semantically lossy" (cudaErrorLossyQuery); the order ignores edge types.
    std::vector<cudaGraphNode_t> dep(k);
    std::vector<cudaGraphEdgeData> edges(k);
    if (k) KILN_CUDA_CHECK(cudaGraphNodeGetDependentNodes(nodes[i], dep.data(), edges.data(), &k));
    for (cudaGraphNode_t d : dep) {
      next[i].push_back(index.at(d));
      ++waiting[index.at(d)];
    }
  }
  std::vector<cudaGraphNode_t> order;
  std::vector<size_t> ready;
  for (size_t i = n; i-- > 0;)
    if (!waiting[i]) ready.push_back(i);  // a stack: smallest index on top
  while (!ready.empty()) {
    const size_t i = ready.back();
    ready.pop_back();
    order.push_back(nodes[i]);
    for (auto it = next[i].rbegin(); it != next[i].rend(); ++it)
      if (--waiting[*it] == 0) ready.push_back(*it);
  }
  return order;
}

struct GraphOwner {
  cudaGraph_t g = nullptr;
  ~GraphOwner() {
    if (g) cudaGraphDestroy(g);
  }
};

}  // namespace

std::string short_kernel_name(const std::string& mangled) {
  if (const std::string r = readable_kernel_name(mangled); r != mangled) return r;  // CUTLASS
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> dem(abi::__cxa_demangle(mangled.c_str(), nullptr, nullptr, &status), std::free);
  std::string s = status == 0 && dem ? std::string(dem.get()) : mangled;
  // Drop template arguments and parameters: keep characters at depth 0 of <> and ().
  std::string out;
  int depth = 0;
  for (char ch : s) {
    if (ch == '<' || ch == '(') ++depth;
    else if ((ch == '>' || ch == ')') && depth > 0) --depth;
    else if (depth == 0) out += ch;
  }
  // "void kiln::cuda::f" -> "kiln::cuda::f" (a return type before the name).
  if (const auto sp = out.rfind(' '); sp != std::string::npos) out = out.substr(sp + 1);
  // "(anonymous namespace)" went with the parentheses, leaving "::::".
  for (auto at = out.find("::::"); at != std::string::npos; at = out.find("::::")) out.erase(at, 2);
  return out.empty() ? mangled : out;
}

std::vector<cudaGraphNode_t> capturing_nodes(cudaStream_t stream, size_t step) {
  cudaStreamCaptureStatus status{};
  cudaGraph_t g = nullptr;
  KILN_CUDA_CHECK(cudaStreamGetCaptureInfo(stream, &status, nullptr, &g, nullptr, nullptr, nullptr));
  if (status != cudaStreamCaptureStatusActive || !g) fail_runtime("the diagnostic capture ended at step ", step);
  return graph_nodes(g);
}

std::vector<std::vector<std::string>> kernels_by_step(cudaStream_t stream, size_t steps,
                                                      const std::function<void(size_t)>& run_step, bool memset_kernels) {
  std::vector<size_t> added(steps, 0);
  GraphOwner graph;
  KILN_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  try {
    size_t before = 0;
    for (size_t i = 0; i < steps; ++i) {
      run_step(i);
      const size_t now = capturing_nodes(stream, i).size();
      added[i] = now - before;
      before = now;
    }
  } catch (...) {
    cudaGraph_t g = nullptr;
    cudaStreamEndCapture(stream, &g);
    if (g) cudaGraphDestroy(g);
    cudaGetLastError();
    throw;
  }
  KILN_CUDA_CHECK(cudaStreamEndCapture(stream, &graph.g));
  if (memset_kernels) memsets_to_kernels(graph.g);  // one kernel node for each memset node: the counts stand
  const std::vector<cudaGraphNode_t> order = execution_order(graph.g);
  std::vector<std::vector<std::string>> out(steps);
  size_t at = 0;
  for (size_t i = 0; i < steps; ++i)
    for (size_t k = 0; k < added[i] && at < order.size(); ++k) out[i].push_back(node_name(order[at++]));
  return out;
}

}  // namespace kiln::cuda
