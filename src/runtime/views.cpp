#include "runtime/views.hpp"

namespace kiln {

int ChannelViews::root(int v) const {
  while (parent[v] >= 0) v = parent[v];
  return v;
}

int64_t ChannelViews::root_offset(int v) const {
  int64_t off = 0;
  for (; parent[v] >= 0; v = parent[v]) off += channel_offset[v];
  return off;
}

ChannelViews plan_channel_views(const Graph& g) {
  ChannelViews cv;
  cv.parent.assign(g.values.size(), -1);
  cv.channel_offset.assign(g.values.size(), 0);
  std::vector<char> fixed(g.values.size(), 0);  // graph inputs/outputs and constants keep their own dense buffers
  for (int v : g.inputs) fixed[v] = 1;
  for (int v : g.outputs) fixed[v] = 1;
  for (size_t v = 0; v < g.values.size(); ++v)
    if (g.values[v].constant) fixed[v] = 1;
  auto channel_axis = [&](const Node& n) { return n.attr_int("axis") == 1 && g.values[n.outputs[0]].shape.size() == 4; };
  for (const Node& n : g.nodes) {
    const int out = n.outputs[0];
    if (n.op == Op::Slice && channel_axis(n) && !fixed[out]) {
      cv.parent[out] = n.inputs[0];
      cv.channel_offset[out] = n.attr_int("start");
      ++cv.slices_as_views;
    }
  }
  // Values that slices are windows of keep their own buffer.
  std::vector<char> has_windows(g.values.size(), 0);
  for (size_t v = 0; v < g.values.size(); ++v)
    if (cv.parent[v] >= 0) has_windows[cv.parent[v]] = 1;
  for (const Node& n : g.nodes) {
    if (n.op != Op::Concat || !channel_axis(n)) continue;
    int64_t off = 0;
    for (int in : n.inputs) {
      // An input can be written in place when it owns its bytes (not a view,
      // not already in place in another concat) and is not pinned.
      const bool ok = !fixed[in] && !has_windows[in] && cv.parent[in] < 0 && g.values[in].producer >= 0 &&
                      cv.root(n.outputs[0]) != in;
      if (ok) {
        cv.parent[in] = n.outputs[0];
        cv.channel_offset[in] = off;
        ++cv.concat_inputs_in_place;
      } else {
        ++cv.concat_inputs_copied;
      }
      off += g.values[in].shape[1];
    }
  }
  return cv;
}

}  // namespace kiln
