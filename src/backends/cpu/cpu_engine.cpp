#include "backends/cpu/cpu_engine.hpp"

#include <chrono>
#include <cstring>
#include <map>

#include "backends/backend.hpp"
#include "backends/cpu/thread_pool.hpp"
#include "core/error.hpp"
#include "ir/node_select.hpp"

namespace kiln {

Graph graph_at_batch(const Graph& g, int64_t batch) {
  Graph s = g;
  for (int in : s.inputs) s.values[in].shape[0] = batch;
  s.infer_shapes();
  return s;
}

ShapedPlan plan_for_batch(const Graph& g, int64_t batch, bool dense) {
  ShapedPlan p{graph_at_batch(g, batch), {}, {}, {}, {}};
  if (dense) {
    p.views.parent.assign(p.graph.values.size(), -1);
    p.views.channel_offset.assign(p.graph.values.size(), 0);
  } else {
    p.views = plan_channel_views(p.graph);
  }
  p.adds = cpu::plan_prologue_adds(p.graph, !dense);  // the graph's input_add marks (switch fuse_add decided them at build)
  if (batch > 1) p.one = graph_at_batch(g, 1);
  // A fused add's output is never written: it borrows its first operand's bytes instead of its own.
  std::vector<int> add_alias(p.graph.values.size(), -1);
  for (size_t i = 0; i < p.graph.nodes.size(); ++i)
    if (p.adds.fused[i]) add_alias[p.graph.nodes[i].outputs[0]] = p.graph.nodes[i].inputs[0];
  p.memory = plan_memory_with_views(
      p.graph, cpu::activation_bytes, [&](int v) { return p.views.parent[v] >= 0 ? p.views.parent[v] : add_alias[v]; }, 64,
      p.adds.live_until(p.graph));
  return p;
}

namespace cpu {
namespace {

class CpuCompiled;

class CpuContext : public BackendContext {
 public:
  explicit CpuContext(std::shared_ptr<const CpuCompiled> engine) : engine_(std::move(engine)) {}
  void run(const std::vector<TensorView>& inputs, const std::vector<MutableTensorView>& outputs, int64_t batch,
           void* stream) override;
  double timed_call_ms(int64_t batch) override;
  std::vector<LayerTime> profile(int64_t batch, int rounds) override;
  size_t kernels_per_call(int64_t batch) override;
  MemoryReport memory(int64_t batch) override;

 private:
  const ShapedPlan& plan(int64_t batch);  // made on first use, then reused
  float* at(const ShapedPlan& p, int v) { return arena_.data() + p.memory.offsets[v] / static_cast<int64_t>(sizeof(float)); }
  std::shared_ptr<const CpuCompiled> engine_;
  std::map<int64_t, ShapedPlan> plans_;
  std::vector<float> arena_;
};

class CpuCompiled : public CompiledEngine, public std::enable_shared_from_this<CpuCompiled> {
 public:
  CpuCompiled(const Graph& g, const CompileOptions& o) : graph(g), program(g), dense(!o.reference.empty()) {
    const std::string what = o.tune ? "--reference pattern" : o.source + "reference pattern";
    if (dense) program.use_reference(select_nodes(g, o.reference, what));
  }
  std::unique_ptr<BackendContext> create_context() const override {
    return std::make_unique<CpuContext>(shared_from_this());
  }
  const Graph& graph;
  CpuProgram program;
  bool dense;  // nodes on the plain reference need every value dense: no views, no fused adds
};

const ShapedPlan& CpuContext::plan(int64_t batch) {
  auto it = plans_.find(batch);
  if (it == plans_.end())
    it = plans_.emplace(batch, plan_for_batch(engine_->graph, batch, engine_->dense)).first;
  const size_t floats = it->second.memory.arena_bytes / sizeof(float) + 1;
  if (arena_.size() < floats) arena_.resize(floats);
  return it->second;
}

void CpuContext::run(const std::vector<TensorView>& inputs, const std::vector<MutableTensorView>& outputs, int64_t batch,
                     void* /*stream: the CPU runs synchronously*/) {
  check_memory_kinds(inputs, outputs, [](const void*, MemoryKind where) {
    return where == MemoryKind::Device ? "is device memory (MemoryKind::Device): the CPU backend reads and writes host memory only"
                                       : "";
  });
  const ShapedPlan& p = plan(batch);
  for (size_t k = 0; k < inputs.size(); ++k)
    std::memcpy(at(p, p.graph.inputs[k]), inputs[k].data, static_cast<size_t>(shape_numel(inputs[k].shape)) * sizeof(float));
  engine_->program.run(p.graph, p.memory, arena_.data(), default_pool(), p.layout());
  for (size_t k = 0; k < outputs.size(); ++k)
    std::memcpy(outputs[k].data, at(p, p.graph.outputs[k]), static_cast<size_t>(shape_numel(outputs[k].shape)) * sizeof(float));
}

double CpuContext::timed_call_ms(int64_t batch) {
  const ShapedPlan& p = plan(batch);
  const auto t0 = std::chrono::steady_clock::now();
  engine_->program.run(p.graph, p.memory, arena_.data(), default_pool(), p.layout());
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

std::vector<LayerTime> CpuContext::profile(int64_t batch, int rounds) {
  const ShapedPlan& p = plan(batch);
  std::vector<double> ms;
  for (int r = 0; r < rounds; ++r)
    engine_->program.run_profiled(p.graph, p.memory, arena_.data(), default_pool(), &ms, p.layout());
  std::vector<LayerTime> out;
  for (size_t i = 0; i < p.graph.nodes.size(); ++i)
    if (!p.adds.fused[i]) out.push_back({p.graph.nodes[i].name, ms[i] / rounds, {}, {}});  // fused adds time inside their conv
  return out;
}

size_t CpuContext::kernels_per_call(int64_t batch) {
  return engine_->graph.nodes.size() - static_cast<size_t>(plan(batch).adds.count);
}

MemoryReport CpuContext::memory(int64_t batch) {
  const ShapedPlan& p = plan(batch);  // the plan run() uses, views included
  return {p.memory.arena_bytes, p.memory.naive_bytes, p.views.slices_as_views + p.views.concat_inputs_in_place};
}

class CpuBackendImpl : public Backend {
 public:
  const char* name() const override { return "cpu"; }
  std::string supports(const Graph& g) const override {
    for (const Node& n : g.nodes)
      if (!cpu::supports(g, n)) return cat("layer '", n.name, "' is not supported by the CPU backend");
    return "";
  }
  std::shared_ptr<const CompiledEngine> compile(const Graph& g, const CompileOptions& o) const override {
    return std::make_shared<CpuCompiled>(g, o);
  }
};

}  // namespace
}  // namespace cpu

void register_backend_cpu(BackendRegistry& r) { r.add(std::make_unique<cpu::CpuBackendImpl>()); }

}  // namespace kiln
