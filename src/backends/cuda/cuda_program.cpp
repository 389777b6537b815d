// Builds the per-batch program: shapes the graph for the batch, gathers the
// facts that decide how nodes run (fusion groups, channel views, the bundle's
// recorded plan), plans memory, then lowers every node through its op's
// lowering (lower.hpp) with tactics from the one selector (tactics.hpp).
#include <algorithm>

#include "backends/cuda/lower.hpp"
#include "ir/node_select.hpp"
#include "core/error.hpp"

namespace kiln::cuda {

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

// Squeeze-excitation groups, window convs over channel views, and the values
// that share another's bytes. A bundle's recorded plan (`plan`, may be null)
// fixes the graph-wide decisions; otherwise they follow the switches and the
// measured thresholds.
void plan_fusions(const CudaEngine::Impl& m, const Graph& g, const nlohmann::json* plan, int64_t batch, GraphFacts& f) {
  const std::string where = cat("the bundle's CUDA plan for batch ", batch);
  f.fused_away.assign(g.nodes.size(), 0);
  f.folded_cast.assign(g.nodes.size(), 0);
  f.split_done.assign(g.nodes.size(), 0);
  f.alias.assign(g.values.size(), -1);
  for (const Node& n : g.nodes)
    if ((n.op == Op::Flatten && flatten_is_alias(g, n)) || (n.op == Op::Reshape && reshape_is_alias(g, n)))
      f.alias[n.outputs[0]] = n.inputs[0];  // same bytes (lower.hpp)
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
    if (plan && (plan_flag(*plan, "window_conv", where) || plan_flag(*plan, "channel_views", where)))
      fail_input(where, " uses views or window convs, which a graph with nodes on the plain reference runs without");
    return;
  }
  f.se = plan_squeeze_excitation(g, sw.get(Switch::FuseSeMul).value_or(false));  // marked blocks (switch fuse_se: the pass)
  for (size_t i : f.se.fused_away) f.fused_away[i] = 1;
  f.live_until = f.se.live_until;
  plan_deform_inputs(g, f);  // RT-DETR's value/logits reshapes read in place (ms_deform_attn.cpp)
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
  // loads, so a Res2Net block runs as its convs. Used where every view-touching
  // conv is one that kernel takes (f16/bf16, no grouped convs) and the largest
  // of them has at most kWindowConvMaxRows output pixels.
  // Switch window_conv off: never; on: whenever the graph allows.
  f.cv = plan_channel_views(g);
  const bool any_views = f.cv.slices_as_views + f.cv.concat_inputs_in_place > 0;
  if (any_views) f.wp = plan_window_convs(g, f.cv);
  const bool window_ok = any_views && f.wp.why_not.empty();
  if (plan) {
    f.window_mode = plan_flag(*plan, "window_conv", where);
    f.use_views = plan_flag(*plan, "channel_views", where);
    if (f.window_mode && !window_ok)
      fail_input(where, " runs window convs, which this graph cannot: ", any_views ? f.wp.why_not : "no channel views");
    if (f.use_views && !any_views) fail_input(where, " uses channel views, which this graph has none of");
  } else {
    f.window_mode = window_ok && sw.get(Switch::WindowConv).value_or(f.wp.max_rows <= kWindowConvMaxRows);
    f.use_views = f.window_mode || (any_views && sw.get(Switch::CudaViews).value_or(false));
  }
  if (!f.window_mode) f.wp = WindowPlan{};
  for (const auto& [conv, add] : f.wp.convs) {
    if (add == kNoNode) continue;
    f.fused_away[add] = 1;  // the conv at index `conv` reads the add's inputs
    for (int in : g.nodes[add].inputs) f.live_until[in] = std::max(f.live_until[in], static_cast<int>(conv));
  }
  // A fused add's output is never stored: it shares its first input's bytes.
  for (size_t add : f.wp.fused_adds) f.alias[g.nodes[add].outputs[0]] = g.nodes[add].inputs[0];
  for (size_t c : f.wp.grouped) f.fused_away[c] = 1;     // run by their group's first conv
  for (size_t pn : f.wp.side_pools) f.fused_away[pn] = 1;  // run inside a conv's launch
  f.split_always = sw.get(Switch::FuseSplit).value_or(false);  // marked runs (switch fuse_split off: none marked)
}

