#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <utility>

#include "backends/backend.hpp"
#include "backends/cuda/cuda_program.hpp"
#include "backends/cuda/graph_memsets.hpp"
#include "backends/cuda/kernel_names.hpp"
#include "backends/cuda/kernel_trace.hpp"
#include "backends/cuda/kernels.hpp"
#include "backends/cuda/lower.hpp"
#include "core/error.hpp"

namespace kiln::cuda {

namespace {

thread_local bool t_pdl_default = true;

// Programmatic dependent launch pays at small batches, where a graph is a
// chain of short kernels and the launch gaps are a large part of the time;
// at large ones the early-scheduled blocks of the next kernel take slots from
// the running one. H200, fp16, `kiln bench`, PDL on vs off (then KILN_PDL=0) on the same
// bundle (docs/cuda-backend.md): efficientnet_b0 -9.6 % at batch 1, -5 % at 2,
// -4.3 % at 4, +1.2 % at 32; res2net50_26w_4s -2.4 % at 1, +0.2 % at 32.
// Batches 5..31 are not measured; above 4 it stays off.
constexpr int64_t kPdlMaxBatch = 4;

struct BatchState {
  std::shared_ptr<CudaEngine::Program> prog;
  DeviceBuffer arena, workspace, staging_in, staging_out, checks;
  PinnedBuffer check_flags;  // the run-time check flags, copied back without a host wait on a caller's stream
  bool checks_pending = false;  // flags copied back on a stream the host did not wait for
  PinnedBuffer host;     // nodes on the plain reference (reference.cpp)
  HostCalls host_calls;  // their host functions as this context enqueued them
  std::vector<size_t> out_offsets;
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  size_t nodes = 0;
  // The side lane's workspace and events (programs with side runs).
  DeviceBuffer side_workspace;
  std::vector<std::unique_ptr<Event>> side_events;  // [0]: the fork, then one join per run
  ~BatchState() {
    if (exec) cudaGraphExecDestroy(exec);
    if (graph) cudaGraphDestroy(graph);
  }
};

}  // namespace

bool pdl_default() { return t_pdl_default; }
PdlDefault::PdlDefault(bool on) : prev_(t_pdl_default) { t_pdl_default = on; }
PdlDefault::~PdlDefault() { t_pdl_default = prev_; }

struct CudaContext::Impl {
  std::shared_ptr<CudaEngine> engine;
  Stream stream;
  CudnnHandle cudnn;
  Event start, stop;
  // The side lane's stream and cuDNN handle, made with the first program that has side runs.
  std::unique_ptr<Stream> side_stream;
  std::unique_ptr<CudnnHandle> side_cudnn;
  std::map<int64_t, std::unique_ptr<BatchState>> states;
  PhaseCounters first_calls;  // program builds and captures of this context (phase_counters.hpp)
  // Recorded at the end of every call, on the stream it ran on (`last`): the
  // next call, on whatever stream, waits for it before reusing the buffers.
  Event done;
  cudaStream_t last = nullptr;

  ~Impl() {
    if (last) cudaEventSynchronize(done.e);  // a caller's stream may still be running this context's work
  }

  bool pdl_at(int64_t batch) const {
    return engine->impl().opts.switches.get(Switch::Pdl).value_or(batch <= kPdlMaxBatch);
  }
  // Switch memset_kernels (graph_memsets.hpp; auto: off until measured on a GPU).
  bool memset_kernels() const { return engine->impl().opts.switches.get(Switch::MemsetKernels).value_or(false); }

  // Orders what is enqueued next on `s` after the context's previous call.
  void follow(cudaStream_t s) {
    if (last && last != s) KILN_CUDA_CHECK(cudaStreamWaitEvent(s, done.e, 0));
  }
  void finish(cudaStream_t s) {
    KILN_CUDA_CHECK(cudaEventRecord(done.e, s));
    last = s;
  }

