// TacticSelector and the timing protocol: see tactics.hpp.
#include "backends/cuda/tactics.hpp"

#include <algorithm>

#include "backends/cuda/cuda_check.hpp"
#include "core/error.hpp"

namespace kiln::cuda {

namespace {

constexpr int kWarmup = 2, kTimed = 7;

// Candidate timing (choose): each candidate's enqueue is captured kRepeat
// times back to back into a CUDA graph, and the graphs are replayed in
// kRounds rounds that alternate over the candidates. That is how an engine
// runs them (graph replay: no launch gaps, which for ~10 us kernels are
// longer than the kernels and made host-enqueued timings of different
// engines indistinguishable), and alternating rounds spread clock and
// thermal drift over every candidate alike. Time = median round / kRepeat.
constexpr int kRepeat = 16, kRounds = 5;
// Candidates within kTie of the fastest are a tie the measurement cannot
// resolve; the first of them in preference order (the heuristic's pick, then
// the candidates' order) is chosen, so rebuilding picks the same tactic.
constexpr float kTie = 0.015f;

struct GraphExec {
  cudaGraphExec_t e = nullptr;
  GraphExec() = default;
  GraphExec(const GraphExec&) = delete;
  GraphExec& operator=(const GraphExec&) = delete;
  GraphExec(GraphExec&& o) noexcept : e(o.e) { o.e = nullptr; }
  ~GraphExec() {
    if (e) cudaGraphExecDestroy(e);
  }
};

// kRepeat enqueues captured into one executable graph, or an empty one when
// the enqueue cannot be captured (it synchronizes, allocates, ...); the
// stream is left out of capture and the error state cleared either way.
GraphExec capture_repeated(cudaStream_t s, const std::function<void()>& enqueue) {
  GraphExec out;
  if (cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
    cudaGetLastError();
    return out;
  }
  bool ok = true;
  try {
    for (int k = 0; k < kRepeat; ++k) enqueue();
  } catch (const Error&) {
    ok = false;
  }
  cudaGraph_t g = nullptr;
  ok = cudaStreamEndCapture(s, &g) == cudaSuccess && ok && g;
  if (ok && cudaGraphInstantiate(&out.e, g, 0) != cudaSuccess) out.e = nullptr;
  if (g) cudaGraphDestroy(g);
  cudaGetLastError();
  return out;
}

int find_candidate(const std::vector<Candidate>& cands, const std::string& name) {
  for (size_t i = 0; i < cands.size(); ++i)
    if (cands[i].name == name) return static_cast<int>(i);
  return -1;
}

}  // namespace

int max_candidates(int opt_level) { return opt_level <= 2 ? 1 : opt_level == 3 ? 4 : opt_level == 4 ? 8 : 1 << 20; }

float time_enqueue_us(cudaStream_t s, const std::function<void()>& enqueue) {
  Event ev[kTimed + 1];
  for (int k = 0; k < kWarmup; ++k) enqueue();
  KILN_CUDA_CHECK(cudaEventRecord(ev[0].e, s));
  for (int k = 0; k < kTimed; ++k) {
    enqueue();
    KILN_CUDA_CHECK(cudaEventRecord(ev[k + 1].e, s));
  }
  KILN_CUDA_CHECK(cudaEventSynchronize(ev[kTimed].e));
  float t[kTimed];
  for (int k = 0; k < kTimed; ++k) KILN_CUDA_CHECK(cudaEventElapsedTime(&t[k], ev[k].e, ev[k + 1].e));
  std::sort(t, t + kTimed);
  return t[kTimed / 2] * 1000.f;
}

std::string LayerSignature::str() const {
  std::string s = op + " " + dtype_name(dtype);
  for (const Shape& sh : shapes) {
    s += " [";
    for (size_t i = 0; i < sh.size(); ++i) {
      if (i) s += ',';
      s += std::to_string(sh[i]);
    }
    s += "]";
  }
  for (const auto& [k, v] : attrs) s += " " + k + "=" + std::to_string(v);
  return s;
}

std::string TacticSelector::recorded(const std::string& node) const {
  if (!recorded_) return "";
  auto it = recorded_->find(node);
  if (it == recorded_->end() || !it->is_object()) return "";
  auto t = it->find("tactic");
  return t != it->end() && t->is_string() ? recorded_tactic_name(t->get<std::string>()) : "";
}

std::string recorded_tactic_name(const std::string& recorded) {
  size_t cut = recorded.size();
  for (const char* mark : {" x", " +"}) cut = std::min(cut, recorded.find(mark));
  return recorded.substr(0, cut);
}

TacticSelector::TacticSelector(const nlohmann::json* recorded, TunedCache* cache, bool timing, int max_candidates)
    : recorded_(recorded),
      cache_(cache),
      timing_(timing),
      max_candidates_(max_candidates),
      workspace_(timing ? kWorkspaceCapForTuning : 0) {}

std::vector<float> TacticSelector::time_candidates(const std::vector<Candidate>& cands, const std::vector<int>& runs) {
  auto enqueue = [&](int i) {
    return [&, i] { cands[i].run(stream_.s, workspace_.get(), workspace_.size()); };
  };
  std::vector<float> us(runs.size(), -1.f);
  std::vector<GraphExec> graphs;
  bool captured = true;
  for (const int i : runs) {
    if (!cands[i].prepare()) {
      graphs.emplace_back();
      continue;
    }
    graphs.push_back(capture_repeated(stream_.s, enqueue(i)));
    captured = captured && graphs.back().e;
  }
  if (!captured) {
    // One candidate cannot be captured: every candidate of the layer is timed
    // the same way, by host enqueues (time_enqueue_us), so they stay comparable.
    for (size_t k = 0; k < runs.size(); ++k) {
      if (!cands[runs[k]].prepare()) continue;
      try {
        us[k] = time_enqueue_us(stream_.s, enqueue(runs[k]));
      } catch (const Error&) {
        cudaStreamSynchronize(stream_.s);
        cudaGetLastError();
      }
    }
    return us;
  }
  std::vector<std::vector<float>> rounds(runs.size());
  Event start, stop;
  for (int r = -1; r < kRounds; ++r)  // round -1 warms every graph up
    for (size_t k = 0; k < runs.size(); ++k) {
      KILN_CUDA_CHECK(cudaEventRecord(start.e, stream_.s));
      KILN_CUDA_CHECK(cudaGraphLaunch(graphs[k].e, stream_.s));
      KILN_CUDA_CHECK(cudaEventRecord(stop.e, stream_.s));
      KILN_CUDA_CHECK(cudaEventSynchronize(stop.e));
      float ms = 0.f;
      KILN_CUDA_CHECK(cudaEventElapsedTime(&ms, start.e, stop.e));
      if (r >= 0) rounds[k].push_back(ms * 1000.f / kRepeat);
    }
  for (size_t k = 0; k < runs.size(); ++k) {
    std::sort(rounds[k].begin(), rounds[k].end());
    us[k] = rounds[k][kRounds / 2];
  }
  return us;
}

void TacticSelector::finish() { KILN_CUDA_CHECK(cudaStreamSynchronize(stream_.s)); }

TacticChoice TacticSelector::choose(const std::string& node, const LayerSignature& sig, const std::vector<Candidate>& cands,
                                    int heuristic) {
  const std::string key = sig.str();
  auto cached = cache_->find(key);
  auto take = [&](int i) { return i >= 0 && cands[i].prepare(); };
  auto with_cached_us = [&](int i, const char* source) {
    TacticChoice c{i, -1.f, source};
    if (cached != cache_->end() && cached->second.first == cands[i].name) c.us = cached->second.second;
    return c;
  };
  // 1. The bundle's record for this node.
  if (const std::string t = recorded(node); !t.empty()) {
    const int i = find_candidate(cands, t);
    if (take(i)) return with_cached_us(i, "bundle");
  }
  // 2. The same layer timed earlier in this build, or in the tactic cache file.
  if (cached != cache_->end()) {
    const int i = find_candidate(cands, cached->second.first);
    if (take(i)) return with_cached_us(i, "cache");
  }
  // 3. Timing.
  int timeable = 0;
  for (const Candidate& c : cands) timeable += c.run ? 1 : 0;
  if (timing_ && timeable > 1) {
    ++timed_layers_;
    // Which candidates run (prepared, one checked enqueue), in preference order.
    std::vector<int> order;
    if (heuristic >= 0 && heuristic < static_cast<int>(cands.size())) order.push_back(heuristic);
    for (int i = 0; i < static_cast<int>(cands.size()); ++i)
      if (i != heuristic) order.push_back(i);
    std::vector<int> runs;
    int counted = 0;
    for (const int i : order) {
      const Candidate& c = cands[i];
      if (!c.run) continue;
      if (!c.always_time && counted >= max_candidates_) continue;
      if (!c.always_time) ++counted;
      if (!c.prepare()) continue;
      try {
        if (!c.run(stream_.s, workspace_.get(), workspace_.size())) continue;
        KILN_CUDA_CHECK(cudaStreamSynchronize(stream_.s));
      } catch (const Error&) {
        cudaStreamSynchronize(stream_.s);
        cudaGetLastError();
        continue;  // a tactic that fails to execute is simply not a candidate
      }
      runs.push_back(i);
    }
    const std::vector<float> us = time_candidates(cands, runs);
    int best = -1;
    for (size_t k = 0; k < runs.size(); ++k)
      if (us[k] >= 0 && (best < 0 || us[k] < us[best])) best = static_cast<int>(k);
    if (best >= 0) {
      int pick = best;  // the first in preference order within kTie of the fastest
      for (size_t k = 0; k < runs.size(); ++k)
        if (us[k] >= 0 && us[k] <= us[best] * (1.f + kTie)) {
          pick = static_cast<int>(k);
          break;
        }
      const int i = runs[pick];
      if (cands[i].prepare()) {
        (*cache_)[key] = {cands[i].name, us[pick]};
        return {i, us[pick], "timed"};
      }
    }
  }
  // 4. The heuristic's pick, else the first that prepares.
  if (heuristic >= 0 && heuristic < static_cast<int>(cands.size()) && cands[heuristic].prepare())
    return {heuristic, -1.f, "heuristic"};
  for (size_t i = 0; i < cands.size(); ++i)
    if (cands[i].prepare()) return {static_cast<int>(i), -1.f, "heuristic"};
  fail_runtime(node, ": no tactic for ", key, " runs on this GPU");
}

}  // namespace kiln::cuda
