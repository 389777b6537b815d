#include "runtime/memory_planner.hpp"

#include <algorithm>

namespace kiln {

MemoryPlan plan_memory(const Graph& g, const std::function<size_t(const Value&)>& bytes_of, size_t alignment) {
  return plan_memory_with_views(g, bytes_of, [](int) { return -1; }, alignment);
}

namespace {

std::vector<int> roots(const Graph& g, const std::function<int(int)>& alias_of) {
  std::vector<int> root(g.values.size());
  for (int v = 0; v < static_cast<int>(g.values.size()); ++v) {
    int r = v;
    for (int a = alias_of(r); a >= 0; a = alias_of(r)) r = a;
    root[v] = r;
  }
  return root;
}

}  // namespace

std::vector<Lifetime> value_lifetimes(const Graph& g, const std::function<int(int)>& alias_of,
                                      const std::map<int, int>& live_until, const std::map<int, int>& live_from) {
  const int nv = static_cast<int>(g.values.size());
  const std::vector<int> root = roots(g, alias_of);
  const int end = static_cast<int>(g.nodes.size());
  // A buffer lives from the first write into it (its own producer or the
  // producer of any view into it, e.g. a concat input written in place)
  // to the last read of it or of any view. Each output of a node counts on
  // its own, so an unread second output ends at its producer.
  std::vector<Lifetime> life(nv, Lifetime{end, -1});
  for (int v : g.inputs) life[root[v]].first = -1;
  for (int i = 0; i < end; ++i)
    for (int o : g.nodes[i].outputs) {
      life[root[o]].first = std::min(life[root[o]].first, i);
      life[root[o]].last = std::max(life[root[o]].last, i);
    }
  for (int i = 0; i < end; ++i)
    for (int in : g.nodes[i].inputs) life[root[in]].last = std::max(life[root[in]].last, i);
  for (int o : g.outputs) life[root[o]].last = end;
  for (const auto& [v, until] : live_until) life[root[v]].last = std::max(life[root[v]].last, until);
  for (const auto& [v, from] : live_from) life[root[v]].first = std::min(life[root[v]].first, from);
  for (int v = 0; v < nv; ++v) {
    if (g.values[v].constant) life[v] = Lifetime{};
    else if (root[v] != v) life[v] = life[root[v]];
  }
  return life;
}

MemoryPlan plan_memory_with_views(const Graph& g, const std::function<size_t(const Value&)>& bytes_of,
                                  const std::function<int(int)>& alias_of, size_t alignment,
                                  const std::map<int, int>& live_until, const std::map<int, int>& live_from) {
  const int nv = static_cast<int>(g.values.size());
  const std::vector<int> root = roots(g, alias_of);
  const std::vector<Lifetime> life = value_lifetimes(g, alias_of, live_until, live_from);
  struct Item {
    int value;
    size_t bytes;
  };
  std::vector<Item> items;
  MemoryPlan plan;
  plan.offsets.assign(nv, -1);
  for (int v = 0; v < nv; ++v) {
    if (g.values[v].constant || root[v] != v) continue;
    size_t b = (bytes_of(g.values[v]) + alignment - 1) / alignment * alignment;
    items.push_back({v, b});
    plan.naive_bytes += b;
  }
  std::stable_sort(items.begin(), items.end(), [](const Item& a, const Item& b) { return a.bytes > b.bytes; });
  struct Placed {
    int64_t offset;
    size_t bytes;
    int first, last;
  };
  std::vector<Placed> placed;
  for (const Item& it : items) {
    std::vector<std::pair<int64_t, int64_t>> busy;
    for (const Placed& p : placed)
      if (!(p.last < life[it.value].first || life[it.value].last < p.first))
        busy.push_back({p.offset, p.offset + static_cast<int64_t>(p.bytes)});
    std::sort(busy.begin(), busy.end());
    int64_t off = 0;
    for (const auto& [b, e] : busy) {
      if (off + static_cast<int64_t>(it.bytes) <= b) break;
      off = std::max(off, e);
    }
    plan.offsets[it.value] = off;
    placed.push_back({off, it.bytes, life[it.value].first, life[it.value].last});
    plan.arena_bytes = std::max(plan.arena_bytes, static_cast<size_t>(off) + it.bytes);
  }
  for (int v = 0; v < nv; ++v)
    if (root[v] != v) plan.offsets[v] = plan.offsets[root[v]];
  return plan;
}

}  // namespace kiln