  BatchState& state(int64_t batch) {
    auto it = states.find(batch);
    if (it != states.end()) return *it->second;
    auto st = std::make_unique<BatchState>();
    const PhaseCounters before = phase_counters();
    st->prog = engine->impl().program_for(batch);
    first_calls += phase_counters() - before;
    const auto& p = *st->prog;
    st->arena = DeviceBuffer(p.memory.arena_bytes);
    st->workspace = DeviceBuffer(p.workspace_bytes);
    st->staging_in = DeviceBuffer(p.staging_in_bytes);
    st->host = PinnedBuffer(p.host_staging_bytes);
    size_t out_bytes = 0;
    for (int v : p.shaped.outputs) {
      st->out_offsets.push_back(out_bytes);
      out_bytes += (static_cast<size_t>(shape_numel(p.shaped.values[v].shape)) * 4 + 255) / 256 * 256;
    }
    st->staging_out = DeviceBuffer(out_bytes);
    st->checks = DeviceBuffer(p.checks.size() * 3 * sizeof(int64_t));
    st->check_flags = PinnedBuffer(p.checks.size() * 3 * sizeof(int64_t));
    if (!p.checks.empty()) KILN_CUDA_CHECK(cudaMemset(st->checks.get(), 0, st->checks.size()));
    if (!p.side_runs.empty()) {
      if (!side_stream) side_stream = std::make_unique<Stream>(), side_cudnn = std::make_unique<CudnnHandle>();
      st->side_workspace = DeviceBuffer(p.workspace_bytes);
      for (size_t k = 0; k <= p.side_runs.size(); ++k) st->side_events.push_back(std::make_unique<Event>());
    }
    return *(states[batch] = std::move(st));
  }

  Exec exec_for(BatchState& st) {
    Exec x;
    x.stream = stream.s;
    x.cudnn = cudnn.h;
    x.arena = static_cast<char*>(st.arena.get());
    x.workspace = st.workspace.get();
    x.workspace_bytes = st.workspace.size();
    x.checks = static_cast<int64_t*>(st.checks.get());
    for (size_t off : st.prog->staging_in_offsets)
      x.staging_in.push_back(reinterpret_cast<const float*>(static_cast<char*>(st.staging_in.get()) + off));
    x.host = st.host.get();
    x.host_calls = &st.host_calls;
    return x;
  }

  // The run-time checks of the last run at this batch size (gather's index
  // range), read once its copy has landed: the first flag set fails the call
  // naming its node. Clears the flags' pending state either way.
  void check_flags(BatchState& st) {
    st.checks_pending = false;
    const auto& checks = st.prog->checks;
    for (size_t i = 0; i < checks.size(); ++i) {
      const int64_t* f = reinterpret_cast<const int64_t*>(st.check_flags.get()) + 3 * i;
      if (f[0] == 0) continue;
      if (f[1] == INT64_MIN || f[1] == INT32_MIN)
        fail_input(checks[i], ": index at position ", f[2], " of the flattened index is not an integer");
      fail_input(checks[i], ": index ", f[1], " at position ", f[2], " of the flattened index");
    }
  }
  // Checks left pending by calls the host did not wait for: reported by the next call.
  void check_pending() {
    for (auto& [batch, st] : states)
      if (st->checks_pending) {
        KILN_CUDA_CHECK(cudaEventSynchronize(done.e));
        check_flags(*st);
      }
  }
  // A host function (a node on the plain reference) that failed in an earlier
  // enqueue: raised once, by the next call that can see it.
  static void raise_host_errors(BatchState& st) {
    for (auto& [key, call] : st.host_calls)
      if (!call.error.empty()) {
        const std::string e = std::exchange(call.error, "");
        fail_runtime(call.node, ": the plain reference (--reference) failed: ", e);
      }
  }

  // Capture with defined (zero) staging inputs, on the context's own stream,
  // before a caller's stream gets anything of this batch size.
  void capture_zeroed(BatchState& st, const Exec& x) {
    KILN_CUDA_CHECK(cudaMemsetAsync(st.staging_in.get(), 0, st.staging_in.size(), stream.s));
    capture(st, x);
  }

