// kiln bench --profile and kiln study: per-layer times of one engine call,
// summed per layer group (consecutive layers of one group key).
#pragma once
#include <algorithm>
#include <cctype>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/kernel_label.hpp"
#include "families/family.hpp"
#include "runtime/engine_impl.hpp"

namespace kiln::cli {

// Group key of a node name: its first component ("layer2.1.conv2" -> "layer2"),
// plus the stage index when the first component is a bare container name
// ("blocks.3.1.conv_dw" -> "blocks.3"), or the named part under it when the
// name goes deeper ("model.decoder.layers.0.fc1" -> "model.decoder").
inline std::string group_of(const std::string& name) {
  auto dot = name.find('.');
  std::string head = name.substr(0, dot);
  bool has_digit = std::any_of(head.begin(), head.end(), ::isdigit);
  if (dot == std::string::npos || has_digit) return head;
  auto dot2 = name.find('.', dot + 1);
  std::string second = name.substr(dot + 1, dot2 == std::string::npos ? std::string::npos : dot2 - dot - 1);
  bool numeric = !second.empty() && std::all_of(second.begin(), second.end(), ::isdigit);
  // A bare container over named parts, three levels deep or more (Hugging
  // Face detectors: "model.backbone.model...", "model.encoder.fpn_blocks...",
  // "model.decoder.layers.0..."): the part is the group.
  if (!numeric && dot2 != std::string::npos) return head + "." + second;
  return numeric ? head + "." + second : head;
}

// The group of a node name: its family's layer group (Family::layer_groups,
// e.g. RT-DETR v2's backbone / AIFI / encoder / query selection / decoder),
// else group_of.
class LayerGrouping {
 public:
  LayerGrouping() = default;
  explicit LayerGrouping(std::vector<LayerGroup> groups) : groups_(std::move(groups)) {}
  // The groups of a bundle's family (none for a family this kiln lacks).
  static LayerGrouping of_family(const std::string& family) {
    const Family* f = family_registry().find(family);
    return f ? LayerGrouping(f->layer_groups()) : LayerGrouping();
  }
  std::string operator()(const std::string& name) const {
    for (const LayerGroup& g : groups_)
      for (const std::string& p : g.prefixes)
        if (name.compare(0, p.size(), p) == 0) return g.name;
    return group_of(name);
  }
  // Where a group's row goes: the family's groups in the family's order, then
  // the others in the order they first run.
  size_t rank(const std::string& group) const {
    for (size_t i = 0; i < groups_.size(); ++i)
      if (groups_[i].name == group) return i;
    return groups_.size();
  }
  void order_rows(nlohmann::json& rows) const {
    std::stable_sort(rows.begin(), rows.end(), [this](const nlohmann::json& a, const nlohmann::json& b) {
      return rank(a["group"].get<std::string>()) < rank(b["group"].get<std::string>());
    });
  }

 private:
  std::vector<LayerGroup> groups_;
};

// One JSON row per layer group (a group whose layers interleave with
// another's, as the side lane's may, is one row), made from `fields` when the
// group first comes; rows() orders them as LayerGrouping::order_rows does.
class GroupRows {
 public:
  explicit GroupRows(const LayerGrouping& grouping) : grouping_(grouping) {}
  nlohmann::json& row(const std::string& group, const nlohmann::json& fields) {
    for (nlohmann::json& r : rows_)
      if (r["group"] == group) return r;
    rows_.push_back(fields);
    rows_.back()["group"] = group;
    return rows_.back();
  }
  nlohmann::json rows() const {
    nlohmann::json out = rows_;
    grouping_.order_rows(out);
    return out;
  }

