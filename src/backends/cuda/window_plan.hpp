// Internal to the CUDA backend: which nodes of a shaped graph run through
// kiln's window conv (window_conv_nhwc) over channel views, so a Res2Net
// block runs as its convs: slices are views of the 1x1 output, the chunk
// convs write into the concat, and each chain add happens inside the load of
// the conv that reads it.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <set>
#include <string>

#include "backends/cuda/kernels.hpp"
#include "ir/graph.hpp"
#include "runtime/views.hpp"

namespace kiln::cuda {

inline constexpr size_t kNoAdd = static_cast<size_t>(-1);

struct WindowPlan {
  std::map<size_t, size_t> convs;  // conv node -> the add node fused into its load (kNoAdd: none)
  std::set<size_t> fused_adds;     // those add nodes: no step, no buffer
  // Concat inputs that are views of other buffers (a chained Res2Net
  // block's pass-through chunk) are copied by the launch of the last window
  // conv writing into the same concat: conv node -> what it copies.
  struct PassCopy {
    int src, concat;  // value copied, concat output it goes into
    int at;           // first channel of src inside the concat
  };
  std::map<size_t, PassCopy> copies;
  std::set<std::pair<size_t, size_t>> copied_inputs;  // (concat node, input index) done that way
  int64_t max_rows = 0;            // largest n*out_h*out_w among the convs
  std::string why_not;             // non-empty: this graph cannot run this way, and why
};

// Every node that touches a view must be a slice, concat, pool, add or a conv
// window_conv_nhwc takes (no residual); an add whose only reader is such a
// conv (as its input, no activation) is fused into it.
WindowPlan plan_window_convs(const Graph& g, const ChannelViews& cv);

// Elements from one pixel to the next of v: its root's channels if v is a view.
int pixel_stride(const Graph& g, const ChannelViews& cv, int v);

// The window_conv_nhwc shape of conv node n reading x (+ x_add, -1: none).
WindowConvShape window_conv_shape(const Graph& g, const ChannelViews& cv, const Node& n, int x, int x_add);

}  // namespace kiln::cuda