  // After the graph: each output converted to f32 NCHW (device views written
  // in place, host ones through staging and a copy), the run-time check flags
  // copied back, then the host waits when `wait` (own stream, or host memory).
  void outputs_and_finish(BatchState& st, const Exec& x, const std::vector<MutableTensorView>& outputs, cudaStream_t s,
                          bool wait) {
    const auto& p = *st.prog;
    for (size_t k = 0; k < p.shaped.outputs.size(); ++k) {
      const int v = p.output_from.empty() ? p.shaped.outputs[k] : p.output_from[k];  // a folded cast's 16-bit input
      const Value& val = p.shaped.values[v];
      const bool to_host = outputs[k].where == MemoryKind::Host;
      float* dst = to_host ? reinterpret_cast<float*>(static_cast<char*>(st.staging_out.get()) + st.out_offsets[k])
                           : static_cast<float*>(outputs[k].data);
      const void* src = p.value_ptr(x, v);
      if (stored_nhwc(val))
        nhwc_to_nchw_f32(src, val.dtype, dst, static_cast<int>(val.shape[0]), static_cast<int>(val.shape[1]),
                         static_cast<int>(val.shape[2]), static_cast<int>(val.shape[3]), s);
      else
        cast(src, val.dtype, dst, DType::F32, shape_numel(val.shape), s);
      if (to_host)
        KILN_CUDA_CHECK(cudaMemcpyAsync(outputs[k].data, dst, static_cast<size_t>(shape_numel(val.shape)) * sizeof(float),
                                        cudaMemcpyDeviceToHost, s));
    }
    // The flags are zeroed when the state is made and again right after each
    // copy-back, so the graph itself carries no memset per check (two launch
    // gaps per RT-DETR call: session 21's in-graph trace).
    if (!p.checks.empty()) {
      KILN_CUDA_CHECK(cudaMemcpyAsync(st.check_flags.get(), st.checks.get(), st.checks.size(), cudaMemcpyDeviceToHost, s));
      KILN_CUDA_CHECK(cudaMemsetAsync(st.checks.get(), 0, st.checks.size(), s));
    }
    finish(s);
    if (wait) {
      KILN_CUDA_CHECK(cudaEventSynchronize(done.e));
      if (!p.checks.empty()) check_flags(st);
      raise_host_errors(st);
    } else {
      st.checks_pending = !p.checks.empty();
    }
  }

  // Eager run (first call: warms up lazily loaded kernels), then capture.
  void capture(BatchState& st, const Exec& x) {
    const PhaseCounters before = phase_counters();
    {
      const PhaseTimer timer(&phase_counters().graph_capture);
      capture_timed(st, x);
    }
    first_calls += phase_counters() - before;
  }
  // The side lane of x's enqueue, or null when the program has no side runs.
  std::optional<SideLane> side_lane(BatchState& st, const Exec& x) {
    if (st.prog->side_runs.empty()) return std::nullopt;
    SideLane lane;
    lane.x = x;
    lane.x.stream = side_stream->s;
    lane.x.cudnn = side_cudnn->h;
    lane.x.workspace = st.side_workspace.get();
    lane.x.workspace_bytes = st.side_workspace.size();
    lane.fork = st.side_events[0]->e;
    for (size_t k = 1; k < st.side_events.size(); ++k) lane.done.push_back(st.side_events[k]->e);
    return lane;
  }
  void capture_timed(BatchState& st, const Exec& x) {
    const std::optional<SideLane> lane = side_lane(st, x);
    const SideLane* side = lane ? &*lane : nullptr;
    st.prog->enqueue(x, side);
    KILN_CUDA_CHECK(cudaStreamSynchronize(stream.s));
    KILN_CUDA_CHECK(cudaStreamBeginCapture(stream.s, cudaStreamCaptureModeThreadLocal));
    try {
      st.prog->enqueue(x, side);
    } catch (...) {
      cudaGraph_t g = nullptr;
      cudaStreamEndCapture(stream.s, &g);
      if (g) cudaGraphDestroy(g);
      throw;
    }
    KILN_CUDA_CHECK(cudaStreamEndCapture(stream.s, &st.graph));
    if (memset_kernels()) memsets_to_kernels(st.graph);
    KILN_CUDA_CHECK(cudaGraphInstantiate(&st.exec, st.graph, 0));
    KILN_CUDA_CHECK(cudaGraphGetNodes(st.graph, nullptr, &st.nodes));
  }
};

namespace {

// What is wrong with a buffer said to be in `where` ("" if nothing).
std::string memory_problem(const void* p, MemoryKind where, int device) {
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    cudaGetLastError();
    a.type = cudaMemoryTypeUnregistered;
  }
  if (where == MemoryKind::Host)
    return a.type == cudaMemoryTypeDevice ? "is device memory, given as MemoryKind::Host" : "";
  if (a.type != cudaMemoryTypeDevice && a.type != cudaMemoryTypeManaged)
    return "is not device memory (a host pointer given as MemoryKind::Device)";
  if (a.type == cudaMemoryTypeDevice && a.device != device)
    return cat("is memory of device ", a.device, "; this engine runs on device ", device);
  if (reinterpret_cast<uintptr_t>(p) % alignof(float)) return "is not 4-byte aligned (f32 elements)";
  return "";
}

}  // namespace

