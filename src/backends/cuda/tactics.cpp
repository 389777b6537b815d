// TacticSelector and the timing protocol: see tactics.hpp.
#include "backends/cuda/tactics.hpp"

#include <algorithm>

#include "backends/cuda/cuda_check.hpp"
#include "core/error.hpp"

namespace kiln::cuda {

namespace {

constexpr int kWarmup = 2, kTimed = 7;

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
  if (recorded_) {
    auto it = recorded_->find(node);
    if (it != recorded_->end() && it->is_object()) {
      auto t = it->find("tactic");
      if (t != it->end() && t->is_string()) {
        const int i = find_candidate(cands, recorded_tactic_name(t->get<std::string>()));
        if (take(i)) return with_cached_us(i, "bundle");
      }
    }
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
    int best = -1, counted = 0;
    float best_us = 0.f;
    for (size_t i = 0; i < cands.size(); ++i) {
      const Candidate& c = cands[i];
      if (!c.run) continue;
      if (!c.always_time && counted >= max_candidates_) continue;
      if (!c.always_time) ++counted;
      if (!c.prepare()) continue;
      float us = -1.f;
      try {
        if (!c.run(stream_.s, workspace_.get(), workspace_.size())) continue;
        us = time_enqueue_us(stream_.s, [&] { c.run(stream_.s, workspace_.get(), workspace_.size()); });
      } catch (const Error&) {
        cudaStreamSynchronize(stream_.s);
        cudaGetLastError();
        continue;  // a tactic that fails to execute is simply not a candidate
      }
      if (best < 0 || us < best_us) best = static_cast<int>(i), best_us = us;
    }
    if (best >= 0 && cands[best].prepare()) {
      (*cache_)[key] = {cands[best].name, best_us};
      return {best, best_us, "timed"};
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