// Channel views without window convs: every conv touching a view must be a
// cuDNN conv that takes pixel strides with its epilogue fused, every other
// node one of kiln's strided kernels; otherwise views are off (copies).
// A recorded plan that asks for views where this cuDNN cannot is an error.
void plan_strided_convs(const CudaEngine::Impl& m, const Graph& g, bool recorded, GraphFacts& f) {
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
      auto op = std::make_unique<ConvOp>(m.cudnn.h, d);
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
      f.live_until);
  p.views_used = f.use_views ? f.cv.slices_as_views + f.cv.concat_inputs_in_place : 0;
  p.window_mode = f.window_mode, p.channel_views = f.use_views;
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
  return "";
}

}  // namespace

nlohmann::json CudaEngine::Program::plan_json() const {
  nlohmann::json step_list = nlohmann::json::array(), values = nlohmann::json::object();
  for (size_t i = 0; i < steps.size(); ++i) step_list.push_back({step_names[i], step_kernels[i]});
  for (size_t v = 0; v < shaped.values.size(); ++v)
    if (!shaped.values[v].constant && memory.offsets.at(v) >= 0)
      values[shaped.values[v].name] = {memory.offsets[v], view_bytes.empty() ? 0 : view_bytes[v]};
  return {{"window_conv", window_mode}, {"channel_views", channel_views}, {"arena_bytes", memory.arena_bytes},
          {"workspace_bytes", workspace_bytes}, {"steps", step_list}, {"values", values}};
}

std::shared_ptr<CudaEngine::Program> CudaEngine::Impl::build_program(int64_t batch) {
  auto p = std::make_shared<Program>();
  p->shaped = *graph;
  Graph& g = p->shaped;
  for (int in : g.inputs) g.values[in].shape[0] = batch;
  g.infer_shapes();
  // What this batch runs is recorded per batch (tactics_json) and the bundle
  // replays it: the graph-wide decisions and every tactic come from the
  // record, and the program built from them must match the recorded plan.
  // Timing happens only while building (opts.tune) at opt level >= 3.
  const nlohmann::json* plan = recorded_plan(batch);
  GraphFacts f;
  plan_fusions(*this, g, plan, batch, f);
  if (f.use_views && !f.window_mode) plan_strided_convs(*this, g, plan != nullptr, f);
  plan_program_memory(*p, g, f);
  if (f.window_mode)
    for (auto& [node, note] : window_plan_notes(g, f.cv, f.wp)) chosen[batch][node] = note;  // what `kiln inspect` shows
  TacticSelector tactics(recorded_layers(batch), &tuned, opts.tune && opts.opt_level >= 3, max_candidates(opts.opt_level));
  Lowering L{*this, *p, g, batch, f, tactics, ValuePtr{p.get()}, ""};
  lower_engine_inputs(L);
  for (size_t ni = 0; ni < g.nodes.size(); ++ni) {
    if (opts.tune && opts.progress) opts.progress(static_cast<int64_t>(ni), static_cast<int64_t>(g.nodes.size()));
    lower_node(L, ni);
  }
  tactics.finish();
  timed_layers += tactics.timed_layers();
  if (opts.tune && opts.progress) opts.progress(static_cast<int64_t>(g.nodes.size()), static_cast<int64_t>(g.nodes.size()));
  if (plan) {
    const std::string diff = plan_difference(p->plan_json(), *plan);
    if (!diff.empty())
      fail_input("the bundle's CUDA plan for batch ", batch, " is not what this kiln builds from it (", diff,
                 "); rebuild the bundle");
  }
  return p;
}

}  // namespace kiln::cuda