CudaContext::CudaContext(std::shared_ptr<CudaEngine> engine) : impl_(std::make_unique<Impl>()) {
  impl_->engine = std::move(engine);
}
CudaContext::~CudaContext() = default;

std::vector<Tensor> CudaContext::run(const std::vector<const Tensor*>& inputs, int64_t batch) {
  std::vector<TensorView> in;
  for (const Tensor* t : inputs)
    in.push_back({t->name, DType::F32, t->shape, t->data.data(), MemoryKind::Host, t->data.size() * sizeof(float)});
  const Graph& shaped = impl_->state(batch).prog->shaped;
  std::vector<Tensor> outs;
  for (int v : shaped.outputs)
    outs.push_back({shaped.values[v].name, shaped.values[v].shape,
                    std::vector<float>(static_cast<size_t>(shape_numel(shaped.values[v].shape)))});
  std::vector<MutableTensorView> out;
  for (Tensor& t : outs)
    out.push_back({t.name, DType::F32, t.shape, t.data.data(), MemoryKind::Host, t.data.size() * sizeof(float)});
  run(in, out, batch, nullptr);
  return outs;
}

void CudaContext::run(const std::vector<TensorView>& inputs, const std::vector<MutableTensorView>& outputs, int64_t batch,
                      void* stream) {
  int device = 0;
  KILN_CUDA_CHECK(cudaGetDevice(&device));
  check_memory_kinds(inputs, outputs, [device](const void* p, MemoryKind where) { return memory_problem(p, where, device); });
  Impl& m = *impl_;
  m.check_pending();
  BatchState& st = m.state(batch);
  Impl::raise_host_errors(st);
  const Exec x = m.exec_for(st);
  const PdlDefault pdl(m.pdl_at(batch));
  cudaStream_t s = stream ? static_cast<cudaStream_t>(stream) : m.stream.s;
  const bool own = s == m.stream.s;
  // The graph is captured on the context's own stream. With a caller's
  // stream, the first call at a batch size captures before it enqueues
  // anything (the warm-up run reads whatever staging holds, and this batch
  // size's buffers are idle), so the caller's stream only ever gets copies,
  // a graph replay and the output conversions, and is never waited for.
  if (!st.exec && !own) m.capture_zeroed(st, x);
  m.follow(s);
  bool host = false;
  for (size_t k = 0; k < inputs.size(); ++k) {
    host |= inputs[k].where == MemoryKind::Host;
    // Device inputs are copied too: the captured graph reads fixed staging addresses.
    KILN_CUDA_CHECK(cudaMemcpyAsync(const_cast<float*>(x.staging_in[k]), inputs[k].data,
                                    static_cast<size_t>(shape_numel(inputs[k].shape)) * sizeof(float), cudaMemcpyDefault, s));
  }
  if (!st.exec) m.capture(st, x);  // own stream: the eager warm-up run already computed this call's outputs
  else KILN_CUDA_CHECK(cudaGraphLaunch(st.exec, s));
  m.outputs_and_finish(st, x, outputs, s, own || host);
}

