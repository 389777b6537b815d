#include "backends/cuda/phase_counters.hpp"

namespace kiln::cuda {

namespace {

template <class F>
void each(PhaseCounters& a, const PhaseCounters& b, F f) {
  f(a.cudnn_graph, b.cudnn_graph);
  f(a.cudnn_plan_build, b.cudnn_plan_build);
  f(a.lowering, b.lowering);
  f(a.graph_capture, b.graph_capture);
  f(a.weights_upload, b.weights_upload);
}

}  // namespace

PhaseCounters& PhaseCounters::operator+=(const PhaseCounters& o) {
  each(*this, o, [](PhaseCounter& x, const PhaseCounter& y) { x.ms += y.ms, x.count += y.count; });
  return *this;
}

PhaseCounters PhaseCounters::operator-(const PhaseCounters& o) const {
  PhaseCounters r = *this;
  each(r, o, [](PhaseCounter& x, const PhaseCounter& y) { x.ms -= y.ms, x.count -= y.count; });
  return r;
}

std::vector<std::pair<std::string, double>> PhaseCounters::items() const {
  std::vector<std::pair<std::string, double>> out;
  auto add = [&](const char* name, const PhaseCounter& c) {
    out.push_back({std::string(name) + "_ms", c.ms});
    out.push_back({std::string(name) + "_count", static_cast<double>(c.count)});
  };
  add("cudnn_graph", cudnn_graph);
  add("cudnn_plan_build", cudnn_plan_build);
  add("lowering", lowering);
  add("graph_capture", graph_capture);
  add("weights_upload", weights_upload);
  return out;
}

PhaseCounters& phase_counters() {
  thread_local PhaseCounters c;
  return c;
}

}  // namespace kiln::cuda
