// Builds the per-batch program: one step (a few launches at most) per node,
// with tactics chosen from the bundle, by heuristics or by timing.
#include <algorithm>
#include <cstdlib>

#include "backends/cuda/cuda_program.hpp"
#include "backends/cuda/kernels.hpp"
#include "backends/cuda/se_plan.hpp"
#include "backends/cuda/window_plan.hpp"
#include "core/error.hpp"
#include "ir/attrs.hpp"
#include "runtime/views.hpp"

namespace kiln::cuda {

namespace {

constexpr const char* kDepthwiseTactic = "kiln depthwise";
// The largest conv (output pixels, n*out_h*out_w) the window-conv path is
// chosen for by default. Measured on the H200 (res2net50_26w_4s fp16, engine
// time with window convs vs cuDNN convs + split/add/concat kernels,
// bench/window_conv_threshold.sh): batch 1 (largest chunk conv 3136 pixels)
// 0.649 vs 0.748 ms, batch 2 (6272) 0.779 vs 0.833, batch 4 (12544) 1.006 vs
// 0.868, batch 32 4.0 vs 2.17: the kernel is built for latency and loses to
// cuDNN once the convs are big enough to fill the GPU.
constexpr int64_t kWindowConvMaxRows = 8192;

int max_candidates(int opt_level) { return opt_level <= 2 ? 1 : opt_level == 3 ? 4 : opt_level == 4 ? 8 : 1 << 20; }
int as_int(int64_t v) { return static_cast<int>(v); }
size_t value_bytes(const Value& v) { return static_cast<size_t>(shape_numel(v.shape)) * dtype_size(v.dtype); }

// The tactic the bundle recorded for `node` at `batch`, if it was recorded for this GPU.
std::string bundle_tactic(const CudaEngine::Impl& m, int64_t batch, const std::string& node) {
  const nlohmann::json* layers = m.recorded_layers(batch);
  if (!layers) return "";
  auto it = layers->find(node);
  if (it == layers->end() || !it->is_object()) return "";
  auto t = it->find("tactic");
  return t != it->end() && t->is_string() ? t->get<std::string>() : "";
}

// Median time (us) of one enqueue of fn over a few repeats; synchronizes.
float time_us(cudaStream_t s, const std::function<void()>& fn) {
  Event a, b;
  for (int i = 0; i < 2; ++i) fn();
  std::vector<float> t;
  for (int i = 0; i < 7; ++i) {
    KILN_CUDA_CHECK(cudaEventRecord(a.e, s));
    fn();
    KILN_CUDA_CHECK(cudaEventRecord(b.e, s));
    KILN_CUDA_CHECK(cudaEventSynchronize(b.e));
    float ms = 0;
    KILN_CUDA_CHECK(cudaEventElapsedTime(&ms, a.e, b.e));
    t.push_back(ms * 1000.f);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// The cuDNN description of a Conv2d node of `g` (pixel strides 0: dense).
ConvDesc conv_desc(const Graph& g, const Node& n, bool allow_tf32, int x_stride, int y_stride) {
  const Shape xs = g.values[n.inputs[0]].shape;
  const Shape ws = g.values[n.inputs[1]].shape;
  const ConvAttrs a = conv_attrs(n);
  ConvDesc d;
  d.dtype = g.values[n.outputs[0]].dtype;
  d.n = as_int(xs[0]), d.c = as_int(xs[1]), d.h = as_int(xs[2]), d.w = as_int(xs[3]);
  d.k = as_int(ws[0]), d.r = as_int(ws[2]), d.s = as_int(ws[3]);
  d.stride_h = a.stride_h, d.stride_w = a.stride_w, d.dil_h = a.dil_h, d.dil_w = a.dil_w, d.groups = a.groups;
  d.pad_t = a.pad_t, d.pad_l = a.pad_l, d.pad_b = a.pad_b, d.pad_r = a.pad_r;
  d.has_bias = n.inputs.size() > 2;
  d.has_residual = n.inputs.size() > 3;
  d.act = n.activation();
  d.allow_tf32 = allow_tf32;
  d.x_stride = x_stride, d.y_stride = y_stride;
  return d;
}

}  // namespace

std::shared_ptr<CudaEngine::Program> CudaEngine::Impl::build_program(int64_t batch) {
  auto p = std::make_shared<Program>();
  // What this batch runs is recorded per batch (tactics_json): the bundle
  // replays it. Timing happens only while building (opts.tune) at opt level
  // >= 3; loading takes the bundle's choice for the batch or a heuristic.
  auto& chosen = this->chosen[batch];
  auto& chosen_us = this->chosen_us[batch];
  const bool timing = opts.tune && opts.opt_level >= 3;
  p->shaped = *graph;
  Graph& g = p->shaped;
  for (int in : g.inputs) g.values[in].shape[0] = batch;
  g.infer_shapes();
  std::vector<int> alias(g.values.size(), -1);
  for (const Node& n : g.nodes)
    if (n.op == Op::Flatten) alias[n.outputs[0]] = n.inputs[0];  // NHWC [N,1,1,C] and [N,C] share bytes
  // Squeeze-excitation as se_mlp steps (se_plan.hpp); switch fuse_se off: all unfused.
  // fuse_se_mul on also applies the gate inside the step. Off by default:
  // on the H200 (efficientnet_b0 fp16) it saved 16 launches but no time at
  // batch 1 (0.407 vs 0.405 ms) and cost time at batch 32 (1.19 vs 1.08 ms):
  // its gate-times-pixels loop moves 2-byte elements, where mul_channel_nhwc
  // moves 16-byte vectors.
  std::vector<char> fused_away(g.nodes.size(), 0);
  const EngineSwitches& sw = opts.switches;
  SePlan se = sw.get(Switch::FuseSe).value_or(true)
                  ? plan_squeeze_excitation(g, sw.get(Switch::FuseSeMul).value_or(false))
                  : SePlan{};
  for (size_t i : se.fused_away) fused_away[i] = 1;
  std::map<int, int> live_until = se.live_until;
  // Channel views (runtime/views.hpp): in NHWC a channel window is a pointer
  // offset plus the root buffer's pixel stride, so Res2Net's chunk slices read
  // the 1x1 conv's output in place and its 3x3 convs (and the pass-through
  // pool) write straight into the concat. Used only when every node touching
  // a view can take strides (cuDNN convs with a fused epilogue, adds, pools,
  // slices, concats); otherwise all are copies.
  // Off unless switch cuda_views is on: measured on the H200 (res2net50_26w_4s fp16,
  // batch 1), cuDNN 9.14 runs strided convs with one extra kernel each, and the
  // engine took 0.859 ms with views (250 kernels) against 0.801 ms with a copy
  // per chunk and 0.736 ms with one split launch per block (150 kernels);
  // see families/timm_res2net/README.md.
  //
  // With kiln's window conv (window_conv.cu) the views cost no extra kernels:
  // the chunk convs read and write windows and fuse the chain adds into their
  // loads, so a Res2Net block runs as its convs. Used where every view-touching
  // conv is one that kernel takes (f16/bf16, no grouped convs) and the largest
  // of them has at most kWindowConvMaxRows output pixels: the kernel is built
  // for latency and loses to cuDNN on big problems (see the constant's note).
  // Switch window_conv off: never; on: whenever the graph allows.
  ChannelViews cv = plan_channel_views(g);
  const bool any_views = cv.slices_as_views + cv.concat_inputs_in_place > 0;
  WindowPlan wp = any_views ? plan_window_convs(g, cv) : WindowPlan{};
  const bool window_mode = any_views && wp.why_not.empty() &&
                           sw.get(Switch::WindowConv).value_or(wp.max_rows <= kWindowConvMaxRows);
  if (!window_mode) wp = WindowPlan{};
  for (const auto& [conv, add] : wp.convs) {
    if (add == kNoNode) continue;
    fused_away[add] = 1;  // the conv at index `conv` reads the add's inputs
    for (int in : g.nodes[add].inputs) live_until[in] = std::max(live_until[in], static_cast<int>(conv));
  }
  // A fused add's output is never stored: it shares its first input's bytes.
  for (size_t add : wp.fused_adds) alias[g.nodes[add].outputs[0]] = g.nodes[add].inputs[0];
  for (size_t c : wp.grouped) fused_away[c] = 1;     // run by their group's first conv
  for (size_t pn : wp.side_pools) fused_away[pn] = 1;  // run inside a conv's launch
  bool use_views = window_mode || (any_views && sw.get(Switch::CudaViews).value_or(false));
  if (window_mode)
    for (auto& [node, note] : window_plan_notes(g, cv, wp)) chosen[node] = note;  // what `kiln inspect` shows
  auto pixel_stride = [&](int v) { return as_int(g.values[cv.root(v)].shape[1]); };
  auto strided = [&](int v) { return use_views && cv.is_view(v); };
  auto stride_or_0 = [&](int v) { return strided(v) ? pixel_stride(v) : 0; };
  std::map<size_t, std::unique_ptr<ConvOp>> view_convs;  // conv node -> its strided op, built once
  for (size_t ni = 0; use_views && !window_mode && ni < g.nodes.size(); ++ni) {
    const Node& n = g.nodes[ni];
    bool touches = cv.is_view(n.outputs[0]);
    for (int in : n.inputs) touches |= cv.is_view(in);
    if (!touches) continue;
    if (n.op != Op::Conv2d) {
      use_views = takes_channel_views(g, n);
      continue;
    }
    if (n.inputs.size() > 3 && cv.is_view(n.inputs[3])) {
      use_views = false;
      continue;
    }
    const ConvDesc d = conv_desc(g, n, opts.allow_tf32, cv.is_view(n.inputs[0]) ? pixel_stride(n.inputs[0]) : 0,
                                 cv.is_view(n.outputs[0]) ? pixel_stride(n.outputs[0]) : 0);
    try {
      auto op = std::make_unique<ConvOp>(cudnn.h, d);
      if (!op->epilogue_fused() && (d.has_bias || d.has_residual || d.act != Activation::None)) use_views = false;
      else view_convs[ni] = std::move(op);
    } catch (const Error&) {
      use_views = false;  // cuDNN takes no strided form of this conv: copy instead
    }
  }
  if (!use_views) view_convs.clear();
  p->view_bytes.assign(g.values.size(), 0);
  if (use_views)
    for (size_t v = 0; v < g.values.size(); ++v)
      if (cv.is_view(static_cast<int>(v)))
        p->view_bytes[v] = cv.root_offset(static_cast<int>(v)) * static_cast<int64_t>(dtype_size(g.values[v].dtype));
  p->memory = plan_memory_with_views(
      g, value_bytes, [&](int v) { return alias[v] >= 0 ? alias[v] : (use_views && cv.is_view(v) ? cv.parent[v] : -1); }, 64,
      live_until);
  p->views_used = use_views ? cv.slices_as_views + cv.concat_inputs_in_place : 0;

  for (size_t k = 0; k < g.inputs.size(); ++k) {
    p->staging_in_offsets.push_back(p->staging_in_bytes);
    p->staging_in_bytes += (static_cast<size_t>(shape_numel(g.values[g.inputs[k]].shape)) * 4 + 255) / 256 * 256;
  }

  Stream tune_stream;
  DeviceBuffer tune_ws(timing ? kWorkspaceCapForTuning : 0);
  Program* prog = p.get();
  auto ptr = [prog](const Exec& x, int v) { return const_cast<void*>(prog->value_ptr(x, v)); };
  auto wptr = [this](int v) -> const void* { return weights.at(v).get(); };

  // Engine inputs: host f32 NCHW -> NHWC in the storage type. When the only
  // reader is a cast (f16/bf16 engines), the cast is folded into this copy.
  std::vector<char> folded_cast(g.nodes.size(), 0);
  for (size_t k = 0; k < g.inputs.size(); ++k) {
    const int v = g.inputs[k];
    const Shape s = g.values[v].shape;
    if (s.size() != 4) fail_input("engine input '", g.values[v].name, "' must be 4-D for the CUDA backend");
    int target = v;
    DType dt = g.values[v].dtype;
    auto readers = g.consumers(v);
    if (readers.size() == 1 && g.nodes[readers[0]].op == Op::Cast) {
      folded_cast[readers[0]] = 1;
      target = g.nodes[readers[0]].outputs[0];
      dt = g.values[target].dtype;
    }
    p->steps.push_back([k, target, dt, s, ptr](const Exec& x) {
      nchw_f32_to_nhwc(x.staging_in[k], ptr(x, target), dt, as_int(s[0]), as_int(s[1]), as_int(s[2]), as_int(s[3]), x.stream);
    });
    p->step_names.push_back(g.values[v].name + ".to_nhwc");
  }

  // Consecutive slices of one input as one launch: worth it where the copies
  // are small and launch-bound. Measured on the H200 (res2net50_26w_4s fp16):
  // batch 1 0.736 ms with one launch vs 0.801 ms with a copy per slice; batch
  // 32 2.43 vs 2.17 ms the other way round (split_channels_nhwc moves one
  // element per thread, copy_channels_nhwc 16-byte vectors). So: one launch
  // when the run moves at most kSplitFuseBytes (all of batch 1's Res2Net
  // splits, none of batch 32's); switch fuse_split off: never, on: always.
  constexpr size_t kSplitFuseBytes = size_t(1) << 20;
  const std::optional<bool> split_switch = sw.get(Switch::FuseSplit);
  const bool fuse_split = split_switch.value_or(true), split_always = split_switch.value_or(false);
  // One launch of kiln's window conv: the group led by conv `lead` (its
  // filters and biases side by side in one buffer when several), the chain
  // add fused into its load, and its side job (pass-through pool or copy).
  auto add_window_conv_step = [&](size_t lead) {
    const Node& n = g.nodes[lead];
    const std::vector<size_t>& run = wp.launches.at(lead);
    const size_t add = wp.convs.at(lead);
    const int xv = add == kNoNode ? n.inputs[0] : g.nodes[add].inputs[0], xa = add == kNoNode ? -1 : g.nodes[add].inputs[1];
    const int out = n.outputs[0];
    const DType dt = g.values[out].dtype;
    WindowConvShape ws = window_conv_shape(g, cv, n, xv, xa);
    const bool has_bias = n.inputs.size() > 2;
    const void* w = wptr(n.inputs[1]);
    const void* b = has_bias ? wptr(n.inputs[2]) : nullptr;
    if (run.size() > 1) {
      ws.groups = as_int(static_cast<int64_t>(run.size()));
      ws.x_group_step = cv.root_offset(g.nodes[run[1]].inputs[0]) - cv.root_offset(n.inputs[0]);
      ws.y_group_step = cv.root_offset(g.nodes[run[1]].outputs[0]) - cv.root_offset(out);
      auto side_by_side = [&](int input, const char* tag) -> const void* {
        const std::string key = n.name + tag;
        if (!extra.count(key)) {
          const size_t one = weights.at(g.nodes[lead].inputs[input]).size();
          DeviceBuffer buf(one * run.size());
          for (size_t k = 0; k < run.size(); ++k)
            KILN_CUDA_CHECK(cudaMemcpy(static_cast<char*>(buf.get()) + k * one, weights.at(g.nodes[run[k]].inputs[input]).get(),
                                       one, cudaMemcpyDeviceToDevice));
          extra.emplace(key, std::move(buf));
        }
        return extra.at(key).get();
      };
      w = side_by_side(1, "#window_group_w");
      if (has_bias) b = side_by_side(2, "#window_group_b");
    }
    const auto sd = wp.sides.find(lead);
    const bool has_side = sd != wp.sides.end();
    const WindowPlan::Side side = has_side ? sd->second : WindowPlan::Side{};
    const PoolShape ps = has_side ? window_side_shape(g, cv, side) : PoolShape{};
    const size_t dst_at = size_t(side.dst_at) * dtype_size(dt);
    const Activation act = n.activation();
    // Launch shape: the bundle's (recorded on this GPU), one timed for the
    // same signature already, timed now (opt level >= 3: every tile width and
    // split-K depth, on scratch buffers), or the shape heuristic.
    const std::string sig = window_conv_signature(dt, ws, xa >= 0, act);
    WindowLaunch l{};
    bool known = parse_window_tactic(bundle_tactic(*this, batch, n.name), l);
    if (!known && tuned.count(sig)) known = parse_window_tactic(tuned[sig].first, l);
    if (known && tuned.count(sig)) chosen_us[n.name] = tuned[sig].second;
    if (!known && timing) {
      ++timed_layers;
      const int64_t in_px = int64_t(ws.n) * ws.h * ws.w, out_px = int64_t(ws.n) * ws.out_h * ws.out_w;
      const size_t es = dtype_size(dt);
      DeviceBuffer xb((in_px * ws.x_stride + (ws.groups - 1) * ws.x_group_step + ws.c) * es);
      DeviceBuffer ab(xa >= 0 ? (in_px * ws.x_add_stride + ws.c) * es : 0);
      DeviceBuffer yb((out_px * ws.y_stride + (ws.groups - 1) * ws.y_group_step + ws.k) * es);
      KILN_CUDA_CHECK(cudaMemsetAsync(xb.get(), 0, xb.size(), tune_stream.s));
      KILN_CUDA_CHECK(cudaMemsetAsync(ab.get(), 0, ab.size(), tune_stream.s));
      float best = 1e30f;
      for (int nt : {1, 2, 4})
        for (int warps : {1, 2, 4, 8, 16}) {
          const float us = time_us(tune_stream.s, [&] {
            window_conv_nhwc(xb.get(), xa >= 0 ? ab.get() : nullptr, w, b, yb.get(), dt, ws, act, tune_stream.s, {},
                             {nt, warps});
          });
          if (us < best) best = us, l = {nt, warps};
        }
      tuned[sig] = {window_tactic_name(l), best};
      chosen_us[n.name] = best;
      known = true;
    }
    if (!known) l = window_conv_launch(ws);
    p->steps.push_back([=](const Exec& x) {
      WindowSide wsd;
      if (has_side) wsd.src = ptr(x, side.src), wsd.dst = static_cast<char*>(ptr(x, side.dst)) + dst_at, wsd.pool = ps;
      window_conv_nhwc(ptr(x, xv), xa >= 0 ? ptr(x, xa) : nullptr, w, b, ptr(x, out), dt, ws, act, x.stream, wsd, l);
    });
    chosen[n.name] = cat(window_tactic_name(l), run.size() > 1 ? cat(" x", run.size()) : "",
                           add == kNoNode ? "" : cat(" +", g.nodes[add].name),
                           !has_side ? "" : side.pool_node != kNoNode ? " +pass-through pool" : " +pass-through copy");
  };
  std::vector<char> split_done(g.nodes.size(), 0);
  const auto progress = [&](size_t done) {
    if (opts.tune && opts.progress) opts.progress(static_cast<int64_t>(done), static_cast<int64_t>(g.nodes.size()));
  };
  for (size_t ni = 0; ni < g.nodes.size(); ++ni) {
    progress(ni);
    const Node& n = g.nodes[ni];
    if (folded_cast[ni] || fused_away[ni] || n.op == Op::Flatten) continue;
    if (se.scale_at.count(ni)) {
      const Node& a = g.nodes[se.scale_at[ni]];
      const Node& b = g.nodes[se.scale_at[ni] + 1];
      const int pooled = a.inputs[0], xin = n.inputs[0], out = n.outputs[0];
      const void *w1 = wptr(a.inputs[1]), *b1 = wptr(a.inputs[2]), *w2 = wptr(b.inputs[1]), *b2 = wptr(b.inputs[2]);
      const Shape xs4 = g.values[xin].shape;
      const DType dt = g.values[out].dtype;
      const int batch_n = as_int(xs4[0]), c = as_int(xs4[1]), hw = as_int(xs4[2] * xs4[3]);
      const int cr = as_int(g.values[a.outputs[0]].shape[1]);
      const Activation act1 = a.activation(), act2 = b.activation();
      p->workspace_bytes = std::max(p->workspace_bytes, se_mlp_workspace_bytes(batch_n, cr));
      p->steps.push_back([=](const Exec& x) {
        se_mlp_scale(ptr(x, pooled), w1, b1, w2, b2, ptr(x, xin), ptr(x, out), dt, batch_n, hw, c, cr, act1, act2,
                     x.workspace, x.workspace_bytes, x.stream);
      });
      p->step_names.push_back(a.name + "+" + b.name + "+" + n.name);
      chosen[a.name] = chosen[b.name] = "kiln se_mlp_scale";
      continue;
    }
    if (se.mlp_at.count(ni)) {
      const Node& a = g.nodes[se.mlp_at[ni]];
      const int pooled = a.inputs[0], out = n.outputs[0];
      const void *w1 = wptr(a.inputs[1]), *b1 = wptr(a.inputs[2]), *w2 = wptr(n.inputs[1]), *b2 = wptr(n.inputs[2]);
      const DType dt = g.values[out].dtype;
      const int batch_n = as_int(g.values[pooled].shape[0]), c = as_int(g.values[pooled].shape[1]);
      const int cr = as_int(g.values[a.outputs[0]].shape[1]);
      const Activation act1 = a.activation(), act2 = n.activation();
      p->workspace_bytes = std::max(p->workspace_bytes, se_mlp_workspace_bytes(batch_n, cr));
      p->steps.push_back([=](const Exec& x) {
        se_mlp(ptr(x, pooled), w1, b1, w2, b2, ptr(x, out), dt, batch_n, c, cr, act1, act2, x.workspace, x.workspace_bytes,
               x.stream);
      });
      p->step_names.push_back(a.name + "+" + n.name);
      chosen[a.name] = chosen[n.name] = "kiln se_mlp";
      continue;
    }
    const int out = n.outputs[0];
    const Value& ov = g.values[out];
    const DType dt = ov.dtype;
    const Shape xs = g.values[n.inputs[0]].shape;
    const int64_t count = shape_numel(ov.shape);
    const int in0 = n.inputs[0];
    struct NameSteps {  // every step a node adds is labelled with the node's name
      Program* p;
      const std::string& name;
      ~NameSteps() { p->step_names.resize(p->steps.size(), name); }
    } name_steps{p.get(), n.name};
    switch (n.op) {
      case Op::Conv2d: {
        if (wp.launches.count(ni)) {
          add_window_conv_step(ni);
          break;
        }
        const ConvDesc d = conv_desc(g, n, opts.allow_tf32, stride_or_0(in0), stride_or_0(out));
        std::unique_ptr<ConvOp> op =
            view_convs.count(ni) ? std::move(view_convs.at(ni)) : std::make_unique<ConvOp>(cudnn.h, d);
        const bool conv_strided = d.x_stride != 0 || d.y_stride != 0;
        const std::string sig = cat("conv ", dtype_name(dt), " n", d.n, " c", d.c, " ", d.h, "x", d.w, " k", d.k, " ", d.r, "x",
                                    d.s, " s", d.stride_h, ",", d.stride_w, " p", d.pad_t, ",", d.pad_l, ",", d.pad_b, ",", d.pad_r,
                                    " d", d.dil_h, ",", d.dil_w, " g", d.groups, " b", d.has_bias, " r", d.has_residual, " a",
                                    activation_name(d.act), " tf32 ", d.allow_tf32, " px", d.x_stride, ",", d.y_stride);
        // Scratch for timing: a strided tensor spans its root's pixel stride.
        const size_t x_span = value_bytes(g.values[in0]) / size_t(d.c) * size_t(d.x_stride ? d.x_stride : d.c);
        const size_t y_span = value_bytes(ov) / size_t(d.k) * size_t(d.y_stride ? d.y_stride : d.k);
        std::string want = bundle_tactic(*this, batch, n.name);
        if (want.empty() && tuned.count(sig)) want = tuned[sig].first;
        bool picked = false;
        for (int t = 0; !want.empty() && t < op->tactic_count() && !picked; ++t)
          if (op->tactic_name(t) == want) picked = op->try_select(t);
        if (picked && tuned.count(sig) && tuned[sig].first == want) chosen_us[n.name] = tuned[sig].second;
        const bool depthwise = d.groups == d.c && d.k == d.c && d.c > 1 && !conv_strided;  // kiln's kernel is dense-only
        if (!picked && want != kDepthwiseTactic && timing && op->tactic_count() > 1) {
          ++timed_layers;
          DeviceBuffer xb(x_span), yb(y_span), rb(d.has_residual ? value_bytes(ov) : 0);
          KILN_CUDA_CHECK(cudaMemsetAsync(xb.get(), 0, xb.size(), tune_stream.s));
          KILN_CUDA_CHECK(cudaMemsetAsync(rb.get(), 0, rb.size(), tune_stream.s));
          int sel = op->autotune(cudnn.h, xb.get(), wptr(n.inputs[1]), d.has_bias ? wptr(n.inputs[2]) : nullptr,
                                 d.has_residual ? rb.get() : nullptr, yb.get(), tune_ws.get(), tune_ws.size(), tune_stream.s,
                                 max_candidates(opts.opt_level));
          if (op->tuned_time_us(sel) >= 0) chosen_us[n.name] = op->tuned_time_us(sel);
          tuned[sig] = {op->tactic_name(sel), op->tuned_time_us(sel)};
        }
        if (depthwise && (want == kDepthwiseTactic || (want.empty() && timing))) {
          // kiln's own depthwise kernel is a candidate next to cuDNN's selected tactic.
          const std::string key = n.name + "#tap_major";
          if (!extra.count(key)) {
            auto f = graph->values[n.inputs[1]].constant->to_f32();
            HostTensor t = HostTensor::from_f32_as(dt, {d.r * d.s, d.c}, depthwise_weights_tap_major(f.data(), d.c, d.r, d.s));
            DeviceBuffer buf(t.nbytes());
            KILN_CUDA_CHECK(cudaMemcpy(buf.get(), t.blob.data, t.nbytes(), cudaMemcpyHostToDevice));
            extra.emplace(key, std::move(buf));
          }
          const void* wt = extra.at(key).get();
          const void* b = d.has_bias ? wptr(n.inputs[2]) : nullptr;
          const DepthwiseShape dws{d.n, d.h, d.w, d.c, d.out_h(), d.out_w(), d.r, d.s, d.stride_h, d.stride_w,
                                   d.pad_t, d.pad_l, d.dil_h, d.dil_w};
          bool use_own = want == kDepthwiseTactic;
          if (!use_own) {
            ++timed_layers;
            DeviceBuffer xb(value_bytes(g.values[in0])), yb(value_bytes(ov)), rb(d.has_residual ? value_bytes(ov) : 0);
            KILN_CUDA_CHECK(cudaMemsetAsync(xb.get(), 0, xb.size(), tune_stream.s));
            KILN_CUDA_CHECK(cudaMemsetAsync(rb.get(), 0, rb.size(), tune_stream.s));
            const void* r = d.has_residual ? rb.get() : nullptr;
            ConvOp* co = op.get();
            const float own_us = time_us(tune_stream.s, [&] {
              depthwise_conv_nhwc(xb.get(), wt, b, r, yb.get(), dt, dws, d.act, tune_stream.s);
            });
            // The cuDNN plan runs its epilogue only when fused; compare like with like otherwise.
            const float cudnn_us = co->epilogue_fused() ? time_us(tune_stream.s, [&] {
              co->run(cudnn.h, xb.get(), wptr(n.inputs[1]), b, r, yb.get(), tune_ws.get(), tune_stream.s);
            }) : 1e30f;
            use_own = own_us < cudnn_us;
            if (use_own) {
              tuned[sig] = {kDepthwiseTactic, own_us};
              chosen_us[n.name] = own_us;
            }
          }
          if (use_own) {
            chosen[n.name] = kDepthwiseTactic;
            const int res = d.has_residual ? n.inputs[3] : -1;
            const Activation act = d.act;
            p->steps.push_back([=](const Exec& x) {
              depthwise_conv_nhwc(ptr(x, in0), wt, b, res >= 0 ? ptr(x, res) : nullptr, ptr(x, out), dt, dws, act, x.stream);
            });
            break;
          }
        }
        chosen[n.name] = op->tactic_name(op->selected());
        p->workspace_bytes = std::max(p->workspace_bytes, op->workspace_bytes());
        ConvOp* c = op.get();
        p->convs.push_back(std::move(op));
        const void* w = wptr(n.inputs[1]);
        const void* b = d.has_bias ? wptr(n.inputs[2]) : nullptr;
        const int res = d.has_residual ? n.inputs[3] : -1;
        if (c->epilogue_fused()) {
          p->steps.push_back([c, w, b, res, in0, out, ptr](const Exec& x) {
            c->run(x.cudnn, ptr(x, in0), w, b, res >= 0 ? ptr(x, res) : nullptr, ptr(x, out), x.workspace, x.stream);
          });
        } else {
          // cuDNN could not fuse the epilogue for this shape: bias, residual, activation as kernels.
          auto key = n.name + "#epilogue";
          if (!bn.count(key)) {
            auto bias = d.has_bias ? graph->values[n.inputs[2]].constant->to_f32() : std::vector<float>(d.k, 0.f);
            std::vector<float> ones(d.k, 1.f);
            DeviceBuffer one_b(ones.size() * 4), bias_b(bias.size() * 4);
            KILN_CUDA_CHECK(cudaMemcpy(one_b.get(), ones.data(), ones.size() * 4, cudaMemcpyHostToDevice));
            KILN_CUDA_CHECK(cudaMemcpy(bias_b.get(), bias.data(), bias.size() * 4, cudaMemcpyHostToDevice));
            bn.emplace(key, std::make_pair(std::move(one_b), std::move(bias_b)));
          }
          auto* s1 = static_cast<const float*>(bn.at(key).first.get());
          auto* s2 = static_cast<const float*>(bn.at(key).second.get());
          const Activation act = d.act;
          const int64_t rows = count / d.k;
          const int kk = d.k;
          p->steps.push_back([c, w, res, in0, out, ptr, s1, s2, act, rows, kk, dt, count](const Exec& x) {
            c->run(x.cudnn, ptr(x, in0), w, nullptr, nullptr, ptr(x, out), x.workspace, x.stream);
            batch_norm_nhwc(ptr(x, out), ptr(x, out), dt, rows, kk, s1, s2, res >= 0 ? Activation::None : act, x.stream);
            if (res >= 0) add(ptr(x, out), ptr(x, res), ptr(x, out), dt, count, act, x.stream);
          });
        }
        break;
      }
      case Op::Linear: {
        const Shape ws = g.values[n.inputs[1]].shape;
        const bool has_bias = n.inputs.size() > 2;
        auto op = std::make_unique<LinearOp>(lt.h, dt, as_int(xs[0]), as_int(ws[1]), as_int(ws[0]), has_bias, n.activation(),
                                             opts.allow_tf32);
        const void* w = wptr(n.inputs[1]);
        const void* b = has_bias ? wptr(n.inputs[2]) : nullptr;
        std::string want = bundle_tactic(*this, batch, n.name);
        int sel = -1;
        for (int t = 0; !want.empty() && t < op->tactic_count(); ++t)
          if (op->tactic_name(t) == want) sel = t;
        if (sel < 0 && timing && op->tactic_count() > 1) {
          ++timed_layers;
          DeviceBuffer xb(value_bytes(g.values[in0])), yb(value_bytes(ov));
          KILN_CUDA_CHECK(cudaMemsetAsync(xb.get(), 0, xb.size(), tune_stream.s));
          float best = 1e30f;
          const int limit = std::min(op->tactic_count(), max_candidates(opts.opt_level));
          for (int t = 0; t < limit; ++t) {
            op->select(t);
            if (op->workspace_bytes() > tune_ws.size()) continue;
            LinearOp* lo = op.get();
            float us = time_us(tune_stream.s, [&] { lo->run(xb.get(), w, b, yb.get(), tune_ws.get(), tune_ws.size(), tune_stream.s); });
            if (us < best) best = us, sel = t;
          }
          if (sel >= 0) chosen_us[n.name] = best;
        }
        op->select(std::max(sel, 0));
        chosen[n.name] = op->tactic_name(op->selected());
        p->workspace_bytes = std::max(p->workspace_bytes, op->workspace_bytes());
        LinearOp* l = op.get();
        p->linears.push_back(std::move(op));
        p->steps.push_back([l, w, b, in0, out, ptr](const Exec& x) {
          l->run(ptr(x, in0), w, b, ptr(x, out), x.workspace, x.workspace_bytes, x.stream);
        });
        break;
      }
      case Op::BatchNorm: {
        auto* s1 = static_cast<const float*>(bn.at(n.name).first.get());
        auto* s2 = static_cast<const float*>(bn.at(n.name).second.get());
        const int c = as_int(xs[1]);
        p->steps.push_back([=](const Exec& x) { batch_norm_nhwc(ptr(x, in0), ptr(x, out), dt, count / c, c, s1, s2, Activation::None, x.stream); });
        break;
      }
      case Op::Activation: {
        const Activation a = n.activation();
        p->steps.push_back([=](const Exec& x) { activation(ptr(x, in0), ptr(x, out), dt, count, a, x.stream); });
        break;
      }
      case Op::Add: {
        const Activation a = n.activation();
        const int in1 = n.inputs[1];
        if (strided(in0) || strided(in1) || strided(out)) {
          const int c = as_int(ov.shape[1]);
          const int sa = strided(in0) ? pixel_stride(in0) : c, sb = strided(in1) ? pixel_stride(in1) : c;
          const int sy = strided(out) ? pixel_stride(out) : c;
          const int64_t rows = count / c;
          p->steps.push_back([=](const Exec& x) {
            add_strided_nhwc(ptr(x, in0), sa, ptr(x, in1), sb, ptr(x, out), sy, rows, c, dt, a, x.stream);
          });
          break;
        }
        p->steps.push_back([=](const Exec& x) { add(ptr(x, in0), ptr(x, in1), ptr(x, out), dt, count, a, x.stream); });
        break;
      }
      case Op::Mul: {
        if (g.values[n.inputs[1]].shape == xs) fail_input(n.name, ": elementwise mul of equal shapes is not in the CUDA backend yet");
        const int in1 = n.inputs[1];
        p->steps.push_back([=](const Exec& x) {
          mul_channel_nhwc(ptr(x, in0), ptr(x, in1), ptr(x, out), dt, as_int(xs[0]), as_int(xs[2] * xs[3]), as_int(xs[1]), x.stream);
        });
        break;
      }
      case Op::MaxPool2d:
      case Op::AvgPool2d: {
        const PoolAttrs a = pool_attrs(n);
        PoolShape s{as_int(xs[0]), as_int(xs[2]), as_int(xs[3]), as_int(xs[1]), as_int(ov.shape[2]), as_int(ov.shape[3]),
                    a.kh, a.kw, a.stride_h, a.stride_w, a.pad_t, a.pad_l, a.count_include_pad, a.pad_b, a.pad_r};
        s.x_stride = stride_or_0(in0), s.y_stride = stride_or_0(out);
        const bool is_max = n.op == Op::MaxPool2d;
        p->steps.push_back([=](const Exec& x) {
          if (is_max) max_pool_nhwc(ptr(x, in0), ptr(x, out), dt, s, x.stream);
          else avg_pool_nhwc(ptr(x, in0), ptr(x, out), dt, s, x.stream);
        });
        break;
      }
      case Op::GlobalAvgPool:
        p->steps.push_back([=](const Exec& x) {
          global_avg_pool_nhwc(ptr(x, in0), ptr(x, out), dt, as_int(xs[0]), as_int(xs[2] * xs[3]), as_int(xs[1]), x.stream);
        });
        break;
      case Op::Cast: {
        const DType from = g.values[in0].dtype;
        p->steps.push_back([=](const Exec& x) { cast(ptr(x, in0), from, ptr(x, out), dt, count, x.stream); });
        break;
      }
      case Op::Concat: {
        if (n.attr_int("axis") != 1 || xs.size() != 4) fail_input(n.name, ": CUDA concat supports the channel axis of 4-D tensors");
        const int64_t rows = ov.shape[0] * ov.shape[2] * ov.shape[3];
        std::vector<int> ins = n.inputs, cs;
        for (int in : ins) cs.push_back(as_int(g.values[in].shape[1]));
        if (use_views) {
          // Inputs written in place by their producers are already there; copy the others.
          const int yc = strided(out) ? pixel_stride(out) : as_int(ov.shape[1]);
          int begin = 0;
          for (size_t k = 0; k < ins.size(); ++k) {
            const int in = ins[k], ck = cs[k], xc = strided(in) ? pixel_stride(in) : ck, at = begin;
            begin += ck;
            if (cv.parent[in] == out || wp.copied_inputs.count({ni, k})) continue;  // in place, or copied by a window conv
            p->steps.push_back([=](const Exec& x) {
              copy_channels_nhwc(ptr(x, in), xc, 0, ptr(x, out), yc, at, ck, rows, dt, x.stream);
            });
          }
          break;
        }
        p->steps.push_back([=](const Exec& x) {
          std::vector<const void*> srcs;
          for (int in : ins) srcs.push_back(ptr(x, in));
          concat_channels_nhwc(srcs, cs, ptr(x, out), rows, dt, x.stream);
        });
        break;
      }
      case Op::Slice: {
        if (n.attr_int("axis") != 1 || xs.size() != 4) fail_input(n.name, ": CUDA slice supports the channel axis of 4-D tensors");
        if (strided(out)) break;  // a window of its input: nothing to copy
        const int xc = strided(in0) ? pixel_stride(in0) : as_int(xs[1]), start = as_int(n.attr_int("start"));
        const int c = as_int(ov.shape[1]);
        const int64_t rows = ov.shape[0] * ov.shape[2] * ov.shape[3];
        if (split_done[ni]) break;  // copied by the first slice of its run
        // A run of consecutive slices of the same input (Res2Net's chunks) is one launch.
        // Safe for the memory plan: the nodes in between are those slices, which read only
        // the input, and the input stays alive through the last of them.
        std::vector<size_t> run = {ni};
        for (size_t nj = ni + 1; fuse_split && nj < g.nodes.size() && run.size() < size_t(kMaxSplitOutputs); ++nj) {
          const Node& m = g.nodes[nj];
          if (m.op != Op::Slice || m.inputs[0] != in0 || m.attr_int("axis") != 1 || strided(m.outputs[0])) break;
          run.push_back(nj);
        }
        size_t run_bytes = 0;
        for (size_t nj : run) run_bytes += value_bytes(g.values[g.nodes[nj].outputs[0]]);
        if (run.size() > 1 && (split_always || run_bytes <= kSplitFuseBytes)) {
          std::vector<int> outs, begins, cs;
          for (size_t nj : run) {
            const Node& m = g.nodes[nj];
            outs.push_back(m.outputs[0]);
            begins.push_back(as_int(m.attr_int("start")));
            cs.push_back(as_int(g.values[m.outputs[0]].shape[1]));
            split_done[nj] = 1;
          }
          p->steps.push_back([=](const Exec& x) {
            std::vector<void*> ys;
            for (int o : outs) ys.push_back(ptr(x, o));
            split_channels_nhwc(ptr(x, in0), xc, ys, begins, cs, rows, dt, x.stream);
          });
          break;
        }
        p->steps.push_back([=](const Exec& x) { copy_channels_nhwc(ptr(x, in0), xc, start, ptr(x, out), c, 0, c, rows, dt, x.stream); });
        break;
      }
      case Op::Flatten:
        break;
      default: fail_input(n.name, ": the CUDA backend has no lowering for op ", op_name(n.op));
    }
  }
  KILN_CUDA_CHECK(cudaStreamSynchronize(tune_stream.s));
  progress(g.nodes.size());
  return p;
}

}  // namespace kiln::cuda
