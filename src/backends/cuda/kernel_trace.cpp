// trace_replays, trace_call_replays and their attribution (kernel_trace.hpp).
#include "backends/cuda/kernel_trace.hpp"

#include <cupti.h>
#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>

#include "backends/cuda/cuda_check.hpp"
#include "backends/cuda/graph_memsets.hpp"
#include "backends/cuda/kernel_names.hpp"
#include "core/error.hpp"

namespace kiln::cuda {

namespace {

// The CUPTI entry points kiln uses, from the library found at trace time.
struct Cupti {
  void* lib = nullptr;
  CUptiResult (*enable)(CUpti_ActivityKind) = nullptr;
  CUptiResult (*disable)(CUpti_ActivityKind) = nullptr;
  CUptiResult (*register_callbacks)(CUpti_BuffersCallbackRequestFunc, CUpti_BuffersCallbackCompleteFunc) = nullptr;
  CUptiResult (*flush_all)(uint32_t) = nullptr;
  CUptiResult (*next_record)(uint8_t*, size_t, CUpti_Activity**) = nullptr;
  CUptiResult (*result_string)(CUptiResult, const char**) = nullptr;
  // For the engine's own call (trace_call_replays): node ids and the clones
  // instantiation makes.
  CUptiResult (*node_id)(CUgraphNode, uint64_t*) = nullptr;
  CUptiResult (*subscribe)(CUpti_SubscriberHandle*, CUpti_CallbackFunc, void*) = nullptr;
  CUptiResult (*unsubscribe)(CUpti_SubscriberHandle) = nullptr;
  CUptiResult (*enable_callback)(uint32_t, CUpti_SubscriberHandle, CUpti_CallbackDomain, CUpti_CallbackId) = nullptr;
};

const Cupti& cupti() {
  static const Cupti c = [] {
    Cupti c;
    for (const char* name : {"libcupti.so", "libcupti.so.13", "libcupti.so.12"})
      if ((c.lib = dlopen(name, RTLD_NOW | RTLD_LOCAL))) break;
    if (!c.lib) return c;
    const auto sym = [&](auto& f, const char* n) { f = reinterpret_cast<std::decay_t<decltype(f)>>(dlsym(c.lib, n)); };
    sym(c.enable, "cuptiActivityEnable");
    sym(c.disable, "cuptiActivityDisable");
    sym(c.register_callbacks, "cuptiActivityRegisterCallbacks");
    sym(c.flush_all, "cuptiActivityFlushAll");
    sym(c.next_record, "cuptiActivityGetNextRecord");
    sym(c.result_string, "cuptiGetResultString");
    sym(c.node_id, "cuptiGetGraphNodeId");
    sym(c.subscribe, "cuptiSubscribe");
    sym(c.unsubscribe, "cuptiUnsubscribe");
    sym(c.enable_callback, "cuptiEnableCallback");
    return c;
  }();
  return c;
}

void check(CUptiResult r, const char* what) {
  if (r == CUPTI_SUCCESS) return;
  const char* s = nullptr;
  if (cupti().result_string) cupti().result_string(r, &s);
  fail_runtime("trace: ", what, " failed: ", s ? s : "CUPTI error ", static_cast<int>(r));
}

// CUPTI hands filled buffers to this callback, possibly from its own thread.
std::mutex g_mutex;
std::vector<TraceRecord>* g_records = nullptr;
constexpr size_t kBufferBytes = size_t(8) << 20;

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = *buffer ? kBufferBytes : 0;
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  std::lock_guard<std::mutex> lock(g_mutex);
  CUpti_Activity* rec = nullptr;
  while (g_records && cupti().next_record(buffer, valid, &rec) == CUPTI_SUCCESS) {
    switch (rec->kind) {
      case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL:
      case CUPTI_ACTIVITY_KIND_KERNEL: {
        const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(rec);
        g_records->push_back({k->name ? short_kernel_name(k->name) : "kernel", k->start, k->end, k->graphNodeId});
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMSET: {
        const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(rec);
        g_records->push_back({"memset", m->start, m->end, m->graphNodeId});
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMCPY: {
        const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(rec);
        g_records->push_back({"memcpy", m->start, m->end, m->graphNodeId});
        break;
      }
      default: break;
    }
  }
  std::free(buffer);
}

bool traced_kind(const std::string& listed) {
  return listed != "host function" && listed != "empty" && listed != "event record" && listed != "event wait";
}

// Graph nodes cloned at instantiation (CUPTI's resource callback): the
// clone's id -> the original's. Filled while a trace_call_replays holds it.
std::map<uint64_t, uint64_t>* g_clones = nullptr;

void CUPTIAPI on_resource(void*, CUpti_CallbackDomain domain, CUpti_CallbackId cbid, const void* data) {
  if (domain != CUPTI_CB_DOMAIN_RESOURCE || cbid != CUPTI_CBID_RESOURCE_GRAPHNODE_CLONED || !data) return;
  const auto* g = static_cast<const CUpti_GraphData*>(static_cast<const CUpti_ResourceData*>(data)->resourceDescriptor);
  uint64_t clone = 0, original = 0;
  if (!g || !g->node || !g->originalNode || !cupti().node_id) return;
  if (cupti().node_id(g->node, &clone) != CUPTI_SUCCESS || cupti().node_id(g->originalNode, &original) != CUPTI_SUCCESS)
    return;
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_clones) (*g_clones)[clone] = original;
}

// Activity on, capture(graph being captured) on `stream`, instantiate, replay
// `replays` times, every record flushed into `records`; with `clones`, node
// clones are collected through a CUPTI subscriber while it runs. Activity is
// on before the graph is made, so its nodes are traced as nodes; the buffer
// callbacks are registered once per process (a second bundle of one kiln bench
// traces through the same ones).
void run_traced(cudaStream_t stream, const std::function<void()>& capture, int replays, std::vector<TraceRecord>& records,
                std::map<uint64_t, uint64_t>* clones, const std::function<void(cudaGraph_t)>* edit = nullptr) {
  const Cupti& c = cupti();
  if (!c.lib) fail_runtime("trace: CUPTI (libcupti.so, CUDA's extras) not found on the library path");
  if (!c.enable || !c.disable || !c.register_callbacks || !c.flush_all || !c.next_record)
    fail_runtime("trace: the CUPTI library found lacks the activity API");
  if (clones && (!c.node_id || !c.subscribe || !c.unsubscribe || !c.enable_callback))
    fail_runtime("trace: the CUPTI library found lacks graph node ids or callbacks");
  const CUpti_ActivityKind kinds[] = {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMSET,
                                      CUPTI_ACTIVITY_KIND_MEMCPY};
  cudaGraphExec_t exec = nullptr;
  CUpti_SubscriberHandle sub = nullptr;
  const auto release = [&] {
    c.flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    for (auto k : kinds) c.disable(k);
    if (sub) c.unsubscribe(sub);
    std::lock_guard<std::mutex> lock(g_mutex);
    g_records = nullptr;
    g_clones = nullptr;
  };
  try {
    {
      std::lock_guard<std::mutex> lock(g_mutex);
      g_records = &records;
      g_clones = clones;
    }
    static const CUptiResult registered = c.register_callbacks(buffer_requested, buffer_completed);
    check(registered, "cuptiActivityRegisterCallbacks");
    if (clones) {
      // One subscriber per process: a profiler attached (Nsight) holds it.
      check(c.subscribe(&sub, on_resource, nullptr), "cuptiSubscribe");
      check(c.enable_callback(1, sub, CUPTI_CB_DOMAIN_RESOURCE, CUPTI_CBID_RESOURCE_GRAPHNODE_CLONED),
            "cuptiEnableCallback");
    }
    for (auto k : kinds) check(c.enable(k), "cuptiActivityEnable");
    cudaGraph_t graph = nullptr;
    KILN_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    try {
      capture();
    } catch (...) {
      cudaStreamEndCapture(stream, &graph);
      if (graph) cudaGraphDestroy(graph);
      cudaGetLastError();
      throw;
    }
    KILN_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
    if (edit) {
      try {
        (*edit)(graph);
      } catch (...) {
        cudaGraphDestroy(graph);
        throw;
      }
    }
    const cudaError_t inst = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    KILN_CUDA_CHECK(inst);
    for (int r = 0; r < replays; ++r) KILN_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    KILN_CUDA_CHECK(cudaStreamSynchronize(stream));
    check(c.flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED), "cuptiActivityFlushAll");  // every record delivered
  } catch (...) {
    release();
    if (exec) cudaGraphExecDestroy(exec);
    throw;
  }
  release();
  cudaGraphExecDestroy(exec);
}

bool traced_node(cudaGraphNode_t node) {
  cudaGraphNodeType type{};
  KILN_CUDA_CHECK(cudaGraphNodeGetType(node, &type));
  return type == cudaGraphNodeTypeKernel || type == cudaGraphNodeTypeMemset || type == cudaGraphNodeTypeMemcpy;
}

}  // namespace

