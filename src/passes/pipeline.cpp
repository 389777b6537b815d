#include "core/error.hpp"
#include "ir/verifier.hpp"
#include "passes/pass.hpp"

namespace kiln {

void replace_uses(Graph& g, int from, int to) {
  for (auto& n : g.nodes)
    for (int& in : n.inputs)
      if (in == from) in = to;
  for (int& o : g.outputs)
    if (o == from) o = to;
  g.invalidate_uses();  // inputs edited in place; this is O(n) already
}

bool single_use(const Graph& g, int value_id) {
  return !g.is_graph_output(value_id) && g.consumers(value_id).size() == 1;
}

bool keeps_f32(const Node& n) { return n.has_attr("precision") && n.attr_str("precision") == "f32"; }

bool same_precision(const Node& a, const Node& b) { return keeps_f32(a) == keeps_f32(b); }

int rewrite_each(Graph& g, const std::function<bool(const Graph&, const Node&)>& matches,
                 const std::function<void(Graph&, size_t)>& rewrite) {
  // One sweep, one canonicalize at the end: re-canonicalizing after every
  // rewrite made the pipeline quadratic (a 10,000-node graph has thousands of
  // rewrites). Producer links and the use-list stay exact through the sweep
  // (rewrites go through set_node_inputs / hand_over_outputs), so later
  // matches see the rewritten graph; only node order may be stale until the
  // canonicalize (e.g. a fused skip input that comes after the conv).
  int count = 0;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    if (n.inputs.empty() && n.outputs.empty()) continue;  // detached earlier in this sweep
    if (!matches(g, n)) continue;
    rewrite(g, i);
    const Node& after = g.nodes[i];
    if (!after.outputs.empty() || !after.inputs.empty())
      fail_runtime("pass rewrite of node '", after.name, "' did not hand its outputs over");
    ++count;
  }
  if (count) g.canonicalize();
  return count;
}

std::vector<Pass> default_pipeline(const PipelineOptions& opts) {
  // Order matters: BatchNorm folds into the conv first (so the activation
  // follows the conv directly), activations fuse before residual adds (so
  // add+relu moves into the conv as one unit), and precision comes last so
  // folding happens in fp32.
  std::vector<Pass> p = {
      {"fold_batchnorm", fold_batchnorm},
      {"fold_parallel_convs", fold_parallel_convs},
      {"fuse_activation", fuse_activation},
      {"fuse_residual_add", fuse_residual_add},
      {"eliminate_dead_nodes", eliminate_dead_nodes},
  };
  if (opts.quantize) p.push_back({"quantize", opts.quantize});
  if (opts.channel_align > 1)
    p.push_back({"pad_channels", [a = opts.channel_align, a8 = opts.channel_align_8bit](Graph& g) {
                   return pad_channels(g, a, a8);
                 }});
  if (opts.merge_linears) p.push_back({"merge_parallel_linears", merge_parallel_linears});
  if (opts.precision != DType::F32)
    p.push_back({"set_precision", [dt = opts.precision](Graph& g) { return set_precision(g, dt); }});
  if (opts.fusions.input_add) p.push_back({"fuse_conv_input_add", fuse_conv_input_add});
  if (opts.fusions.squeeze_excitation) p.push_back({"fuse_squeeze_excitation", fuse_squeeze_excitation});
  if (opts.fusions.split_runs) p.push_back({"fuse_split_runs", fuse_split_runs});
  if (opts.fusions.channel_views) p.push_back({"fuse_channel_views", fuse_channel_views});
  return p;
}

FusionOptions fusion_options(const EngineSwitches& sw) {
  FusionOptions f;
  f.input_add = sw.get(Switch::FuseAdd).value_or(true);
  f.squeeze_excitation = sw.get(Switch::FuseSe).value_or(true);
  f.split_runs = sw.get(Switch::FuseSplit).value_or(true);  // channel_views: always (no switch; pass.hpp says why)
  return f;
}

void mark_fusions(Graph& g, const FusionOptions& f) {
  if (f.input_add) fuse_conv_input_add(g);
  if (f.squeeze_excitation) fuse_squeeze_excitation(g);
  if (f.split_runs) fuse_split_runs(g);
  if (f.channel_views) fuse_channel_views(g);
}

void run_pipeline(Graph& g, const PipelineOptions& opts) {
#ifdef KILN_VERIFY_PASSES
  const bool verify = true;
#else
  const bool verify = opts.verify;
#endif
  if (verify) verify_graph(g, "family builder");
  for (const Pass& pass : default_pipeline(opts)) {
    int rewrites = pass.run(g);
    g.canonicalize();
    if (verify) verify_graph(g, pass.name);
    if (opts.log) *opts.log << "pass " << pass.name << ": " << rewrites << " rewrites, " << g.nodes.size() << " nodes\n";
  }
}

}  // namespace kiln