float* CudaContext::staged_input(int64_t batch, size_t k, void* stream) {
  Impl& m = *impl_;
  m.check_pending();
  BatchState& st = m.state(batch);
  if (k >= st.prog->staging_in_offsets.size())
    fail_usage("staged_input: input ", k, " of an engine with ", st.prog->staging_in_offsets.size(), " inputs");
  if (!st.exec) {
    const PdlDefault pdl(m.pdl_at(batch));
    m.capture_zeroed(st, m.exec_for(st));
  }
  m.follow(stream ? static_cast<cudaStream_t>(stream) : m.stream.s);
  return reinterpret_cast<float*>(static_cast<char*>(st.staging_in.get()) + st.prog->staging_in_offsets[k]);
}

void CudaContext::run_staged(const std::vector<MutableTensorView>& outputs, int64_t batch, void* stream) {
  int device = 0;
  KILN_CUDA_CHECK(cudaGetDevice(&device));
  check_memory_kinds({}, outputs, [device](const void* p, MemoryKind where) { return memory_problem(p, where, device); });
  Impl& m = *impl_;
  BatchState& st = m.state(batch);
  if (!st.exec) fail_usage("run_staged: no staged input at batch ", batch, " (staged_input first)");
  Impl::raise_host_errors(st);
  const Exec x = m.exec_for(st);
  cudaStream_t s = stream ? static_cast<cudaStream_t>(stream) : m.stream.s;
  bool host = s == m.stream.s;
  for (const auto& o : outputs) host |= o.where == MemoryKind::Host;
  KILN_CUDA_CHECK(cudaGraphLaunch(st.exec, s));
  m.outputs_and_finish(st, x, outputs, s, host);
}

double CudaContext::timed_replay_ms(int64_t batch) {
  Impl& m = *impl_;
  BatchState& st = m.state(batch);
  if (!st.exec) fail_runtime("timed_replay_ms: no captured graph for batch ", batch, " (run once first)");
  m.follow(m.stream.s);
  KILN_CUDA_CHECK(cudaEventRecord(m.start.e, m.stream.s));
  KILN_CUDA_CHECK(cudaGraphLaunch(st.exec, m.stream.s));
  KILN_CUDA_CHECK(cudaEventRecord(m.stop.e, m.stream.s));
  m.finish(m.stream.s);
  KILN_CUDA_CHECK(cudaEventSynchronize(m.stop.e));
  float ms = 0;
  KILN_CUDA_CHECK(cudaEventElapsedTime(&ms, m.start.e, m.stop.e));
  return ms;
}

namespace {
// The setting of the diagnostics that run the program's steps outside the
// timed graph (profile, trace): pending checks reported, the batch's program
// and buffers, PDL as the engine runs it, the context's stream after the caller's.
struct DiagnosticSteps {
  CudaContext::Impl& m;
  BatchState& st;
  const CudaEngine::Program& p;
  const Exec x;
  const PdlDefault pdl;
  DiagnosticSteps(CudaContext::Impl& impl, int64_t batch)
      : m((impl.check_pending(), impl)), st(m.state(batch)), p(*st.prog), x(m.exec_for(st)), pdl(m.pdl_at(batch)) {
    m.follow(m.stream.s);
  }
  size_t size() const { return p.steps.size(); }
  std::function<void(size_t)> runner() const {
    return [this](size_t i) { p.steps[i](x); };
  }
};
}  // namespace

