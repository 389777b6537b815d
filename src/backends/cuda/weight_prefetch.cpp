// Switch weight_prefetch (weight_prefetch.hpp): where the prefetch step goes
// and what it reads, and its insertion into a lowered program.
#include "backends/cuda/weight_prefetch.hpp"

#include <algorithm>
#include <cstring>
#include <set>

#include "backends/cuda/cuda_check.hpp"
#include "backends/cuda/lower.hpp"
#include "core/error.hpp"

namespace kiln::cuda {

std::optional<size_t> weight_prefetch_start(const std::vector<int>& step_nodes,
                                            const std::map<int, std::vector<std::pair<int, int64_t>>>& constants,
                                            int64_t budget) {
  std::set<int> seen_nodes, counted, seen_values;  // counted: nodes whose constants the tail took
  int64_t total = 0;
  std::optional<size_t> start;
  for (size_t k = step_nodes.size(); k-- > 0;) {
    const int node = step_nodes[k];
    if (counted.count(node)) {
      start = k;  // an earlier step of a node in the tail: the tail starts there
      continue;
    }
    if (!seen_nodes.insert(node).second) continue;
    const auto it = constants.find(node);
    if (it == constants.end()) continue;
    int64_t add = 0;
    std::vector<int> fresh;
    for (const auto& [v, elements] : it->second)
      if (!seen_values.count(v) && std::find(fresh.begin(), fresh.end(), v) == fresh.end()) fresh.push_back(v), add += elements;
    if (add == 0) continue;  // nothing of its own to fetch: the tail need not start before it
    if (total + add > budget) break;
    total += add;
    seen_values.insert(fresh.begin(), fresh.end());
    counted.insert(node);
    start = k;
  }
  return start;
}

std::vector<DeviceRange> weight_prefetch_ranges(const std::vector<int>& step_nodes, size_t start,
                                                const std::map<int, std::vector<DeviceRange>>& reads) {
  std::vector<DeviceRange> out;
  std::set<const void*> seen;
  std::set<int> nodes;
  for (size_t k = start; k < step_nodes.size(); ++k) {
    if (!nodes.insert(step_nodes[k]).second) continue;
    const auto it = reads.find(step_nodes[k]);
    if (it == reads.end()) continue;
    for (const DeviceRange& r : it->second)
      if (seen.insert(r.ptr).second) out.push_back(r);
  }
  return out;
}

void insert_weight_prefetch(Lowering& L) {
  CudaEngine::Program& p = L.p;
  const Graph& g = L.g;
  // Each launch's graph constants (launch_nodes: the launch computing each node).
  const std::vector<int> launch = launch_nodes(g, L.f);
  std::map<int, std::vector<std::pair<int, int64_t>>> constants;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const int at = launch[i];
    if (at < 0 || at >= static_cast<int>(g.nodes.size())) continue;  // byte aliases, unknown launches, the input conversion, outputs
    for (int in : g.nodes[i].inputs)
      if (g.values[in].constant) constants[at].push_back({in, shape_numel(g.values[in].shape)});
  }
  const std::optional<size_t> start = weight_prefetch_start(p.step_nodes, constants, kWeightPrefetchElements);
  if (!start) return;
  // The side run forks before the first main-lane step of the tail.
  size_t fork = *start;
  while (fork < p.steps.size() && p.step_on_side[fork]) ++fork;
  if (fork >= p.steps.size()) return;
  const std::vector<DeviceRange> ranges = weight_prefetch_ranges(p.step_nodes, *start, L.weight_reads);
  if (ranges.empty()) return;
  std::vector<uint64_t> flat;
  for (const DeviceRange& r : ranges) flat.push_back(reinterpret_cast<uintptr_t>(r.ptr)), flat.push_back(r.bytes);
  p.prefetch_ranges = DeviceBuffer(flat.size() * sizeof(uint64_t));
  KILN_CUDA_CHECK(cudaMemcpy(p.prefetch_ranges.get(), flat.data(), p.prefetch_ranges.size(), cudaMemcpyHostToDevice));
  const void* dev = p.prefetch_ranges.get();
  const int count = static_cast<int>(ranges.size());
  const bool last = L.f.prefetch_evict_last;
  // The step, at index `fork` (launch order), on the side lane; every index
  // from `fork` on moves up one.
  const std::string from = p.step_names[*start], name = p.step_names[fork];
  const int node = p.step_nodes[fork];
  p.steps.insert(p.steps.begin() + static_cast<std::ptrdiff_t>(fork),
                 [dev, count, last](const Exec& x) { l2_prefetch(dev, count, last, x.stream); });
  p.step_names.insert(p.step_names.begin() + static_cast<std::ptrdiff_t>(fork), name);
  p.step_nodes.insert(p.step_nodes.begin() + static_cast<std::ptrdiff_t>(fork), node);
  p.step_kernels.insert(p.step_kernels.begin() + static_cast<std::ptrdiff_t>(fork),
                        cat("kiln l2_prefetch", last ? " evict_last" : "", ": the weights of the steps from ", from,
                            " on (side lane)"));
  p.step_on_side.insert(p.step_on_side.begin() + static_cast<std::ptrdiff_t>(fork), 1);
  for (CudaEngine::Program::SideLaneRun& r : p.side_runs) {
    for (size_t& s : r.steps) s += s >= fork;
    r.fork_step += r.fork_step >= fork;
    r.join_step += r.join_step >= fork;
  }
  p.side_runs.push_back({{fork}, fork + 1, p.steps.size()});
  sort_side_runs(p);
  p.weight_prefetch = true;
  p.prefetch_evict_last = last;
}

}  // namespace kiln::cuda