std::vector<TraceRecord> trace_replays(cudaStream_t stream, size_t steps, const std::function<void(size_t)>& run_step,
                                       int replays) {
  std::vector<TraceRecord> records;
  run_traced(
      stream,
      [&] {
        for (size_t i = 0; i < steps; ++i) run_step(i);
      },
      replays, records, nullptr);
  return records;
}

GraphTrace trace_call_replays(cudaStream_t stream,
                              const std::function<void(const std::function<void(size_t)>&)>& enqueue_call,
                              int replays, bool memset_kernels) {
  GraphTrace out;
  const Cupti& c = cupti();
  std::map<cudaGraphNode_t, uint64_t> id_of;  // the captured traced nodes' ids
  const auto node_id = [&](cudaGraphNode_t node) {
    uint64_t id = 0;
    check(c.node_id(reinterpret_cast<CUgraphNode>(node), &id), "cuptiGetGraphNodeId");
    return id;
  };
  const auto capture = [&] {
    enqueue_call([&](size_t step) {
      for (cudaGraphNode_t node : capturing_nodes(stream, step)) {
        if (id_of.count(node) || !traced_node(node)) continue;
        const uint64_t id = node_id(node);
        id_of[node] = id;
        out.step_of_node[id] = step;
      }
    });
  };
  // Each fill kernel takes its memset's step (the memset's handle is looked up
  // among the captured ones before any fill could reuse its address).
  const std::function<void(cudaGraph_t)> edit = [&](cudaGraph_t graph) {
    for (const auto& [memset, fill] : memsets_to_kernels(graph)) {
      const auto it = id_of.find(memset);
      if (it == id_of.end()) fail_runtime("trace: a memset node no step captured");
      const size_t step = out.step_of_node.at(it->second);
      out.step_of_node.erase(it->second);
      out.step_of_node[node_id(fill)] = step;
    }
  };
  run_traced(stream, capture, replays, out.records, &out.original_of, memset_kernels ? &edit : nullptr);
  return out;
}