std::vector<CudaContext::StepProfile> CudaContext::profile(int64_t batch, int rounds) {
  const DiagnosticSteps d(*impl_, batch);
  Impl& m = d.m;
  const auto& p = d.p;
  const Exec& x = d.x;
  const size_t ns = d.size();
  std::vector<Event> marks(ns + 1);
  std::vector<double> ms(ns, 0.0);
  for (int r = 0; r < rounds; ++r) {
    KILN_CUDA_CHECK(cudaEventRecord(marks[0].e, m.stream.s));
    for (size_t i = 0; i < ns; ++i) {
      p.steps[i](x);
      KILN_CUDA_CHECK(cudaEventRecord(marks[i + 1].e, m.stream.s));
    }
    KILN_CUDA_CHECK(cudaEventSynchronize(marks[ns].e));
    for (size_t i = 0; i < ns; ++i) {
      float t = 0;
      KILN_CUDA_CHECK(cudaEventElapsedTime(&t, marks[i].e, marks[i + 1].e));
      ms[i] += t / rounds;
    }
  }
  KILN_CUDA_CHECK(cudaStreamSynchronize(m.stream.s));
  // The kernel lists are a diagnostic: a listing that fails (a driver that
  // cannot describe the graph) leaves them out with its reason; the times stand.
  std::vector<std::vector<std::string>> kernels(ns);
  std::string unavailable;
  try {
    kernels = kernels_by_step(m.stream.s, ns, d.runner(), m.memset_kernels());
  } catch (const Error& e) {
    unavailable = e.what();  // kernels stay ns empty lists
  }
  m.finish(m.stream.s);
  std::vector<StepProfile> out;
  for (size_t i = 0; i < ns; ++i) out.push_back({p.step_names.at(i), ms[i], kernels[i], unavailable});
  return out;
}

CallTrace CudaContext::trace(int64_t batch, int replays) {
  const DiagnosticSteps d(*impl_, batch);
  Impl& m = d.m;
  KILN_CUDA_CHECK(cudaStreamSynchronize(m.stream.s));
  CallTrace t;
  // The engine's own call, both lanes, each launch attributed through its
  // graph node (docs/benchmarking.md). Where that fails (no node ids, a
  // profiler holding CUPTI's one subscriber), the steps one after another on
  // one stream, matched by kernel name, with the reason in the note.
  std::string lanes_failed;
  try {
    const std::optional<SideLane> lane = m.side_lane(d.st, d.x);
    const SideLane* side = lane ? &*lane : nullptr;
    const std::vector<char> on_side = side ? d.p.step_on_side : std::vector<char>{};
    const GraphTrace g = trace_call_replays(
        m.stream.s, [&](const std::function<void(size_t)>& after) { d.p.enqueue(d.x, side, &after); }, replays,
        m.memset_kernels());
    t = attribute_call_trace(g, d.p.step_names, on_side, replays);
  } catch (const Error& e) {
    lanes_failed = e.what();
    cudaGetLastError();
  }
  if (!lanes_failed.empty()) {
    try {  // a diagnostic: a failure is its reason, not the call's
      KILN_CUDA_CHECK(cudaStreamSynchronize(m.stream.s));
      const auto listed = kernels_by_step(m.stream.s, d.size(), d.runner());
      auto records = trace_replays(m.stream.s, d.size(), d.runner(), replays);
      t = attribute_trace(std::move(records), d.p.step_names, listed, replays);
      t.note = cat("one stream, steps in order (", lanes_failed, ")", t.note.empty() ? "" : "; ", t.note);
    } catch (const Error& e) {
      t = CallTrace{};
      t.replays = replays;
      t.unavailable = e.what();
    }
  }
  m.finish(m.stream.s);
  return t;
}

size_t CudaContext::graph_nodes(int64_t batch) { return impl_->state(batch).nodes; }
const PhaseCounters& CudaContext::first_call_phases() const { return impl_->first_calls; }

MemoryReport CudaContext::memory(int64_t batch) {
  const auto& p = *impl_->state(batch).prog;
  return {p.memory.arena_bytes, p.memory.naive_bytes, p.views_used};
}

}  // namespace kiln::cuda
