// Fusion marks: node attributes that the fusion passes set (src/passes/
// fuse_conv_input_add.cpp, fuse_squeeze_excitation.cpp, fuse_split_runs.cpp,
// fuse_channel_views.cpp) and that every reader takes its facts from: the CPU
// backend, the CUDA backend (window conv, squeeze-excitation and split-run
// lowering, channel views), their memory plans (runtime/views.hpp) and
// `kiln inspect`. They are part of graph.json, so a bundle
// carries them.
//
// A mark never changes what the graph computes: a backend that cannot honour
// one (the CUDA backend's cuDNN path has no conv prologue add, say) runs the
// marked nodes as they are. The verifier checks that each mark still
// describes the graph (fusion_mark_problem), so a hand-edited graph.json
// cannot make a backend fuse what is not there.
#pragma once
#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "ir/graph.hpp"

namespace kiln {

// conv2d, int 1: input 0 is the output of an add (no activation, two
// non-constant operands of the output's shape) read by this conv alone and
// not a graph output; the conv may add the operands while it loads them (the
// Res2Net chain add), so the add needs no step and no buffer.
inline constexpr const char* kMarkInputAdd = "input_add";
// mul, int 1: the gate of a squeeze-excitation block: input 1 comes from a
// pointwise conv with bias and sigmoid, which reads only a pointwise conv with
// bias, which reads only a global average pool (each read by the next alone).
inline constexpr const char* kMarkSqueezeExcitation = "squeeze_excitation";
// slice, int N >= 2: this slice and the N-1 nodes after it are channel slices
// (axis 1) of the same input: one launch may write them all.
inline constexpr const char* kMarkSplitRun = "split_run";
// slice, int 1: a window of its input: a slice along axis 1 of a 4-D value
// whose output is no graph output and whose input and output no concat
// writes in place (in_place below); it copies nothing, its output is its
// input's bytes from channel `start` on (runtime/views.hpp).
inline constexpr const char* kMarkChannelView = "channel_view";
// concat along axis 1 of a 4-D value, list of input indices (ascending,
// distinct, at least one): those inputs are written in place into the
// concat's output by their producers, each at the channel offset the concat
// puts it at. A listed input has a producer (no graph input, no constant), is
// no graph output, is no view itself (not a channel_view slice's output, not
// listed by another concat), is read by this concat once only (readers tell
// an in-place input by its value), and no channel_view slice is a window of
// it (a window of it would be a window of the concat output at another
// offset than the slice says).
inline constexpr const char* kMarkInPlace = "in_place";

// Why conv node `conv` cannot carry input_add (the rule above), or "".
std::string input_add_problem(const Graph& g, size_t conv);
// The add node a marked conv reads through, or -1 (unmarked or not a conv).
int input_add_of(const Graph& g, size_t conv);

struct SqueezeExcitation {
  size_t pool = 0, reduce = 0, expand = 0, mul = 0;  // node indices
};
// The block whose gate is mul node `mul`, or why there is none.
std::optional<SqueezeExcitation> squeeze_excitation_at(const Graph& g, size_t mul, std::string* why = nullptr);

// Why `count` slices starting at node `first` are not a split run, or "".
std::string split_run_problem(const Graph& g, size_t first, int64_t count);
// The nodes of the split run starting at `first` (itself only when unmarked).
std::vector<size_t> split_run_at(const Graph& g, size_t first);

// True for a node along axis 1 (channels) of a 4-D first output: the
// slices and concats channel views can apply to.
bool on_channel_axis(const Graph& g, const Node& n);
// Why slice node `slice` cannot carry channel_view (the rule above), or "".
std::string channel_view_problem(const Graph& g, size_t slice);
// Why input `k` of concat node `concat` cannot be listed in its in_place,
// given every other mark in the graph (this concat's other entries included),
// or "".
std::string in_place_input_problem(const Graph& g, size_t concat, size_t k);
// Marked or not: channel_view on a slice, the in_place list of a concat
// (empty when unmarked). Read by runtime/views.cpp.
bool is_channel_view(const Node& n);
std::vector<int64_t> in_place_inputs(const Node& n);

// Every fusion mark of node `i` checked: "" when they all hold, else what is wrong.
std::string fusion_mark_problem(const Graph& g, size_t i);

}  // namespace kiln
