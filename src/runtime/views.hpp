// Channel views: which activations need no buffer of their own.
//  - a channel slice is a window of its input;
//  - a concat's inputs are written in place into the concat's output by their
//    producers (when they are not themselves views, graph inputs or outputs).
// Which ones is decided by the pass fuse_channel_views and recorded in the
// graph as fusion marks (channel_view, in_place: ir/fusion_marks.hpp);
// plan_channel_views only reads them, so the CPU and CUDA backends, their
// memory plans and `kiln inspect` see the same views. An unmarked graph has
// none.
// A view keeps a channel offset into its root value. Layout-agnostic: the
// backend turns channel offsets into addresses (NCHW: offset * H * W per
// image, batch stride C_root * H * W).
#pragma once
#include <cstdint>
#include <vector>

#include "ir/graph.hpp"

namespace kiln {

struct ChannelViews {
  std::vector<int> parent;                // value -> the value it is a window of, -1 if none
  std::vector<int64_t> channel_offset;    // channel offset inside `parent`
  int root(int v) const;                  // follows parents to the buffer that owns the bytes
  int64_t root_offset(int v) const;       // channel offset inside root(v)
  bool is_view(int v) const { return parent[v] >= 0; }
  int slices_as_views = 0;                // slice nodes that copy nothing
  int concat_inputs_in_place = 0;         // concat inputs written in place by their producers
  int concat_inputs_copied = 0;
};

// The views the graph's marks give: a slice's window starts at its `start`,
// an in-place input sits at the sum of the widths before it; the inputs of
// channel concats that are not in place count as copied.
ChannelViews plan_channel_views(const Graph& g);

}  // namespace kiln
