// Builds the per-batch program: shapes the graph for the batch, gathers the
// facts that decide how nodes run (fusion groups, channel views, the bundle's
// recorded plan), plans memory, then lowers every node through its op's
// lowering (lower.hpp) with tactics from the one selector (tactics.hpp).
#include <algorithm>
#include <limits>
#include <optional>
#include <set>

#include "backends/cuda/cuda_check.hpp"
#include "backends/cuda/lower.hpp"
#include "ir/node_select.hpp"
#include "core/error.hpp"

namespace kiln::cuda {

void plan_output_casts(const Graph& g, GraphFacts& f) {
  for (int v : g.outputs) {
    const int c = g.values[v].producer;
    if (c < 0 || g.nodes[c].op != Op::Cast || f.fused_away[c] || f.folded_cast[c] || g.values[v].dtype != DType::F32) continue;
    const int u = g.nodes[c].inputs[0];
    const Value& uv = g.values[u];
    if ((uv.dtype != DType::F16 && uv.dtype != DType::BF16) || uv.constant || uv.producer < 0 || uv.shape != g.values[v].shape ||
        f.output_from.count(v) || f.viewed(u))
      continue;
    f.fused_away[static_cast<size_t>(c)] = 1;
    f.output_from[v] = u;
    f.live_through(u, static_cast<int>(g.nodes.size()));  // read after the last node
  }
}

namespace {

// The largest conv (output pixels, n*out_h*out_w) the window-conv path is
// chosen for by default. Measured on the H200 (res2net50_26w_4s fp16, engine
// time with window convs vs cuDNN convs + split/add/concat kernels,
// bench/window_conv_threshold.sh): batch 1 (largest chunk conv 3136 pixels)
// 0.649 vs 0.748 ms, batch 2 (6272) 0.779 vs 0.833, batch 4 (12544) 1.006 vs
// 0.868, batch 32 4.0 vs 2.17: the kernel is built for latency and loses to
// cuDNN once the convs are big enough to fill the GPU.
constexpr int64_t kWindowConvMaxRows = 8192;

bool plan_flag(const nlohmann::json& plan, const char* key, const std::string& where) {
  auto it = plan.find(key);
  if (it == plan.end() || !it->is_boolean()) fail_input(where, ": plan field '", key, "' missing or not true/false");
  return it->get<bool>();
}

// The plan's `window_conv`: the names of the view blocks run as window convs
// (bundles before per-block choices: true, every block, or false, none).
const nlohmann::json& plan_window_field(const nlohmann::json& plan, const std::string& where) {
  auto it = plan.find("window_conv");
  if (it == plan.end() || !(it->is_boolean() || it->is_array()))
    fail_input(where, ": plan field 'window_conv' missing or not a list of view block names (or true/false)");
  for (const auto& name : it->is_array() ? *it : nlohmann::json::array())
    if (!name.is_string()) fail_input(where, ": plan field 'window_conv' lists ", name.dump(), ", not a block name");
  return *it;
}

bool plan_runs_windows(const nlohmann::json& plan, const std::string& where) {
  const nlohmann::json& w = plan_window_field(plan, where);
  return w.is_boolean() ? w.get<bool>() : !w.empty();
}

// Which view blocks run as window convs (1) rather than cuDNN convs (0):
// the record's list, else the switch window_conv (on: every block that can,
// off: none) or, auto, every block that can whose largest conv has at most
// kWindowConvMaxRows output pixels (opt level >= 3 builds time each block
// instead: Impl::build_timing_blocks).
std::vector<char> window_blocks_of(const GraphFacts& f, const nlohmann::json* plan, const EngineSwitches& sw,
                                   const std::string& where) {
  std::vector<char> w(f.blocks.size(), 0);
  auto take = [&](size_t i) {
    if (!f.block_windows[i].why_not.empty())
      fail_input(where, " runs window convs, which this graph cannot: ", f.block_windows[i].why_not);
    w[i] = 1;
  };
  if (plan) {
    const nlohmann::json& field = plan_window_field(*plan, where);
    if (field.is_boolean()) {
      if (field.get<bool>() && f.blocks.empty()) fail_input(where, " runs window convs, which this graph cannot: no channel views");
      for (size_t i = 0; field.get<bool>() && i < f.blocks.size(); ++i) take(i);
      return w;
    }
    for (const auto& name : field) {
      size_t i = 0;
      while (i < f.blocks.size() && f.blocks[i].name != name.get<std::string>()) ++i;
      if (i == f.blocks.size())
        fail_input(where, " runs window convs in '", name.get<std::string>(), "', which is no view block of this graph");
      take(i);
    }
    return w;
  }
  const std::optional<bool> forced = sw.get(Switch::WindowConv);
  for (size_t i = 0; i < f.blocks.size(); ++i)
    w[i] = f.block_windows[i].why_not.empty() && forced.value_or(f.block_windows[i].max_rows <= kWindowConvMaxRows);
  return w;
}

// Channel views and window convs, per view block (see the comment inside).
void plan_views_and_windows(const CudaEngine::Impl& m, const Graph& g, const nlohmann::json* plan,
                            const std::vector<char>* window, int64_t batch, GraphFacts& f) {
  const std::string where = cat("the bundle's CUDA plan for batch ", batch);
  const EngineSwitches& sw = m.opts.switches;
  // Channel views (runtime/views.hpp): in NHWC a channel window is a pointer
  // offset plus the root buffer's pixel stride, so Res2Net's chunk slices read
  // the 1x1 conv's output in place and its 3x3 convs (and the pass-through
  // pool) write straight into the concat. Without window convs they are used
  // only when switch cuda_views is on and every node touching a view can take
  // strides: measured on the H200 (res2net50_26w_4s fp16, batch 1), cuDNN
  // 9.14 runs strided convs with one extra kernel each, and the engine took
  // 0.859 ms with views (250 kernels) against 0.801 ms with a copy per chunk
  // and 0.736 ms with one split launch per block (150 kernels); see
  // families/timm_res2net/README.md.
  //
  // With kiln's window conv (window_conv.cu) the views cost no extra kernels:
  // the chunk convs read and write windows and fuse the chain adds into their
  // loads, so a Res2Net block runs as its convs. Decided per view block (a
  // Res2Net block: window_plan.hpp): a block runs as window convs where every
  // conv touching its views is one that kernel takes (f16/bf16, no grouped
  // convs) and the choice says so (window_blocks_of, or timing); the other
  // blocks' views are cleared, so they run cuDNN convs over copies and the
  // memory plan sees exactly the views the program uses.
  f.cv = plan_channel_views(g);
  const bool any_views = f.cv.slices_as_views + f.cv.concat_inputs_in_place > 0;
  f.blocks = view_blocks(g, f.cv);
  f.block_windows = plan_block_windows(g, f.cv, f.blocks);
  f.window = window ? *window : window_blocks_of(f, plan, sw, where);
  f.window.resize(f.blocks.size(), 0);
  f.window_mode = std::count(f.window.begin(), f.window.end(), 1) > 0;
  if (plan) {
    f.use_views = plan_flag(*plan, "channel_views", where);
    if (f.use_views && !any_views) fail_input(where, " uses channel views, which this graph has none of");
    if (f.window_mode && !f.use_views) fail_input(where, " runs window convs without channel views, which they read and write");
  } else {
    f.use_views = f.window_mode || (any_views && sw.get(Switch::CudaViews).value_or(false));
  }
  if (f.window_mode) {
    f.cv = keep_view_blocks(g, f.cv, f.blocks, f.window);
    f.wp = plan_window_convs(g, f.cv);
    // Each block can alone; the blocks share no node or view, so together too.
    if (!f.wp.why_not.empty()) fail_runtime("batch ", batch, ": the window-conv blocks cannot run together (", f.wp.why_not, ")");
  }
}

// Squeeze-excitation groups, window convs over channel views, and the values
// that share another's bytes. A bundle's recorded plan (`plan`, may be null)
// fixes the decisions; otherwise `window` (when given: the view blocks run as
// window convs, blocks past its end none), the switches and the measured
// thresholds do.
// Whether a program built with the bundle's `plan` (null: building) plans the
// side lane: bundles whose plan predates it (no `side_lane` key) run without it, as built.
bool side_lane_recorded(const nlohmann::json* plan) { return !plan || (plan->is_object() && plan->contains("side_lane")); }

// A graph-wide choice a plan records as `key: true` (absent in plans from
// before it: false): `late_side_fork` (the side runs fork late, session 34),
// `chain_side_fork` (... after an mlp_chain, session 36),
// `weight_prefetch` (the L2 prefetch step, session 35) and `prefetch_evict_last` (its lines evict-last).
bool recorded_flag(const nlohmann::json& plan, const char* key) {
  const auto it = plan.is_object() ? plan.find(key) : plan.end();
  return it != plan.end() && it->is_boolean() && it->get<bool>();
}

// The node names a plan lists under `key` (none when it has no such key: a
// plan from before that fusion); anything but a list of names fails naming `where`.
std::set<std::string> recorded_names(const nlohmann::json& plan, const char* key, const std::string& where) {
  std::set<std::string> names;
  const auto it = plan.is_object() ? plan.find(key) : plan.end();
  if (it == plan.end()) return names;
  if (!it->is_array()) fail_input(where, ": '", key, "' is not a list of node names");
  for (const auto& name : *it) {
    if (!name.is_string()) fail_input(where, ": '", key, "' is not a list of node names");
    names.insert(name.get<std::string>());
  }
  return names;
}

// Every node a plan lists under a fusion (`recorded`) is one this graph fused
// (`planned`, node indices); else the load fails naming it: "<where> <does>
// <name>, which this graph cannot (rebuild the bundle)".
void require_planned(const Graph& g, const std::set<std::string>& recorded, const std::set<size_t>& planned,
                     const std::string& where, const char* does) {
  std::set<std::string> names;
  for (size_t ni : planned) names.insert(g.nodes[ni].name);
  for (const std::string& name : recorded)
    if (!names.count(name)) fail_input(where, " ", does, " ", name, ", which this graph cannot (rebuild the bundle)");
}

void plan_fusions(const CudaEngine::Impl& m, const Graph& g, const nlohmann::json* plan, const std::vector<char>* window,
                  int64_t batch, GraphFacts& f) {
  const std::string where = cat("the bundle's CUDA plan for batch ", batch);
  f.start(g);
  // Squeeze-excitation as se_mlp steps (se_plan.hpp) where the graph marks
  // the blocks (switch fuse_se off at build: no marks, all unfused).
  // fuse_se_mul on also applies the gate inside the step. Off by default:
  // on the H200 (efficientnet_b0 fp16) it saved 16 launches but no time at
  // batch 1 (0.407 vs 0.405 ms) and cost time at batch 32 (1.19 vs 1.08 ms):
  // its gate-times-pixels loop moves 2-byte elements, where mul_channel_nhwc
  // moves 16-byte vectors.
  const EngineSwitches& sw = m.opts.switches;
  // --reference: the matched nodes run the plain reference on the host and
  // the whole graph runs dense (one buffer per value, no fused groups), as on
  // the CPU backend; the plan records no views and no window convs.
  if (!m.opts.reference.empty()) {
    f.reference = select_nodes(g, m.opts.reference, "--reference pattern");
    f.dense = true;
    f.cv.parent.assign(g.values.size(), -1);  // no value is a view
    f.cv.channel_offset.assign(g.values.size(), 0);
    if (plan && (plan_runs_windows(*plan, where) || plan_flag(*plan, "channel_views", where)))
      fail_input(where, " uses views or window convs, which a graph with nodes on the plain reference runs without");
    return;
  }
  f.se = plan_squeeze_excitation(g, sw.get(Switch::FuseSeMul).value_or(false));  // marked blocks (switch fuse_se: the pass)
  for (size_t i : f.se.fused_away) f.fused_away[i] = 1;
  f.live_until = f.se.live_until;
  plan_deform_inputs(g, f);  // RT-DETR's value/logits reshapes read in place (ms_deform_attn.cpp)
  plan_views_and_windows(m, g, plan, window, batch, f);
  plan_token_rows(g, f);  // RT-DETR's token rows of NHWC maps and back: the same bytes (shape_ops.cpp)
  plan_upsample_concats(g, f);  // nearest upsamples read by a concat inside its launch (layout.cpp)
  // RT-DETR's memory times its valid-anchor mask inside the concat's launch
  // (layout.cpp): at load the muls the plan lists (none in a plan from before it).
  // Switch concat_mask: off unless on (auto: off until a GPU has run it).
  const std::set<std::string> recorded_masks = plan ? recorded_names(*plan, "concat_mask", where) : std::set<std::string>{};
  if (plan ? !recorded_masks.empty() : sw.get(Switch::ConcatMask).value_or(false))
    plan_concat_masks(g, f, plan ? &recorded_masks : nullptr);
  std::set<size_t> masked;
  for (const auto& [cat, mul] : f.concat_masks) masked.insert(mul);
  require_planned(g, recorded_masks, masked, where, "writes inside its concat's launch");
  plan_wide_linears(g, f);  // f32 linears reading a widened 16-bit value run as 16-bit GEMMs with f32 output (linear.cpp)
  plan_norm_adds(g, f);   // residual adds read by a layer_norm run inside it (norm.cpp)
  plan_box_refines(g, f);  // RT-DETR's box refinement (cast, inverse_sigmoid, add, cast) in one launch (elementwise.cpp)
  plan_row_windows(g, f);  // slices of one projection read in place by attention / ms_deform_attn (shape_ops.cpp)
  plan_output_casts(g, f);  // f32 casts of outputs folded into the output conversion
  // Small linear chains in one launch (linear.cpp). Auto: the chains alone;
  // on: also those ending in a post-norm residual, inside the norm's launch.
  // H200, RT-DETR r18vd fp16 batch 1 (session 21, in-graph trace): a box
  // head's chain took 7.6-8.0 us against ~11 us for its three GEMMs, but
  // out_proj + layer norm 7.7-10 us against 5.6, the FFN with its norm
  // 16.6-18.5 against 10.2; at batch 8 (no cluster) chains lost too.
  // A post-norm's one projection as small_gemm_norm (switch linear_norm,
  // linear.cpp): at build by the rule, at load as the plan records it (a plan
  // from before it, with no `linear_norm` key: none).
  const std::optional<bool> mlp = sw.get(Switch::FuseMlp), lnorm = sw.get(Switch::LinearNorm);
  const std::set<std::string> recorded_norms = plan ? recorded_names(*plan, "linear_norm", where) : std::set<std::string>{};
  LinearNormRule rule;
  if (plan) {
    rule.recorded = &recorded_norms;
  } else {
    // Auto: off. small_gemm_norm was written in session 28, which got no GPU
    // time: its tests and the engine A/B (bench/results/2026-12-06-session28,
    // call 2) decide the default. On: every post-norm it takes, at any rows.
    rule.on = lnorm.value_or(false);
  }
  if (mlp.value_or(true) || rule.on || !recorded_norms.empty())
    plan_mlp_chains(g, f, device_sm_count(), mlp.value_or(true), mlp.value_or(false), rule);
  require_planned(g, recorded_norms, f.linear_norms, where, "runs as small_gemm_norm");
  for (const auto& [conv, add] : f.wp.convs) {
    if (add == kNoNode) continue;
    f.fused_away[add] = 1;  // the conv at index `conv` reads the add's inputs
    for (int in : g.nodes[add].inputs) f.live_through(in, static_cast<int>(conv));
  }
  // A fused add's output is never stored: it shares its first input's bytes.
  for (size_t add : f.wp.fused_adds) f.alias[g.nodes[add].outputs[0]] = g.nodes[add].inputs[0];
  for (size_t c : f.wp.grouped) f.fused_away[c] = 1;     // run by their group's first conv
  for (size_t pn : f.wp.side_pools) f.fused_away[pn] = 1;  // run inside a conv's launch
  f.split_always = sw.get(Switch::FuseSplit).value_or(false);  // marked runs (switch fuse_split off: none marked)
  // Independent branches on a second stream (side_lane.cpp).
  // Switch late_side_fork (auto: on since session 34, r18vd batch 1 0.633 ->
  // 0.628 ms on the H100); at load what the plan records (false for a plan from before it).
  f.late_side_fork = plan ? recorded_flag(*plan, "late_side_fork") : sw.get(Switch::LateSideFork).value_or(true);
  // Switch chain_side_fork (auto: off until measured on a GPU, see
  // plan_side_lane); at load what the plan records (false for a plan from before it).
  f.chain_side_fork = plan ? recorded_flag(*plan, "chain_side_fork") : sw.get(Switch::ChainSideFork).value_or(false);
  const bool side_lane = sw.get(Switch::SideLane).value_or(true) && side_lane_recorded(plan);
  if (side_lane) plan_side_lane(g, f, f.late_side_fork, f.chain_side_fork);
  // Switch weight_prefetch (auto: off until measured on a GPU): the L2
  // prefetch step on the side lane (weight_prefetch.hpp), inserted after
  // lowering; at load what the plan records.
  f.weight_prefetch = side_lane && (plan ? recorded_flag(*plan, "weight_prefetch") : sw.get(Switch::WeightPrefetch).value_or(false));
  f.prefetch_evict_last =
      f.weight_prefetch && (plan ? recorded_flag(*plan, "prefetch_evict_last") : sw.get(Switch::PrefetchEvictLast).value_or(false));
}

// Channel views without window convs: every conv touching a view must be a
// cuDNN conv that takes pixel strides with its epilogue fused, every other
// node one of kiln's strided kernels; otherwise views are off (copies).
// A recorded plan that asks for views where this cuDNN cannot is an error.
void plan_strided_convs(const CudaEngine::Impl& m, const Graph& g, bool recorded, int64_t batch, GraphFacts& f) {
  auto pixel_stride = [&](int v) { return as_int(g.values[f.cv.root(v)].shape[1]); };
  std::string why_not;
  for (size_t ni = 0; why_not.empty() && ni < g.nodes.size(); ++ni) {
    const Node& n = g.nodes[ni];
    bool touches = f.cv.is_view(n.outputs[0]);
    for (int in : n.inputs) touches |= f.cv.is_view(in);
    if (!touches) continue;
    if (n.op != Op::Conv2d) {
      if (!takes_channel_views(g, n)) why_not = n.name + " takes no channel views";
      continue;
    }
    if (n.inputs.size() > 3 && f.cv.is_view(n.inputs[3])) {
      why_not = n.name + " reads a view as its residual";
      continue;
    }
    const ConvDesc d = conv_desc(g, n, m.opts.allow_tf32, f.cv.is_view(n.inputs[0]) ? pixel_stride(n.inputs[0]) : 0,
                                 f.cv.is_view(n.outputs[0]) ? pixel_stride(n.outputs[0]) : 0);
    try {
      auto op = std::make_unique<ConvOp>(m.cudnn.h, d, m.recorded_tactic(batch, n.name));
      if (!op->epilogue_fused() && (d.has_bias || d.has_residual || d.act != Activation::None))
        why_not = n.name + ": cuDNN fuses no epilogue into its strided form";
      else f.view_convs[ni] = std::move(op);
    } catch (const Error& e) {
      why_not = n.name + ": cuDNN takes no strided form (" + e.what() + ")";
    }
  }
  if (why_not.empty()) return;
  if (recorded) fail_input("the bundle's CUDA plan uses channel views, which cannot run here: ", why_not);
  f.use_views = false;
  f.view_convs.clear();
}

// The arena: every value's offset (views inside their root, aliases on their
// source) and the staging buffer of the engine inputs.
void plan_program_memory(CudaEngine::Program& p, const Graph& g, const GraphFacts& f) {
  p.view_bytes.assign(g.values.size(), 0);
  if (f.use_views)
    for (size_t v = 0; v < g.values.size(); ++v)
      if (f.cv.is_view(static_cast<int>(v)))
        p.view_bytes[v] = f.cv.root_offset(static_cast<int>(v)) * static_cast<int64_t>(dtype_size(g.values[v].dtype));
  p.memory = plan_memory_with_views(
      g, value_bytes,
      [&](int v) { return f.alias[v] >= 0 ? f.alias[v] : (f.use_views && f.cv.is_view(v) ? f.cv.parent[v] : -1); }, 64,
      f.live_until, f.live_from);
  p.views_used = f.use_views ? f.cv.slices_as_views + f.cv.concat_inputs_in_place : 0;
  p.output_from.clear();
  for (int v : g.outputs) p.output_from.push_back(f.output_from.count(v) ? f.output_from.at(v) : v);
  p.channel_views = f.use_views;
  p.linear_norms.clear();
  for (size_t ln : f.linear_norms) p.linear_norms.push_back(g.nodes[ln].name);
  p.late_side_fork = f.late_side_fork && !f.side_runs.empty();
  p.chain_side_fork = f.chain_side_fork && !f.side_runs.empty();
  p.concat_masks.clear();
  for (const auto& [cat, mul] : f.concat_masks) p.concat_masks.push_back(g.nodes[mul].name);
  for (size_t i = 0; i < f.blocks.size(); ++i)
    if (f.window[i]) p.window_blocks.push_back(f.blocks[i].name);
  p.blocks = f.blocks, p.block_windows = f.block_windows;
  for (size_t k = 0; k < g.inputs.size(); ++k) {
    p.staging_in_offsets.push_back(p.staging_in_bytes);
    p.staging_in_bytes += (static_cast<size_t>(shape_numel(g.values[g.inputs[k]].shape)) * 4 + 255) / 256 * 256;
  }
}

// Where a program's plan differs from the bundle's record of it, or "".
std::string plan_difference(const nlohmann::json& built, const nlohmann::json& recorded) {
  for (const char* key : {"arena_bytes", "workspace_bytes"})
    if (recorded.value(key, nlohmann::json()) != built[key])
      return cat(key, " ", built[key].dump(), " here, ", recorded.value(key, nlohmann::json()).dump(), " recorded");
  const auto& rs = recorded.value("steps", nlohmann::json::array());
  const auto& bs = built["steps"];
  if (!rs.is_array() || rs.size() != bs.size()) return cat(bs.size(), " steps here, ", rs.is_array() ? rs.size() : 0, " recorded");
  for (size_t i = 0; i < bs.size(); ++i)
    if (rs[i] != bs[i]) return cat("step ", i, " is ", bs[i].dump(), " here, ", rs[i].dump(), " recorded");
  const auto& rv = recorded.value("values", nlohmann::json::object());
  if (rv != built["values"]) return "the arena offsets of the values differ";
  if (recorded.value("side_lane", nlohmann::json()) != built.value("side_lane", nlohmann::json()))
    return cat("side lane ", built.value("side_lane", nlohmann::json()).dump(), " here, ",
               recorded.value("side_lane", nlohmann::json()).dump(), " recorded");
  return "";
}

}  // namespace

nlohmann::json CudaEngine::Program::plan_json() const {
  nlohmann::json step_list = nlohmann::json::array(), values = nlohmann::json::object();
  for (size_t i = 0; i < steps.size(); ++i) step_list.push_back({step_names[i], step_kernels[i]});
  for (size_t v = 0; v < shaped.values.size(); ++v)
    if (!shaped.values[v].constant && memory.offsets.at(v) >= 0)
      values[shaped.values[v].name] = {memory.offsets[v], view_bytes.empty() ? 0 : view_bytes[v]};
  nlohmann::json j = {{"window_conv", window_blocks}, {"channel_views", channel_views}, {"arena_bytes", memory.arena_bytes},
                      {"workspace_bytes", workspace_bytes}, {"steps", step_list}, {"values", values}};
  j["linear_norm"] = linear_norms;
  j["concat_mask"] = concat_masks;
  if (side_lane_planned) {
    nlohmann::json runs = nlohmann::json::array();
    for (const SideLaneRun& r : side_runs) runs.push_back({{"steps", r.steps}, {"fork", r.fork_step}, {"join", r.join_step}});
    j["side_lane"] = runs;
    if (late_side_fork) j["late_side_fork"] = true;
    if (chain_side_fork) j["chain_side_fork"] = true;
    if (weight_prefetch) j["weight_prefetch"] = true;
    if (prefetch_evict_last) j["prefetch_evict_last"] = true;
  }
  return j;
}

std::shared_ptr<CudaEngine::Program> CudaEngine::Impl::build_program(int64_t batch) {
  const nlohmann::json* plan = recorded_plan(batch);
  // Window convs vs cuDNN convs per view block is timed while building at opt
  // level >= 3, unless a switch decides (window_conv on/off; cuda_views on,
  // where the blocks on cuDNN would read strided views, not copies).
  const EngineSwitches& sw = opts.switches;
  if (!plan && opts.tune && opts.opt_level >= 3 && opts.reference.empty() && !sw.get(Switch::WindowConv) &&
      !sw.get(Switch::CudaViews).value_or(false))
    return build_timing_blocks(batch);
  return lower_program(batch, plan, nullptr);
}

std::shared_ptr<CudaEngine::Program> CudaEngine::Impl::lower_program(int64_t batch, const nlohmann::json* plan,
                                                                     const std::vector<char>* window) {
  chosen[batch].clear(), chosen_us[batch].clear();  // what this program chose, alone (block timing lowers several)
  const PhaseTimer timer(&phase_counters().lowering);
  auto p = std::make_shared<Program>();
  p->shaped = *graph;
  Graph& g = p->shaped;
  for (int in : g.inputs) g.values[in].shape[0] = batch;
  g.infer_shapes();
  // What this batch runs is recorded per batch (tactics_json) and the bundle
  // replays it: the graph-wide decisions and every tactic come from the
  // record, and the program built from them must match the recorded plan.
  // Timing happens only while building (opts.tune) at opt level >= 3.
  GraphFacts f;
  plan_fusions(*this, g, plan, window, batch, f);
  if (f.use_views && !f.window_mode) plan_strided_convs(*this, g, plan != nullptr, batch, f);
  plan_program_memory(*p, g, f);
  if (f.window_mode)
    for (auto& [node, note] : window_plan_notes(g, f.cv, f.wp)) chosen[batch][node] = note;  // what `kiln inspect` shows
  TacticSelector tactics(recorded_layers(batch), &tuned, opts.tune && opts.opt_level >= 3, max_candidates(opts.opt_level));
  Lowering L{*this, *p, g, batch, f, tactics, ValuePtr{p.get()}, ""};
  lower_engine_inputs(L);
  for (const auto& [out, from] : f.output_from)  // what `kiln inspect` shows for a folded output cast
    L.record(g.nodes[g.values[out].producer].name, "folded into the output conversion (no launch in the graph)");
  if (plan && !opts.tune) prebuild_recorded_convs(L);
  for (size_t ni = 0; ni < g.nodes.size(); ++ni) {
    if (opts.tune && opts.progress) opts.progress(static_cast<int64_t>(ni), static_cast<int64_t>(g.nodes.size()));
    lower_node(L, ni);
  }
  tactics.finish();
  timed_layers += tactics.timed_layers();
  schedule_side_lane(*p, f);
  p->side_lane_planned = side_lane_recorded(plan);
  if (f.weight_prefetch) insert_weight_prefetch(L);
  if (opts.tune && opts.progress) opts.progress(static_cast<int64_t>(g.nodes.size()), static_cast<int64_t>(g.nodes.size()));
  if (plan) {
    // The blocks' window-vs-cuDNN tactics, as the build recorded them (the plan's list decided).
    const nlohmann::json* layers = recorded_layers(batch);
    for (const ViewBlock& b : p->blocks) {
      auto it = layers ? layers->find(b.name) : nlohmann::json::const_iterator{};
      if (!layers || it == layers->end() || !it->is_object() || !it->contains("tactic") || !(*it)["tactic"].is_string()) continue;
      chosen[batch][b.name] = (*it)["tactic"].get<std::string>();
      if (it->contains("time_us") && (*it)["time_us"].is_number()) chosen_us[batch][b.name] = (*it)["time_us"].get<float>();
    }
    const std::string diff = plan_difference(p->plan_json(), *plan);
    if (!diff.empty())
      fail_input("the bundle's CUDA plan for batch ", batch, " is not what this kiln builds from it (", diff,
                 "); rebuild the bundle");
  }
  return p;
}

// Window convs vs cuDNN convs, per view block, as a timed tactic: the graph
// lowered with every block on cuDNN and with every block that can as window
// convs; each such block's steps in either program enqueued back to back on
// that program's own arena (zeroed) and timed by the one protocol, under a
// typed signature (view_block_signature) so equal blocks are timed once and
// the choice is cached; the heuristic (largest conv <= kWindowConvMaxRows
// output pixels) where timing is not possible. The program of the chosen set
// is the result; each block's choice is recorded under its name.
std::shared_ptr<CudaEngine::Program> CudaEngine::Impl::build_timing_blocks(int64_t batch) {
  const std::vector<char> none;
  std::shared_ptr<Program> dense = lower_program(batch, nullptr, &none);
  const auto dense_chosen = chosen[batch];
  const auto dense_us = chosen_us[batch];
  std::vector<char> can(dense->blocks.size(), 0);
  for (size_t i = 0; i < can.size(); ++i) can[i] = dense->block_windows[i].why_not.empty();
  if (std::count(can.begin(), can.end(), 1) == 0) return dense;
  std::shared_ptr<Program> windows = lower_program(batch, nullptr, &can);
  const auto window_chosen = chosen[batch];
  const auto window_us = chosen_us[batch];

  const ChannelViews marked = plan_channel_views(dense->shaped);
  const bool split_always = opts.switches.get(Switch::FuseSplit).value_or(false);
  DeviceBuffer dense_arena(std::max<size_t>(dense->memory.arena_bytes, 1)), window_arena(std::max<size_t>(windows->memory.arena_bytes, 1));
  KILN_CUDA_CHECK(cudaMemset(dense_arena.get(), 0, dense_arena.size()));
  KILN_CUDA_CHECK(cudaMemset(window_arena.get(), 0, window_arena.size()));
  cudnnHandle_t h = cudnn.h;
  // The steps of program `p` that belong to block `b`'s nodes, as one enqueue.
  auto block_run = [h](const Program& p, const ViewBlock& b, void* arena) {
    std::set<std::string> names;
    for (size_t ni : b.nodes) names.insert(p.shaped.nodes[ni].name);
    std::vector<size_t> steps;
    for (size_t k = 0; k < p.steps.size(); ++k)
      if (names.count(p.step_names[k])) steps.push_back(k);
    return [&p, steps, arena, h](cudaStream_t s, void* ws, size_t cap) {
      if (p.workspace_bytes > cap) return false;
      Exec x;
      x.stream = s, x.cudnn = h, x.arena = static_cast<char*>(arena), x.workspace = ws, x.workspace_bytes = cap;
      x.staging_in.assign(p.staging_in_offsets.size(), nullptr);
      for (size_t k : steps) p.steps[k](x);
      return true;
    };
  };
  TacticSelector tactics(recorded_layers(batch), &tuned, true, max_candidates(opts.opt_level));
  std::vector<char> pick(can.size(), 0);
  std::map<std::string, std::pair<std::string, float>> block_choice;
  for (size_t i = 0; i < can.size(); ++i) {
    if (!can[i]) continue;
    const ViewBlock& b = dense->blocks[i];
    const std::vector<Candidate> cands = {{kBlockWindowTactic, [] { return true; }, block_run(*windows, b, window_arena.get())},
                                          {kBlockCudnnTactic, [] { return true; }, block_run(*dense, b, dense_arena.get())}};
    const int heuristic = dense->block_windows[i].max_rows <= kWindowConvMaxRows ? 0 : 1;
    const TacticChoice c = tactics.choose(b.name, view_block_signature(dense->shaped, marked, b, split_always), cands, heuristic);
    pick[i] = c.index == 0;
    block_choice[b.name] = {cands[c.index].name, c.us};
  }
  tactics.finish();
  timed_layers += tactics.timed_layers();
  std::shared_ptr<Program> p;
  if (pick == can) {
    p = windows, chosen[batch] = window_chosen, chosen_us[batch] = window_us;
  } else if (std::count(pick.begin(), pick.end(), 1) == 0) {
    p = dense, chosen[batch] = dense_chosen, chosen_us[batch] = dense_us;
  } else {
    p = lower_program(batch, nullptr, &pick);
  }
  for (const auto& [name, c] : block_choice) {
    chosen[batch][name] = c.first;
    if (c.second >= 0.f) chosen_us[batch][name] = c.second;
  }
  return p;
}

}  // namespace kiln::cuda
