// A pass is a match function and a rewrite; pipeline.cpp is the ordered list.
// Passes keep node names: a fused conv is still called "layer1.0.conv1".
#pragma once
#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "core/switches.hpp"
#include "ir/graph.hpp"
#include "quant/calibrate.hpp"

namespace kiln {

struct Pass {
  const char* name;
  std::function<int(Graph&)> run;  // returns the number of rewrites it made
};

// Rewires every use of `from` (node inputs and graph outputs) to `to`.
void replace_uses(Graph& g, int from, int to);
// True when value_id feeds exactly one node and is not a graph output, so the
// producer may be rewritten in place without changing other readers.
bool single_use(const Graph& g, int value_id);
// A node of an f32 island (attribute precision = "f32"): set_precision keeps
// it in f32 in 16-bit engines.
bool keeps_f32(const Node& n);
// True when two nodes compute in the same precision: both or neither are
// f32-island nodes. Fusions join only such nodes.
bool same_precision(const Node& a, const Node& b);

// Match-and-rewrite driver shared by the passes: for each node i (in order)
// where `matches` holds, `rewrite` folds node i into another node: it edits
// inputs with Graph::set_node_inputs and ends with g.hand_over_outputs(i, to),
// which detaches node i (checked). Nodes are not erased during the sweep, so
// indices stay valid; the graph is canonicalized once at the end.
int rewrite_each(Graph& g, const std::function<bool(const Graph&, const Node&)>& matches,
                 const std::function<void(Graph&, size_t)>& rewrite);

int fold_batchnorm(Graph& g);
// add(conv(x, Wa), conv(x, Wb)) with centred kernels -> one conv (RepVGG pairs).
int fold_parallel_convs(Graph& g);
int fuse_activation(Graph& g);
int fuse_residual_add(Graph& g);
int eliminate_dead_nodes(Graph& g);
// Linears reading one input whose results attention / ms_deform_attn read as
// rows -> one linear over the concatenated weights and a slice of it per
// original result (merge_parallel_linears.cpp says which). Float linears only:
// it runs after the quantize pass, before set_precision.
int merge_parallel_linears(Graph& g);
// Widens channel chunks (Res2Net's split widths) to a multiple of `align`
// channels with zero weights; exact. For backends whose fast kernels need
// aligned channel rows (CUDA: 16 bytes). align <= 1: no-op. align_8bit > 1:
// also the values 8-bit layers write and chain through residuals
// (EfficientNet's 24/40/112-wide stages) to a multiple of align_8bit channels.
int pad_channels(Graph& g, int64_t align, int64_t align_8bit = 0);
// Converts float constants and activations to `dtype` (f16/bf16) and inserts
// casts so graph inputs and outputs stay f32 (the engine casts internally).
int set_precision(Graph& g, DType dtype);
// Quantizes the conv2d/linear nodes `nodes` (quant::select_quantized on this
// graph) with `scales` (static per-tensor activation scales by value name, and
// its precision): 8-bit weights per output channel, quantize nodes or folded
// output quantizes on their inputs (passes/quantize.cpp says how). Runs on the
// float graph before set_precision; returns the number of rewrites.
// residuals_8bit (the recipe's "residuals"): a selected layer whose readers
// are all selected layers, reading it as their input or as their residual,
// writes codes (the residual then read in 8 bits); false: only as their input.
int quantize_layers(Graph& g, const std::vector<int>& nodes, const quant::ActivationScales& scales, bool residuals_8bit = true);

// Fusion marks (ir/fusion_marks.hpp): attributes only, the graph computes the
// same. Each returns the number of nodes it marked.
// The mark passes' loop: sets attribute `mark` = 1 on every node of op `op`
// that has no such mark yet and for which `fits(node index)`; returns how many.
int mark_each(Graph& g, Op op, const char* mark, const std::function<bool(size_t)>& fits);
int fuse_conv_input_add(Graph& g);
int fuse_squeeze_excitation(Graph& g);
int fuse_split_runs(Graph& g);
int fuse_channel_views(Graph& g);  // channel_view on slices, in_place on concats

// Which fusion-mark passes run: the bundle's engine switches fuse_add,
// fuse_se and fuse_split (each runs unless its switch is off). Channel views
// have no switch: views change no number, the CPU backend always takes them
// and the CUDA backend decides per batch whether to (window_conv,
// cuda_views), so marking them costs nothing where they go unused.
struct FusionOptions {
  bool input_add = true, squeeze_excitation = true, split_runs = true, channel_views = true;
};
// The fusion-mark passes a bundle's engine switches enable.
FusionOptions fusion_options(const EngineSwitches& switches);
// Runs the fusion-mark passes `f` enables (the pipeline's last step; also
// applied at load to bundles from before marks were recorded).
void mark_fusions(Graph& g, const FusionOptions& f);
// What provenance build.fusion_marks says about a bundle's graph.json:
// absent, no marks (mark_fusions at load); true or 1, every mark but the
// channel views (fuse_channel_views at load); kFusionMarksVersion, all of
// them (the graph is read as it is). The builder (bundle/builder.cpp) is to
// record kFusionMarksVersion; while it records true, loading runs
// fuse_channel_views on graphs already marked, which adds nothing.
inline constexpr int kFusionMarksVersion = 2;

struct PipelineOptions {
  DType precision = DType::F32;
  int64_t channel_align = 0;    // pad_channels alignment in channels (0: pass not run)
  int64_t channel_align_8bit = 0;  // the same for values of 1-byte codes (8-bit layers' outputs)
  FusionOptions fusions;        // fusion marks, set last (after precision: they describe the final graph)
  bool merge_linears = true;    // merge_parallel_linears (off: the checkpoint's linears one by one)
  // 8-bit quantization (kiln build --quantize): run on the f32 graph after the
  // BatchNorm and activation folds, before pad_channels and set_precision; it
  // selects, calibrates and calls quantize_layers (bundle/builder.cpp). Empty: not run.
  std::function<int(Graph&)> quantize;
  bool verify = false;          // run the IR verifier after every pass (always on in debug builds)
  std::ostream* log = nullptr;  // one line per pass: name, rewrites, node count
};

std::vector<Pass> default_pipeline(const PipelineOptions& opts);
void run_pipeline(Graph& g, const PipelineOptions& opts);

}  // namespace kiln