CallTrace attribute_trace(std::vector<TraceRecord> records, const std::vector<std::string>& step_names,
                          const std::vector<std::vector<std::string>>& listed, int replays) {
  CallTrace t;
  t.replays = replays;
  std::vector<std::pair<std::string, std::string>> launches;  // (step, listed name) in execution order
  for (size_t i = 0; i < listed.size(); ++i)
    for (const auto& k : listed[i])
      if (traced_kind(k)) launches.push_back({i < step_names.size() ? step_names[i] : "", k});
  const size_t per_call = launches.size();
  if (per_call == 0 || records.size() < per_call) {
    t.unavailable = cat("the trace holds ", records.size(), " launches, one call lists ", per_call);
    return t;
  }
  std::stable_sort(records.begin(), records.end(), [](const TraceRecord& a, const TraceRecord& b) { return a.start < b.start; });
  const auto first = records.end() - static_cast<std::ptrdiff_t>(per_call);
  bool agree = true;
  for (size_t k = 0; k < per_call; ++k) agree &= first[static_cast<std::ptrdiff_t>(k)].name == launches[k].second;
  if (!agree) t.note = "the trace's launches differ from the listed ones: spans left without steps";
  const uint64_t t0 = first->start;
  for (size_t k = 0; k < per_call; ++k) {
    const TraceRecord& r = first[static_cast<std::ptrdiff_t>(k)];
    t.spans.push_back({agree ? launches[k].first : "", r.name, static_cast<double>(r.start - t0) / 1e3,
                       static_cast<double>(r.end - r.start) / 1e3, ""});
  }
  return t;
}

CallTrace attribute_call_trace(const GraphTrace& g, const std::vector<std::string>& step_names,
                               const std::vector<char>& on_side, int replays) {
  if (g.step_of_node.empty()) fail_runtime("trace: the captured call has no kernel, memset or copy node");
  // A record's node, through clones (instantiation may clone a clone), to a
  // captured node; 0 where it leads to none.
  const auto captured = [&](uint64_t id) -> uint64_t {
    for (int hop = 0; hop < 8 && id; ++hop) {
      if (g.step_of_node.count(id)) return id;
      const auto it = g.original_of.find(id);
      id = it == g.original_of.end() ? 0 : it->second;
    }
    return 0;
  };
  std::map<uint64_t, std::vector<const TraceRecord*>> by_node;
  size_t unknown = 0;
  for (const TraceRecord& r : g.records) {
    if (!r.node) continue;  // not a graph launch
    if (const uint64_t id = captured(r.node)) by_node[id].push_back(&r);
    else ++unknown;
  }
  if (unknown)
    fail_runtime("trace: ", unknown, " of ", g.records.size(), " records name graph nodes the capture did not make");
  for (const auto& [id, step] : g.step_of_node) {
    const auto it = by_node.find(id);
    const size_t n = it == by_node.end() ? 0 : it->second.size();
    if (n != static_cast<size_t>(replays))
      fail_runtime("trace: a node of step ", step < step_names.size() ? step_names[step] : cat(step), " was recorded ",
                   n, " times in ", replays, " replays");
  }
  // Each node's last record is the last replay's.
  std::vector<std::pair<const TraceRecord*, size_t>> last;  // (record, step)
  for (const auto& [id, recs] : by_node) {
    const TraceRecord* r = *std::max_element(recs.begin(), recs.end(),
                                             [](const TraceRecord* a, const TraceRecord* b) { return a->start < b->start; });
    last.push_back({r, g.step_of_node.at(id)});
  }
  std::stable_sort(last.begin(), last.end(), [](const auto& a, const auto& b) { return a.first->start < b.first->start; });
  CallTrace t;
  t.replays = replays;
  const uint64_t t0 = last.front().first->start;
  for (const auto& [r, step] : last)
    t.spans.push_back({step < step_names.size() ? step_names[step] : "", r->name, static_cast<double>(r->start - t0) / 1e3,
                       static_cast<double>(r->end - r->start) / 1e3,
                       step < on_side.size() && on_side[step] ? "side" : "main"});
  return t;
}

}  // namespace kiln::cuda
