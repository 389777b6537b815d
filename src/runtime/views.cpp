#include "runtime/views.hpp"

#include "ir/fusion_marks.hpp"

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
  for (const Node& n : g.nodes) {
    if (is_channel_view(n)) {
      cv.parent[n.outputs[0]] = n.inputs[0];
      cv.channel_offset[n.outputs[0]] = n.attr_int("start");
      ++cv.slices_as_views;
    }
    if (n.op != Op::Concat || !on_channel_axis(g, n)) continue;
    const std::vector<int64_t> in_place = in_place_inputs(n);
    int64_t off = 0;
    size_t next = 0;  // in_place is ascending (the verifier checks)
    for (size_t k = 0; k < n.inputs.size(); ++k) {
      const int in = n.inputs[k];
      if (next < in_place.size() && in_place[next] == static_cast<int64_t>(k)) {
        cv.parent[in] = n.outputs[0];
        cv.channel_offset[in] = off;
        ++cv.concat_inputs_in_place;
        ++next;
      } else {
        ++cv.concat_inputs_copied;
      }
      off += g.values[in].shape[1];
    }
  }
  return cv;
}

}  // namespace kiln
