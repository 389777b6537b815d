// memsets_to_kernels (graph_memsets.hpp).
#include <cstdint>

#include "backends/cuda/cuda_check.hpp"
#include "backends/cuda/device_common.cuh"
#include "backends/cuda/graph_memsets.hpp"

namespace kiln::cuda {
namespace {

// The bytes of a cudaMemsetParams: `height` rows of `width` elements of
// `elem` bytes (1, 2 or 4; value's low bytes), rows `pitch` bytes apart.
// Where every row starts on 16 bytes and holds whole 16-byte units, 16 bytes
// a store; otherwise an element a store.
__global__ void fill_kernel(char* dst, size_t pitch, uint32_t value, unsigned elem, size_t width, size_t height,
                            bool wide) {
  const uint32_t pattern = elem == 1 ? (value & 0xffu) * 0x01010101u : elem == 2 ? (value & 0xffffu) * 0x00010001u : value;
  const size_t per_row = wide ? width * elem / 16 : width;
  const size_t total = per_row * height;
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    char* row = dst + (i / per_row) * pitch;
    const size_t k = i % per_row;
    if (wide) {
      reinterpret_cast<uint4*>(row)[k] = make_uint4(pattern, pattern, pattern, pattern);
    } else if (elem == 4) {
      reinterpret_cast<uint32_t*>(row)[k] = pattern;
    } else if (elem == 2) {
      reinterpret_cast<uint16_t*>(row)[k] = static_cast<uint16_t>(pattern);
    } else {
      row[k] = static_cast<char>(pattern);
    }
  }
}

// A node's dependencies (incoming) or dependents (outgoing), with each edge's data.
void edges_of(cudaGraphNode_t node, bool incoming, std::vector<cudaGraphNode_t>& peers,
              std::vector<cudaGraphEdgeData>& data) {
  size_t n = 0;
  if (incoming) KILN_CUDA_CHECK(cudaGraphNodeGetDependencies(node, nullptr, nullptr, &n));
  else KILN_CUDA_CHECK(cudaGraphNodeGetDependentNodes(node, nullptr, nullptr, &n));
  peers.assign(n, nullptr);
  data.assign(n, cudaGraphEdgeData{});
  if (!n) return;
  if (incoming) KILN_CUDA_CHECK(cudaGraphNodeGetDependencies(node, peers.data(), data.data(), &n));
  else KILN_CUDA_CHECK(cudaGraphNodeGetDependentNodes(node, peers.data(), data.data(), &n));
}

}  // namespace

std::vector<cudaGraphNode_t> graph_nodes(cudaGraph_t graph) {
  size_t n = 0;
  KILN_CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &n));
  std::vector<cudaGraphNode_t> nodes(n);
  if (n) KILN_CUDA_CHECK(cudaGraphGetNodes(graph, nodes.data(), &n));
  nodes.resize(n);
  return nodes;
}

std::vector<std::pair<cudaGraphNode_t, cudaGraphNode_t>> memsets_to_kernels(cudaGraph_t graph) {
  std::vector<std::pair<cudaGraphNode_t, cudaGraphNode_t>> out;
  for (cudaGraphNode_t node : graph_nodes(graph)) {
    cudaGraphNodeType type{};
    KILN_CUDA_CHECK(cudaGraphNodeGetType(node, &type));
    if (type != cudaGraphNodeTypeMemset) continue;
    cudaMemsetParams m{};
    KILN_CUDA_CHECK(cudaGraphMemsetNodeGetParams(node, &m));
    char* dst = static_cast<char*>(m.dst);
    size_t pitch = m.height > 1 ? m.pitch : m.width * m.elementSize;
    uint32_t value = m.value;
    unsigned elem = m.elementSize;
    size_t width = m.width, height = m.height;
    const size_t row_bytes = width * elem;
    bool wide = reinterpret_cast<uintptr_t>(dst) % 16 == 0 && pitch % 16 == 0 && row_bytes % 16 == 0;
    const auto units = static_cast<int64_t>((wide ? row_bytes / 16 : width) * height);
    void* args[] = {&dst, &pitch, &value, &elem, &width, &height, &wide};
    cudaKernelNodeParams k{};
    k.func = reinterpret_cast<void*>(&fill_kernel);
    k.gridDim = dim3(static_cast<unsigned>(detail::grid_for(units)));
    k.blockDim = dim3(detail::kThreads);
    k.sharedMemBytes = 0;
    k.kernelParams = args;
    std::vector<cudaGraphNode_t> in, outs;
    std::vector<cudaGraphEdgeData> in_data, out_data;
    edges_of(node, true, in, in_data);
    edges_of(node, false, outs, out_data);
    cudaGraphNode_t fill = nullptr;
    KILN_CUDA_CHECK(cudaGraphAddKernelNode(&fill, graph, nullptr, 0, &k));
    // The memset goes first: its edges go with it, and the fill takes them over with their data.
    KILN_CUDA_CHECK(cudaGraphDestroyNode(node));
    if (!in.empty()) {
      const std::vector<cudaGraphNode_t> to(in.size(), fill);
      KILN_CUDA_CHECK(cudaGraphAddDependencies(graph, in.data(), to.data(), in_data.data(), in.size()));
    }
    if (!outs.empty()) {
      const std::vector<cudaGraphNode_t> from(outs.size(), fill);
      KILN_CUDA_CHECK(cudaGraphAddDependencies(graph, from.data(), outs.data(), out_data.data(), outs.size()));
    }
    out.push_back({node, fill});
  }
  return out;
}

}  // namespace kiln::cuda
