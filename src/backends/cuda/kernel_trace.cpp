// trace_replays and attribute_trace (kernel_trace.hpp).
#include "backends/cuda/kernel_trace.hpp"

#include <cupti.h>
#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>

#include "backends/cuda/cuda_check.hpp"
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
        g_records->push_back({k->name ? short_kernel_name(k->name) : "kernel", k->start, k->end});
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMSET: {
        const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(rec);
        g_records->push_back({"memset", m->start, m->end});
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMCPY: {
        const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(rec);
        g_records->push_back({"memcpy", m->start, m->end});
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

}  // namespace

std::vector<TraceRecord> trace_replays(cudaStream_t stream, size_t steps, const std::function<void(size_t)>& run_step,
                                       int replays) {
  const Cupti& c = cupti();
  if (!c.lib) fail_runtime("trace: CUPTI (libcupti.so, CUDA's extras) not found on the library path");
  if (!c.enable || !c.disable || !c.register_callbacks || !c.flush_all || !c.next_record)
    fail_runtime("trace: the CUPTI library found lacks the activity API");
  std::vector<TraceRecord> records;
  const CUpti_ActivityKind kinds[] = {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMSET,
                                      CUPTI_ACTIVITY_KIND_MEMCPY};
  cudaGraphExec_t exec = nullptr;
  try {
    {
      std::lock_guard<std::mutex> lock(g_mutex);
      g_records = &records;
    }
    // Activity on before the graph is made, so its nodes are traced as nodes.
    // The buffer callbacks are registered once per process (a second bundle
    // of one kiln bench traces through the same ones).
    static const CUptiResult registered = c.register_callbacks(buffer_requested, buffer_completed);
    check(registered, "cuptiActivityRegisterCallbacks");
    for (auto k : kinds) check(c.enable(k), "cuptiActivityEnable");
    cudaGraph_t graph = nullptr;
    KILN_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    try {
      for (size_t i = 0; i < steps; ++i) run_step(i);
    } catch (...) {
      cudaStreamEndCapture(stream, &graph);
      if (graph) cudaGraphDestroy(graph);
      cudaGetLastError();
      throw;
    }
    KILN_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
    const cudaError_t inst = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    KILN_CUDA_CHECK(inst);
    for (int r = 0; r < replays; ++r) KILN_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    KILN_CUDA_CHECK(cudaStreamSynchronize(stream));
    check(c.flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED), "cuptiActivityFlushAll");  // every record delivered
    for (auto k : kinds) c.disable(k);
  } catch (...) {
    c.flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    for (auto k : kinds) c.disable(k);
    std::lock_guard<std::mutex> lock(g_mutex);
    g_records = nullptr;
    if (exec) cudaGraphExecDestroy(exec);
    throw;
  }
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    g_records = nullptr;
  }
  cudaGraphExecDestroy(exec);
  return records;
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
                       static_cast<double>(r.end - r.start) / 1e3});
  }
  return t;
}

}  // namespace kiln::cuda
