#include <algorithm>
#include <chrono>
#include <cstring>

#include "backends/cpu/thread_pool.hpp"
#include "core/error.hpp"
#include "runtime/engine_impl.hpp"

namespace kiln {

ExecutionContext::ExecutionContext(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ExecutionContext::~ExecutionContext() = default;

namespace {

// Checks names, shapes (all but the batch dim) and sizes; returns the batch.
int64_t check_inputs(const Graph& g, int64_t max_batch, const std::vector<Tensor>& inputs,
                     std::vector<const Tensor*>* by_input) {
  by_input->assign(g.inputs.size(), nullptr);
  int64_t batch = -1;
  for (const Tensor& t : inputs) {
    auto it = std::find_if(g.inputs.begin(), g.inputs.end(), [&](int v) { return g.values[v].name == t.name; });
    if (it == g.inputs.end()) fail_input("input '", t.name, "' is not an input of this engine");
    size_t k = static_cast<size_t>(it - g.inputs.begin());
    if ((*by_input)[k]) fail_input("input '", t.name, "' given twice");
    const Shape& want = g.values[*it].shape;
    bool ok = t.shape.size() == want.size() && !t.shape.empty() && t.shape[0] >= 1;
    for (size_t d = 1; ok && d < want.size(); ++d) ok = t.shape[d] == want[d];
    if (!ok) {
      std::string expect = "[N";
      for (size_t d = 1; d < want.size(); ++d) expect += "," + std::to_string(want[d]);
      fail_input("input '", t.name, "' has shape ", shape_str(t.shape), ", expected ", expect, "]");
    }
    if (t.shape[0] > max_batch)
      fail_input("input '", t.name, "' has batch ", t.shape[0], ", above this engine's largest batch ", max_batch,
                 " (rebuild with a larger --max-batch)");
    if (static_cast<int64_t>(t.data.size()) != shape_numel(t.shape))
      fail_input("input '", t.name, "' has ", t.data.size(), " values for shape ", shape_str(t.shape));
    if (batch >= 0 && batch != t.shape[0]) fail_input("inputs disagree on the batch size");
    batch = t.shape[0];
    (*by_input)[k] = &t;
  }
  for (size_t k = 0; k < g.inputs.size(); ++k)
    if (!(*by_input)[k]) fail_input("input '", g.values[g.inputs[k]].name, "' is missing");
  return batch;
}

}  // namespace

std::vector<Tensor> ExecutionContext::run(const std::vector<Tensor>& inputs) {
  const Engine::Impl& e = impl_->engine->impl();
  std::vector<const Tensor*> given;
  const int64_t batch = check_inputs(e.graph, e.max_batch, inputs, &given);
  impl_->last_batch = batch;
#ifdef KILN_HAVE_CUDA
  if (impl_->cuda) return impl_->cuda->run(given, batch);
#endif
  const ShapedPlan& plan = impl_->plan(batch);
  const size_t floats = plan.memory.arena_bytes / sizeof(float) + 1;
  if (impl_->arena.size() < floats) impl_->arena.resize(floats);
  impl_->last_batch = batch;
  float* arena = impl_->arena.data();
  auto at = [&](int v) { return arena + plan.memory.offsets[v] / static_cast<int64_t>(sizeof(float)); };
  for (size_t k = 0; k < given.size(); ++k)
    std::memcpy(at(plan.graph.inputs[k]), given[k]->data.data(), given[k]->data.size() * sizeof(float));
  e.cpu->run(plan.graph, plan.memory, arena, cpu::default_pool(), plan.layout());
  std::vector<Tensor> out;
  for (int v : plan.graph.outputs) {
    const Value& val = plan.graph.values[v];
    const float* p = at(v);
    out.push_back({val.name, val.shape, std::vector<float>(p, p + shape_numel(val.shape))});
  }
  return out;
}

double timed_engine_call_ms(ExecutionContext& ctx, const std::vector<Tensor>& inputs) {
  ExecutionContext::Impl& c = ctx.impl();
  const int64_t batch = inputs.empty() || inputs[0].shape.empty() ? 1 : inputs[0].shape[0];
  if (c.last_batch != batch) ctx.run(inputs);  // plans (and on the GPU captures) this batch size: never timed
#ifdef KILN_HAVE_CUDA
  if (c.cuda) return c.cuda->timed_replay_ms(batch);
#endif
  const ShapedPlan& plan = c.plan(batch);
  const Engine::Impl& e = c.engine->impl();
  const auto t0 = std::chrono::steady_clock::now();
  e.cpu->run(plan.graph, plan.memory, c.arena.data(), cpu::default_pool(), plan.layout());
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

std::vector<LayerTime> profile_layers(ExecutionContext& ctx, const std::vector<Tensor>& inputs, int rounds) {
  ExecutionContext::Impl& c = ctx.impl();
  ctx.run(inputs);  // plans (and on the GPU captures) for this batch size
  const int64_t batch = c.last_batch;
  std::vector<LayerTime> out;
#ifdef KILN_HAVE_CUDA
  if (c.cuda) {
    for (auto& [name, ms] : c.cuda->profile(batch, rounds)) {
      if (!out.empty() && out.back().name == name) out.back().ms += ms;  // several launches of one node
      else out.push_back({name, ms});
    }
    return out;
  }
#endif
  const ShapedPlan& plan = c.plan(batch);
  std::vector<double> ms;
  for (int r = 0; r < rounds; ++r)
    c.engine->impl().cpu->run_profiled(plan.graph, plan.memory, c.arena.data(), cpu::default_pool(), &ms, plan.layout());
  for (size_t i = 0; i < plan.graph.nodes.size(); ++i)
    if (!plan.adds.fused[i]) out.push_back({plan.graph.nodes[i].name, ms[i] / rounds});  // fused adds time inside their conv
  return out;
}

size_t kernels_per_call(ExecutionContext& ctx) {
#ifdef KILN_HAVE_CUDA
  if (ctx.impl().cuda) return ctx.impl().cuda->graph_nodes(ctx.impl().last_batch);
#endif
  ExecutionContext::Impl& c = ctx.impl();
  const Graph& g = c.engine->impl().graph;
  const int64_t batch = c.last_batch >= 0 ? c.last_batch : g.values[g.inputs[0]].shape[0];
  return g.nodes.size() - static_cast<size_t>(c.plan(batch).adds.count);
}

MemoryReport ExecutionContext::memory() const {
  const Graph& g = impl_->engine->impl().graph;
  // Before any run: the plan of the batch size the bundle was built for.
  const int64_t b = impl_->last_batch >= 0 ? impl_->last_batch : g.values[g.inputs[0]].shape[0];
#ifdef KILN_HAVE_CUDA
  if (impl_->cuda) return impl_->cuda->memory(b);
#endif
  const ShapedPlan& plan = impl_->plan(b);  // the plan run() uses, views included
  return {plan.memory.arena_bytes, plan.memory.naive_bytes, plan.views.slices_as_views + plan.views.concat_inputs_in_place};
}

}  // namespace kiln
