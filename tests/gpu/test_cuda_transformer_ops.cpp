// What the op harness cannot check of the CUDA transformer ops: gather's
// run-time index check (a device flag read after the run, failing the call
// naming the node), including the call on a caller's stream that the host
// does not wait for (reported by the next call), and that a good call after
// a bad one runs (the flag is reset by every run). Skips without a GPU.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstring>
#include <functional>

#include "backends/cuda/cuda_engine.hpp"
#include "core/error.hpp"
#include "ir/graph.hpp"

namespace kiln {
namespace {

bool have_gpu() {
  std::string why;
  return cuda::device_available(&why);
}
#define REQUIRE_GPU() \
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device"

// x [2, 5, 3] gathered along axis 1 by index [2, 2]: y [2, 2, 3].
Graph gather_graph(bool constant_index, const std::vector<float>& constant = {}) {
  Graph g;
  const int x = g.add_input("x", DType::F32, {2, 5, 3});
  int index;
  if (constant_index) {
    HostTensor t;
    t.dtype = DType::I64;
    t.shape = {2, 2};
    std::vector<uint8_t> bytes(t.nbytes());
    for (size_t i = 0; i < constant.size(); ++i) {
      const int64_t v = static_cast<int64_t>(constant[i]);
      std::memcpy(bytes.data() + 8 * i, &v, 8);
    }
    t.blob = Blob::from_vector(std::move(bytes));
    index = g.add_constant("index", std::move(t));
  } else {
    index = g.add_input("index", DType::I64, {2, 2});
  }
  g.mark_output(g.add_node(Op::Gather, "query_select.gather", {x, index}, {{"axis", int64_t{1}}}));
  return g;
}

std::vector<float> iota(size_t n) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = float(i);
  return v;
}

std::vector<float> run(cuda::CudaContext& ctx, const std::vector<float>& x, const std::vector<float>& index) {
  std::vector<Tensor> ins = {{"x", {2, 5, 3}, x}};
  if (!index.empty()) ins.push_back({"index", {2, 2}, index});
  std::vector<const Tensor*> given;
  for (const Tensor& t : ins) given.push_back(&t);
  return ctx.run(given, 2).at(0).data;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(CudaGather, IndexOutOfRangeFailsTheRunNamingTheNode) {
  REQUIRE_GPU();
  const Graph g = gather_graph(false);
  auto engine = std::make_shared<cuda::CudaEngine>(g, cuda::CudaOptions{});
  cuda::CudaContext ctx(engine);
  const std::vector<float> x = iota(30);
  // Good indices: rows 4, 0 of image 0 and 2, 2 of image 1.
  const std::vector<float> want = {12, 13, 14, 0, 1, 2, 21, 22, 23, 21, 22, 23};
  EXPECT_EQ(run(ctx, x, {4, 0, 2, 2}), want);
  for (const auto& [index, says] : std::vector<std::pair<std::vector<float>, std::string>>{
           {{4, 0, 5, 2}, "index 5 at position 2"},
           {{-1, 0, 2, 2}, "index -1 at position 0"},
           {{4, 0, 2, 1.5f}, "at position 3 of the flattened index is not an integer"}}) {
    const std::string e = error_of([&] { run(ctx, x, index); });
    EXPECT_EQ(e.rfind("query_select.gather: gather index out of [0, 5)", 0), 0u) << e;
    EXPECT_NE(e.find(says), std::string::npos) << e;
    EXPECT_EQ(run(ctx, x, {4, 0, 2, 2}), want) << "a good call after a bad one";
  }
}

TEST(CudaGather, ConstantIndexOutOfRangeFailsTheRun) {
  REQUIRE_GPU();
  const Graph g = gather_graph(true, {0, 7, 1, 1});
  auto engine = std::make_shared<cuda::CudaEngine>(g, cuda::CudaOptions{});
  cuda::CudaContext ctx(engine);
  const std::string e = error_of([&] { run(ctx, iota(30), {}); });
  EXPECT_NE(e.find("query_select.gather: gather index out of [0, 5): index 7 at position 1"), std::string::npos) << e;
}

TEST(CudaGather, BadIndexOnACallersStreamIsReportedByTheNextCall) {
  REQUIRE_GPU();
  const Graph g = gather_graph(false);
  auto engine = std::make_shared<cuda::CudaEngine>(g, cuda::CudaOptions{});
  cuda::CudaContext ctx(engine);
  const std::vector<float> x = iota(30), bad = {4, 0, 9, 2};
  float *dx = nullptr, *di = nullptr, *dy = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&dx), x.size() * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&di), bad.size() * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&dy), 12 * 4), cudaSuccess);
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(dx, x.data(), x.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(di, bad.data(), bad.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
  const std::vector<TensorView> in = {{"x", DType::F32, {2, 5, 3}, dx, MemoryKind::Device, x.size() * 4},
                                      {"index", DType::F32, {2, 2}, di, MemoryKind::Device, bad.size() * 4}};
  const std::vector<MutableTensorView> out = {{"query_select.gather", DType::F32, {2, 2, 3}, dy, MemoryKind::Device, 12 * 4}};
  EXPECT_NO_THROW(ctx.run(in, out, 2, s)) << "the host does not wait for a caller's stream with device outputs";
  const std::string e = error_of([&] { run(ctx, x, {4, 0, 2, 2}); });
  EXPECT_NE(e.find("query_select.gather: gather index out of [0, 5): index 9 at position 2"), std::string::npos) << e;
  EXPECT_EQ(run(ctx, x, {4, 0, 2, 2}), (std::vector<float>{12, 13, 14, 0, 1, 2, 21, 22, 23, 21, 22, 23}));
  cudaStreamDestroy(s);
  cudaFree(dx);
  cudaFree(di);
  cudaFree(dy);
}

}  // namespace
}  // namespace kiln
