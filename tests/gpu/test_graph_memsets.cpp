// memsets_to_kernels (graph_memsets.hpp, switch memset_kernels): a graph of
// memset nodes of every element size, 1-D and pitched, aligned and not,
// overlapping so that their order shows, and a copy after them; rewritten,
// no memset node is left, the edges are the same, and the bytes (the
// buffer and the copy made after the last fill) are the memsets' own.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "backends/cuda/graph_memsets.hpp"
#include "backends/cuda/kernel_names.hpp"
#include "cuda_test_util.hpp"

namespace kiln::cuda::test {
namespace {

struct Fill {
  size_t offset;
  unsigned elem, value;
  size_t width, height, pitch;
};

void apply(std::vector<uint8_t>& bytes, const Fill& f) {
  for (size_t r = 0; r < f.height; ++r)
    for (size_t k = 0; k < f.width; ++k)
      for (unsigned b = 0; b < f.elem; ++b)
        bytes[f.offset + r * f.pitch + k * f.elem + b] = static_cast<uint8_t>(f.value >> (8 * b));
}

size_t count_of(cudaGraph_t g, cudaGraphNodeType type) {
  size_t n = 0;
  EXPECT_EQ(cudaGraphGetNodes(g, nullptr, &n), cudaSuccess);
  std::vector<cudaGraphNode_t> nodes(n);
  if (n) EXPECT_EQ(cudaGraphGetNodes(g, nodes.data(), &n), cudaSuccess);
  size_t c = 0;
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType t{};
    EXPECT_EQ(cudaGraphNodeGetType(node, &t), cudaSuccess);
    c += t == type;
  }
  return c;
}

size_t edge_count(cudaGraph_t g) {
  size_t n = 0;
  EXPECT_EQ(cudaGraphGetEdges(g, nullptr, nullptr, nullptr, &n), cudaSuccess);
  return n;
}

TEST(GraphMemsets, FillKernelsWriteTheMemsetsBytesInOrder) {
  KILN_REQUIRE_GPU();
  const size_t bytes = 4096 + 37;
  uint8_t* d = nullptr;
  uint8_t* copy = nullptr;
  CK(cudaMalloc(&d, bytes));
  CK(cudaMalloc(&copy, bytes));
  const Fill fills[] = {
      {0, 1, 0xAB, bytes, 1, bytes},            // the whole buffer, an odd size: byte stores
      {16, 4, 0x11223344u, 256, 1, 1024},       // 1 KiB from 16: 16-byte stores
      {6, 2, 0xBEEF, 5, 3, 40},                 // pitched 2-byte elements
      {512, 1, 0x00, 64, 4, 128},               // pitched, aligned rows: 16-byte stores
      {1000, 4, 0xCAFEF00Du, 3, 1, 12},         // over the second fill: order shows
      {4100, 1, 0x5A, 30, 1, 30},               // runs into the odd tail
  };
  std::vector<uint8_t> want(bytes, 0);
  cudaGraph_t g = nullptr;
  CK(cudaGraphCreate(&g, 0));
  cudaGraphNode_t prev = nullptr;
  for (const Fill& f : fills) {
    cudaMemsetParams p{};
    p.dst = d + f.offset;
    p.pitch = f.pitch;
    p.value = f.value;
    p.elementSize = f.elem;
    p.width = f.width;
    p.height = f.height;
    cudaGraphNode_t n = nullptr;
    CK(cudaGraphAddMemsetNode(&n, g, prev ? &prev : nullptr, prev ? 1 : 0, &p));
    apply(want, f);
    prev = n;
  }
  cudaGraphNode_t cp = nullptr;
  CK(cudaGraphAddMemcpyNode1D(&cp, g, &prev, 1, copy, d, bytes, cudaMemcpyDeviceToDevice));
  const size_t edges = edge_count(g);
  ASSERT_EQ(edges, 6u);

  const auto replaced = memsets_to_kernels(g);
  EXPECT_EQ(replaced.size(), 6u);
  EXPECT_EQ(count_of(g, cudaGraphNodeTypeMemset), 0u);
  EXPECT_EQ(count_of(g, cudaGraphNodeTypeKernel), 6u);
  EXPECT_EQ(count_of(g, cudaGraphNodeTypeMemcpy), 1u);
  EXPECT_EQ(edge_count(g), edges);
  // A graph without memsets is left as it is.
  EXPECT_TRUE(memsets_to_kernels(g).empty());

  cudaGraphExec_t exec = nullptr;
  CK(cudaGraphInstantiate(&exec, g, 0));
  CK(cudaMemset(d, 0x77, bytes));
  CK(cudaGraphLaunch(exec, 0));
  CK(cudaDeviceSynchronize());
  std::vector<uint8_t> got(bytes), got_copy(bytes);
  CK(cudaMemcpy(got.data(), d, bytes, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(got_copy.data(), copy, bytes, cudaMemcpyDeviceToHost));
  EXPECT_EQ(got, want);
  EXPECT_EQ(got_copy, want);  // the copy ran after the last fill
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(g);
  cudaFree(d);
  cudaFree(copy);
}

// kiln bench --profile's kernel lists (kernels_by_step) with the switch on
// name the fills that replace the memsets, step by step, as the context's
// graph runs them; without it the memset nodes.
TEST(GraphMemsets, KernelListsNameTheFillsWithTheSwitch) {
  KILN_REQUIRE_GPU();
  uint8_t* d = nullptr;
  CK(cudaMalloc(&d, 256));
  cudaStream_t s = nullptr;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const auto step = [&](size_t i) {
    CK(cudaMemsetAsync(d + 64 * i, static_cast<int>(i), 64, s));
    if (i == 1) CK(cudaMemsetAsync(d + 128, 7, 64, s));
  };
  const auto plain = kernels_by_step(s, 3, step);
  const auto edited = kernels_by_step(s, 3, step, true);
  const std::vector<std::vector<std::string>> memsets = {{"memset"}, {"memset", "memset"}, {"memset"}};
  EXPECT_EQ(plain, memsets);
  ASSERT_EQ(edited.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    ASSERT_EQ(edited[i].size(), memsets[i].size()) << "step " << i;
    for (const std::string& name : edited[i]) EXPECT_EQ(name, "kiln::cuda::fill_kernel") << "step " << i;
  }
  CK(cudaStreamDestroy(s));
  cudaFree(d);
}

}  // namespace
}  // namespace kiln::cuda::test
