// Internal to the CUDA backend: which nodes of a shaped graph run through
// kiln's window conv (window_conv_nhwc) over channel views, so a Res2Net
// block runs as its convs: slices are views of the 1x1 output, the chunk
// convs write into the concat, each chain add happens inside the load of the
// conv that reads it, a first block's independent chunk convs share one
// launch, and the pass-through chunk (pool or copy) rides along in a conv's
// launch.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "backends/cuda/kernels.hpp"
#include "backends/cuda/tactics.hpp"
#include "ir/graph.hpp"
#include "runtime/views.hpp"

namespace kiln::cuda {

inline constexpr size_t kNoNode = static_cast<size_t>(-1);

struct WindowPlan {
  std::map<size_t, size_t> convs;  // every window conv node -> the add node fused into its load (kNoNode: none)
  // Launch leaders: conv node -> the convs of its launch (itself first; more
  // when independent same-shape convs over evenly spaced windows are grouped).
  std::map<size_t, std::vector<size_t>> launches;
  std::set<size_t> grouped;  // convs launched by another conv's launch
  // Side jobs: leader -> the pass-through chunk its launch writes into the concat.
  struct Side {
    int src = -1, dst = -1;       // values: read window, written window (dst: the concat for copies)
    int dst_at = 0;               // copies: first channel of the chunk inside dst
    size_t pool_node = kNoNode;   // an AvgPool2d node run this way, or kNoNode for a copy
  };
  std::map<size_t, Side> sides;
  std::set<size_t> side_pools;                         // pool nodes run as side jobs
  std::set<std::pair<size_t, size_t>> copied_inputs;   // (concat node, input index) copied as side jobs
  std::set<size_t> fused_adds;                         // add nodes: no step, no buffer
  int64_t max_rows = 0;                                // largest n*out_h*out_w among the convs
  std::string why_not;                                 // non-empty: this graph cannot run this way, and why
};

// Every node that touches a view must be a slice, concat, pool, add or a conv
// window_conv_nhwc takes (no residual); the add of a conv marked input_add
// (ir/fusion_marks.hpp) that touches a view is fused into its load.
WindowPlan plan_window_convs(const Graph& g, const ChannelViews& cv);

// A view block: nodes and values joined by channel views (a Res2Net block:
// its chunk slices, chain adds, chunk convs, pass-through pool and concat,
// which read or write windows of the 1x1 conv's output and of the concat).
// Window convs vs cuDNN convs is decided per block (cuda_program.cpp).
struct ViewBlock {
  std::string name;           // the common dotted prefix of its nodes' names ("layer1.0"), else "<first node>#views"
  std::vector<size_t> nodes;  // the nodes touching its views, in graph order
  std::vector<int> views;     // its values that are views
};

// The view blocks of g under cv, in graph order; no node or view is in two.
std::vector<ViewBlock> view_blocks(const Graph& g, const ChannelViews& cv);

// cv without the views of the blocks whose keep[i] is 0 (their slices copy,
// their concats copy their inputs), counts recomputed.
ChannelViews keep_view_blocks(const Graph& g, const ChannelViews& cv, const std::vector<ViewBlock>& blocks,
                              const std::vector<char>& keep);

// Per block: why its convs cannot all run as window convs ("": they can) and
// its largest conv's output pixels (n*out_h*out_w), from plan_window_convs
// on that block's views alone.
struct BlockWindows {
  std::string why_not;
  int64_t max_rows = 0;
};
std::vector<BlockWindows> plan_block_windows(const Graph& g, const ChannelViews& cv, const std::vector<ViewBlock>& blocks);

// What identifies a block for timing window convs against cuDNN convs: every
// node's op, shapes and attributes and every view's place in its root, so
// blocks of equal signature take the same time either way.
LayerSignature view_block_signature(const Graph& g, const ChannelViews& cv, const ViewBlock& b, bool split_always);

// The two tactics of a view block (the record and `kiln inspect` show them).
inline constexpr const char* kBlockWindowTactic = "window convs";
inline constexpr const char* kBlockCudnnTactic = "cudnn convs";

// Whether kiln's strided kernels run node n (not a conv) on channel views:
// slices, concats, pools, and adds of equal 4-D shapes.
bool takes_channel_views(const Graph& g, const Node& n);

// Elements from one pixel to the next of v: its root's channels if v is a view.
int pixel_stride(const Graph& g, const ChannelViews& cv, int v);

// The window_conv_nhwc shape of conv node n reading x (+ x_add, -1: none).
WindowConvShape window_conv_shape(const Graph& g, const ChannelViews& cv, const Node& n, int x, int x_add);

// The PoolShape of a side job: pool node `pool` (AvgPool2d), or a copy of src when pool == kNoNode.
PoolShape window_side_shape(const Graph& g, const ChannelViews& cv, const WindowPlan::Side& side);

// What `kiln inspect` shows for the nodes that launch nothing on this path
// (node name -> note): fused adds, grouped convs, side-job pools, view slices,
// concats written in place.
std::map<std::string, std::string> window_plan_notes(const Graph& g, const ChannelViews& cv, const WindowPlan& p);

// A window conv's tactic: its launch shape as a name ("kiln window conv nt2 w16")
// and back (false when `name` is no such tactic or names an invalid shape).
inline constexpr const char* kWindowConvTactic = "kiln window conv";
std::string window_tactic_name(const WindowLaunch& l);
bool parse_window_tactic(const std::string& name, WindowLaunch& l);

}  // namespace kiln::cuda