 private:
  const LayerGrouping& grouping_;
  nlohmann::json rows_ = nlohmann::json::array();
};

template <typename T>
void add_to(nlohmann::json& row, const char* key, T v) {
  row[key] = row[key].get<T>() + v;
}

// Layers carry "kernels" (the names of what one call launches for them) and
// groups a kernel count where the backend lists them (CUDA); where its listing
// failed, "kernels_unavailable" says why (the times are still measured).
inline nlohmann::json profile_json(ExecutionContext& ctx, const std::vector<Tensor>& inputs, int rounds,
                                   const LayerGrouping& grouping = {}) {
  auto layers = profile_layers(ctx, inputs, rounds);
  nlohmann::json lj = nlohmann::json::array();
  GroupRows groups(grouping);  // ms, steps and (where listed) kernels per group
  const bool listed = std::any_of(layers.begin(), layers.end(), [](const LayerTime& l) { return !l.kernels.empty(); });
  double total = 0;
  for (const auto& l : layers) {
    nlohmann::json one = {{"name", l.name}, {"ms", l.ms}};
    if (listed) one["kernels"] = l.kernels;
    lj.push_back(std::move(one));
    nlohmann::json& g = groups.row(grouping(l.name), listed ? nlohmann::json{{"ms", 0.0}, {"steps", 0}, {"kernels", 0}}
                                                            : nlohmann::json{{"ms", 0.0}, {"steps", 0}});
    add_to(g, "ms", l.ms);
    add_to(g, "steps", 1);
    if (listed) add_to(g, "kernels", static_cast<int>(l.kernels.size()));
    total += l.ms;
  }
  nlohmann::json out = {{"rounds", rounds}, {"total_ms", total}, {"groups", groups.rows()}, {"layers", lj}};
  for (const auto& l : layers)
    if (!l.kernels_unavailable.empty()) {  // the listing failed; the times stand
      out["kernels_unavailable"] = l.kernels_unavailable;
      break;
    }
  return out;
}

// kiln bench --trace: one call's launches as the GPU ran them in a graph
// replay (BackendContext::trace). span: first start to last end; busy: the
// sum of launch durations; gaps: the time between one launch's end and the
// next one's start where positive (launch latency the replay did not hide);
// groups: per layer group (LayerGrouping of the step; rows as
// LayerGrouping::order_rows puts them), the time its launches add to the call, each counted from the latest end
// before it (under PDL a kiln kernel starts before the one ahead of it ends
// and waits: its span overlaps; docs/benchmarking.md), so the groups sum to
// the span; with their busy time and launches. Where the spans name their
// lane (the engine's own graph with its side lane), each span keeps it and
// `lanes` gives per lane the launches, busy time and `alone_us`: the time its
// launches run while no launch of another lane runs. A side launch that runs
// alone is time the main lane spent waiting (for the join, or for SMs the
// side launch held): `side_alone` lists those launches, most first (up to 8).
// (Per-launch shares of the span, as the groups count them, credit the
// earlier-starting of two overlapping launches, so they cannot say which
// lane a call waited for.)
// The part of span k's interval during which no span of another lane runs.
inline double time_alone(const std::vector<KernelSpan>& spans, size_t k) {
  const KernelSpan& s = spans[k];
  std::vector<std::pair<double, double>> others;  // other lanes' intervals overlapping s, clipped to it
  for (const KernelSpan& o : spans)
    if (!o.lane.empty() && o.lane != s.lane) {
      const double lo = std::max(o.start_us, s.start_us), hi = std::min(o.start_us + o.us, s.start_us + s.us);
      if (hi > lo) others.push_back({lo, hi});
    }
  std::sort(others.begin(), others.end());
  double covered = 0, at = s.start_us;
  for (const auto& [lo, hi] : others) {
    if (hi <= at) continue;
    covered += hi - std::max(lo, at);
    at = hi;
  }
  return s.us - covered;
}

inline nlohmann::json trace_json(const CallTrace& t, const LayerGrouping& grouping = {}) {
  nlohmann::json out = {{"replays", t.replays}};
  if (!t.unavailable.empty()) {
    out["unavailable"] = t.unavailable;
    return out;
  }
  if (!t.note.empty()) out["note"] = t.note;
  nlohmann::json spans = nlohmann::json::array();
  GroupRows groups(grouping);
  std::vector<std::pair<std::string, nlohmann::json>> lanes;  // in order of first launch
  std::vector<std::pair<double, std::string>> side_alone;      // (time alone, step) of side launches
  double busy = 0, gaps = 0, end = 0;
  for (size_t k = 0; k < t.spans.size(); ++k) {
    const KernelSpan& s = t.spans[k];
    nlohmann::json one = {{"step", s.step}, {"kernel", readable_kernel_name(s.kernel)}, {"start_us", s.start_us}, {"us", s.us}};
    if (!s.lane.empty()) one["lane"] = s.lane;
    spans.push_back(std::move(one));
    busy += s.us;
    if (k > 0 && s.start_us > end) gaps += s.start_us - end;
    const double adds = k == 0 ? s.start_us + s.us : std::max(0.0, s.start_us + s.us - end);
    end = std::max(end, s.start_us + s.us);
    nlohmann::json& g = groups.row(s.step.empty() ? "?" : grouping(s.step),
                                   {{"start_us", s.start_us}, {"us", 0.0}, {"busy_us", 0.0}, {"launches", 0}});
    add_to(g, "us", adds);
    add_to(g, "busy_us", s.us);
    add_to(g, "launches", 1);
    if (s.lane.empty()) continue;
    auto it = std::find_if(lanes.begin(), lanes.end(), [&](const auto& l) { return l.first == s.lane; });
    if (it == lanes.end())
      it = lanes.insert(lanes.end(), {s.lane, {{"lane", s.lane}, {"launches", 0}, {"busy_us", 0.0}, {"alone_us", 0.0}}});
    add_to(it->second, "launches", 1);
    add_to(it->second, "busy_us", s.us);
    const double alone = time_alone(t.spans, k);
    add_to(it->second, "alone_us", alone);
    if (s.lane == "side" && alone > 0) side_alone.push_back({alone, s.step});
  }
  if (!lanes.empty()) {
    nlohmann::json lj = nlohmann::json::array();
    for (auto& [name, l] : lanes) lj.push_back(std::move(l));
    out["lanes"] = std::move(lj);
    std::stable_sort(side_alone.begin(), side_alone.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
    nlohmann::json sa = nlohmann::json::array();
    for (size_t k = 0; k < side_alone.size() && k < 8; ++k)
      sa.push_back({{"step", side_alone[k].second}, {"alone_us", side_alone[k].first}});
    out["side_alone"] = std::move(sa);
  }
  out["launches"] = t.spans.size();
  out["span_us"] = end;
  out["busy_us"] = busy;
  out["gaps_us"] = gaps;
  out["groups"] = groups.rows();
  out["spans"] = spans;
  return out;
}

// Kernels per launch kind over a profile's layers ("kiln::cuda::map_kernel": 12),
// most first; empty when the profile lists none.
inline std::vector<std::pair<std::string, int>> kernel_census(const nlohmann::json& profile) {
  std::map<std::string, int> n;
  for (const auto& l : profile.value("layers", nlohmann::json::array()))
    for (const auto& k : l.value("kernels", nlohmann::json::array())) ++n[readable_kernel_name(k.get<std::string>())];
  std::vector<std::pair<std::string, int>> out(n.begin(), n.end());
  std::stable_sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  return out;
}

}  // namespace kiln::cli
