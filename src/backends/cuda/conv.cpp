// Conv2d's CUDA lowering: cuDNN's fused conv (cudnn_conv.hpp), kiln's
// depthwise kernel (depthwise.cu), kiln's window conv (window_conv.cu),
// kiln's GEMM conv (gemm_conv.hpp) and kiln's sm90 conv (conv_sm90.hpp), the
// alternatives handed to the one tactic selector (tactics.hpp).
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <optional>
#include <set>
#include <thread>

#include "backends/cuda/conv_sm90.hpp"
#include "backends/cuda/cuda_check.hpp"
#include "backends/cuda/gemm_conv.hpp"
#include "backends/cuda/phase_counters.hpp"
#include "backends/cuda/kernels.hpp"
#include "backends/cuda/lower.hpp"
#include "core/error.hpp"
#include "ir/attrs.hpp"
#include "ir/quant_form.hpp"

namespace kiln::cuda {

namespace {

constexpr const char* kDepthwiseTactic = "kiln depthwise";
// Knob variants a conv's timing adds with switch conv_knobs (ConvDesc::knob_variants).
// 16: the first engine's kernel configs (8 samples) and split-K (1..8), and the
// second engine's first ones; each runtime-compiled variant costs a kernel compile.
constexpr int kConvKnobVariants = 16;

// Zeroed device scratch for timing, allocated on first use (most layers of a
// build take their tactic from the cache and never need it).
class Scratch {
 public:
  explicit Scratch(size_t bytes) : bytes_(bytes) {}
  void* get(cudaStream_t s) {
    if (!buf_.get() && bytes_) {
      buf_ = DeviceBuffer(bytes_);
      KILN_CUDA_CHECK(cudaMemsetAsync(buf_.get(), 0, bytes_, s));
    }
    return buf_.get();
  }

 private:
  size_t bytes_;
  DeviceBuffer buf_;
};

LayerSignature conv_signature(const ConvDesc& d) {
  LayerSignature s{"conv", d.dtype, {{d.n, d.c, d.h, d.w}, {d.k, d.c / d.groups, d.r, d.s}}, {}};
  s.attr("stride_h", d.stride_h).attr("stride_w", d.stride_w).attr("pad_t", d.pad_t).attr("pad_l", d.pad_l);
  s.attr("pad_b", d.pad_b).attr("pad_r", d.pad_r).attr("dil_h", d.dil_h).attr("dil_w", d.dil_w).attr("groups", d.groups);
  s.attr("bias", d.has_bias).attr("residual", d.has_residual).attr("act", static_cast<int64_t>(d.act));
  s.attr("tf32", d.allow_tf32).attr("x_stride", d.x_stride).attr("y_stride", d.y_stride);
  return s;
}

// One enqueue of a cuDNN conv as the program runs it: the fused graph, or
// (when cuDNN fused no epilogue for this shape) the plain conv followed by
// bias, residual and activation as kernels.
struct CudnnConvRun {
  ConvOp* op;
  const void *w, *bias;
  const float *one, *shift;  // unfused epilogue: per-channel 1 and bias, f32
  Activation act;
  DType dt;
  int64_t count;
  int k;
  void operator()(cudnnHandle_t h, const void* x, const void* r, void* y, void* ws, cudaStream_t s) const {
    if (op->epilogue_fused()) return op->run(h, x, w, bias, r, y, ws, s);
    op->run(h, x, w, nullptr, nullptr, y, ws, s);
    batch_norm_nhwc(y, y, dt, count / k, k, one, shift, r ? Activation::None : act, s);
    if (r) add(y, r, y, dt, count, act, s);
  }
};

// Per-channel (1, bias) in f32 for the unfused epilogue of node n.
std::pair<const float*, const float*> unfused_epilogue(Lowering& L, const Node& n, const ConvDesc& d) {
  auto& bn = L.m.bn;
  const std::string key = n.name + "#epilogue";
  if (!bn.count(key)) {
    auto bias = d.has_bias ? L.g.values[n.inputs[2]].constant->to_f32() : std::vector<float>(d.k, 0.f);
    std::vector<float> ones(d.k, 1.f);
    DeviceBuffer one_b(ones.size() * 4), bias_b(bias.size() * 4);
    KILN_CUDA_CHECK(cudaMemcpy(one_b.get(), ones.data(), ones.size() * 4, cudaMemcpyHostToDevice));
    KILN_CUDA_CHECK(cudaMemcpy(bias_b.get(), bias.data(), bias.size() * 4, cudaMemcpyHostToDevice));
    bn.emplace(key, std::make_pair(std::move(one_b), std::move(bias_b)));
  }
  return {static_cast<const float*>(bn.at(key).first.get()), static_cast<const float*>(bn.at(key).second.get())};
}

// d as kiln's own dense convs (igemm_conv, conv_sm90) see it.
IgemmConvShape dense_conv_shape(const ConvDesc& d) {
  return {d.n,       d.h,        d.w,        d.c,     d.k,     d.r,     d.s,     d.out_h(), d.out_w(),
          d.stride_h, d.stride_w, d.pad_t, d.pad_l, d.dil_h, d.dil_w, d.x_stride, d.y_stride};
}

// The implicit-GEMM conv's view of d, when switch igemm_conv is on and the
// kernel takes d (dense groups-1 f16/bf16, channels multiples of 8).
std::optional<IgemmConvShape> igemm_shape(const ConvDesc& d, const EngineSwitches& sw) {
  if (!sw.get(Switch::IgemmConv).value_or(false) || d.groups != 1) return std::nullopt;
  const IgemmConvShape s = dense_conv_shape(d);
  if (!igemm_conv_unsupported(d.dtype, s, IgemmTile{}).empty()) return std::nullopt;
  return s;
}

// kiln's sm90 conv (switch sm90_conv, auto: off until measured on a GPU): the
// configurations that take d, each a candidate timed beside cuDNN's engines.
std::vector<int> sm90_conv_candidates(const ConvDesc& d, const EngineSwitches& sw) {
  std::vector<int> out;
  // Dense x and y only: a channel window's start need not be 16-byte aligned, which TMA requires.
  if (!sw.get(Switch::Sm90Conv).value_or(false) || d.groups != 1 || d.x_stride || d.y_stride) return out;
  const IgemmConvShape s = dense_conv_shape(d);
  for (int cfg = 0; cfg < conv_sm90_configs(); ++cfg)
    if (conv_sm90_unsupported(cfg, d.dtype, s, d.has_residual, d.act).empty()) out.push_back(cfg);
  return out;
}

// Why kiln's direct conv does not take d ("" when it does: a dense groups-1
// f16/bf16 conv with at most 4 input channels, an RGB stem).
std::string direct_conv_refusal(const ConvDesc& d, bool view_conv) {
  if (view_conv) return "a channel-view conv";
  if (d.groups != 1) return cat("groups ", d.groups);
  return direct_conv_unsupported(d.dtype, dense_conv_shape(d));  // refuses pixel strides itself
}

// The program step of conv n as one of kiln's own conv kernels, named `name`:
// run(x, w, bias, residual, y, stream), bias and residual null where n has none.
template <typename Run>
void own_conv_step(Lowering& L, const Node& n, const ConvDesc& d, const std::string& name, Run run) {
  const void* w = L.weight(n.inputs[1]);
  const void* b = d.has_bias ? L.weight(n.inputs[2]) : nullptr;
  const int in0 = n.inputs[0], out = n.outputs[0], res = d.has_residual ? n.inputs[3] : -1;
  const ValuePtr ptr = L.ptr;
  L.step(name, [=](const Exec& x) { run(ptr(x, in0), w, b, res >= 0 ? ptr(x, res) : nullptr, ptr(x, out), x.stream); });
}

void direct_conv_step(Lowering& L, const Node& n, const ConvDesc& d) {
  own_conv_step(L, n, d, kDirectConvTactic,
                [s = dense_conv_shape(d), dt = d.dtype, act = d.act](const void* x, const void* w, const void* b,
                                                                      const void* r, void* y, cudaStream_t st) {
                  direct_conv_nhwc(x, w, b, r, y, dt, s, act, st);
                });
}

// The step index of engine input k's NHWC conversion, or -1.
int input_step(const Lowering& L, int k) {
  const std::string name = L.g.values[L.g.inputs[size_t(k)]].name + ".to_nhwc";
  for (size_t j = 0; j < L.p.steps.size(); ++j)
    if (L.p.step_nodes[j] == -1 && L.p.step_names[j] == name) return static_cast<int>(j);
  return -1;
}

// The engine input conv n can read as NCHW f32 itself (the direct conv's NCHW
// form): n's input is engine input k's NHWC conversion (the folded cast) and
// n is its only reader. -1 when not (also under channel views and window
// convs, whose block timing runs steps without the engine's inputs).
int nchw_engine_input(const Lowering& L, const Node& n) {
  const Graph& g = L.g;
  const int x = n.inputs[0], c = g.values[x].producer;
  if (L.f.use_views || L.f.window_mode || c < 0 || !L.f.folded_cast[size_t(c)] || g.is_graph_output(x) ||
      g.consumers(x).size() != 1)
    return -1;
  const int v = g.nodes[size_t(c)].inputs[0];
  if (g.values[v].dtype != DType::F32 || g.values[v].shape != g.values[x].shape || !stored_nhwc(g.values[v])) return -1;
  for (size_t k = 0; k < g.inputs.size(); ++k)
    if (g.inputs[k] == v) return input_step(L, int(k)) >= 0 ? int(k) : -1;
  return -1;
}

// Conv n as the direct conv's NCHW form on engine input k: its step reads the
// input's f32 staging itself, and the input's conversion step is dropped.
void direct_conv_nchw_step(Lowering& L, const Node& n, const ConvDesc& d, int k) {
  const int j = input_step(L, k);
  if (j < 0) fail_runtime("conv ", n.name, ": engine input ", k, " has no conversion step to fold");
  CudaEngine::Program& p = L.p;
  p.steps.erase(p.steps.begin() + j), p.step_names.erase(p.step_names.begin() + j);
  p.step_nodes.erase(p.step_nodes.begin() + j), p.step_kernels.erase(p.step_kernels.begin() + j);
  const void* w = L.weight(n.inputs[1]);
  const void* b = d.has_bias ? L.weight(n.inputs[2]) : nullptr;
  const int out = n.outputs[0], res = d.has_residual ? n.inputs[3] : -1;
  const ValuePtr ptr = L.ptr;
  L.step(kDirectConvNchwTactic, [=, s = dense_conv_shape(d), dt = d.dtype, act = d.act](const Exec& x) {
    direct_conv_nchw_f32(x.staging_in[size_t(k)], w, b, res >= 0 ? ptr(x, res) : nullptr, ptr(x, out), dt, s, act, x.stream);
  });
}

// Engines launch the sm90 conv without PDL (its wait and trigger are then
// no-ops and it starts after its predecessor ends). Session 30 suspected PDL
// when an r18vd fixture engine running every conv on it gave different bits
// from call to call (Fixtures/CudaRtDetr.Sm90ConvRunsTheConvsTheCacheNames);
// session 31's H200 run failed the same way without it, so PDL was not the
// cause (unknown; docs/cuda-backend.md "sm90 conv"). Kept off: the safer launch.
constexpr bool kSm90ConvPdl = false;

void sm90_conv_step(Lowering& L, const Node& n, const ConvDesc& d, int cfg) {
  own_conv_step(L, n, d, conv_sm90_config_name(cfg),
                [cfg, s = dense_conv_shape(d), dt = d.dtype, act = d.act](const void* x, const void* w, const void* b,
                                                                          const void* r, void* y, cudaStream_t st) {
                  conv_sm90_nhwc(cfg, x, w, b, r, y, dt, s, act, kSm90ConvPdl, st);
                });
}

// A recorded plan replays exactly or not at all: a record naming one of kiln's
// own convs that cannot run here fails the load, naming the conv.
[[noreturn]] void fail_recorded(const Node& n, const std::string& recorded, const std::string& why) {
  fail_input("conv ", n.name, ": the bundle records tactic '", recorded, "' but ", why, "; rebuild the bundle");
}

// Loading a conv recorded with kiln's direct conv: replayed exactly or an error naming the conv;
// false when the record names another tactic.
bool lower_recorded_direct_conv(Lowering& L, const Node& n, const ConvDesc& d, const std::string& recorded, bool view_conv) {
  const std::string name = recorded_tactic_name(recorded);
  if (name != kDirectConvTactic && name != kDirectConvNchwTactic) return false;
  if (!L.m.opts.switches.get(Switch::DirectConv).value_or(false)) fail_recorded(n, recorded, "switch direct_conv is off");
  if (const std::string why = direct_conv_refusal(d, view_conv); !why.empty())
    fail_recorded(n, recorded, "kiln's direct conv does not take " + why);
  L.record(n.name, name, -1.f);
  if (name == kDirectConvTactic) return direct_conv_step(L, n, d), true;
  const int k = nchw_engine_input(L, n);
  if (k < 0) fail_recorded(n, recorded, "its input is not an engine input only it reads");
  direct_conv_nchw_step(L, n, d, k);
  return true;
}

// Loading a conv recorded with an sm90 conv configuration: replayed exactly
// (no cuDNN plan built) or an error naming the conv; false when the record
// names no sm90 conv.
bool lower_recorded_sm90_conv(Lowering& L, const Node& n, const ConvDesc& d, const std::string& recorded, bool view_conv) {
  const std::string name = recorded_tactic_name(recorded);
  if (name.rfind("kiln sm90 conv ", 0) != 0) return false;
  const auto fail = [&](const std::string& why) { fail_recorded(n, recorded, why); };
  if (!L.m.opts.switches.get(Switch::Sm90Conv).value_or(false)) fail("switch sm90_conv is off");
  const int cfg = conv_sm90_config_of(name);
  if (cfg < 0) fail(cat("this kiln has no such configuration (", conv_sm90_configs(), " built)"));
  if (view_conv || d.groups != 1 || d.x_stride || d.y_stride) fail("the conv is not a dense groups-1 conv here");
  if (const std::string why = conv_sm90_unsupported(cfg, d.dtype, dense_conv_shape(d), d.has_residual, d.act); !why.empty())
    fail("the configuration does not take it: " + why);
  L.record(n.name, name, -1.f);
  sm90_conv_step(L, n, d, cfg);
  return true;
}

// "kiln igemm 64x64 s2" / "kiln igemm halo 8x16 n64" -> its tile; nullopt for any other tactic name.
std::optional<IgemmTile> parse_igemm_tile(const std::string& name) {
  IgemmTile t;
  char tail = 0;
  int tw = 0;
  t.persist = name.rfind("kiln igemm halo persistent ", 0) == 0;
  const char* halo = t.persist ? "kiln igemm halo persistent %dx%d n%d%c" : "kiln igemm halo %dx%d n%d%c";
  if (std::sscanf(name.c_str(), halo, &t.th, &tw, &t.bn, &tail) == 3) {
    if (t.th < 1 || tw < 1 || t.th > 1024 || tw > 1024) return std::nullopt;
    t.bm = t.th * tw;
  } else if (t.th = 0; std::sscanf(name.c_str(), "kiln igemm %dx%d s%d%c", &t.bm, &t.bn, &t.splits, &tail) != 3) {
    return std::nullopt;
  }
  return igemm_tile_name(t) == name ? std::optional<IgemmTile>(t) : std::nullopt;
}

// The tiles to time for s, plus the bundle's recorded tile when the list
// (which depends on the GPU's multiprocessor count) lacks it.
std::vector<IgemmTile> igemm_candidates(const IgemmConvShape& s, DType dt, const std::string& recorded) {
  std::vector<IgemmTile> out;
  for (const IgemmTile& t : igemm_conv_tiles(s))
    if (igemm_conv_unsupported(dt, s, t).empty()) out.push_back(t);
  if (const std::optional<IgemmTile> r = parse_igemm_tile(recorded_tactic_name(recorded));
      r && igemm_conv_unsupported(dt, s, *r).empty() &&
      std::none_of(out.begin(), out.end(), [&](const IgemmTile& t) { return igemm_tile_name(t) == igemm_tile_name(*r); }))
    out.push_back(*r);
  return out;
}

// The GEMM conv's candidates (im2col + cuBLASLt): each algorithm of cuBLASLt's
// heuristic, timed on the layer's scratch buffers (rb null: no residual).
void add_gemm_conv_candidates(std::vector<Candidate>& cands, GemmConvOp* op, const void* w, const void* b, Scratch& xb,
                              Scratch& yb, Scratch* rb) {
  for (int t = 0; t < op->tactic_count(); ++t) {
    Candidate own{op->tactic_name(t), [op, t] { return op->select(t), true; },
                  [op, w, b, &xb, &yb, rb](cudaStream_t s, void* ws, size_t cap) {
                    if (op->workspace_bytes() > cap) return false;
                    op->run(xb.get(s), w, b, rb ? rb->get(s) : nullptr, yb.get(s), ws, cap, s);
                    return true;
                  }};
    own.always_time = true;  // not counted against the opt level's candidates, like kiln's other convs
    cands.push_back(std::move(own));
  }
}

// The program step of conv n as kiln's implicit-GEMM conv with tile t.
void igemm_step(Lowering& L, const Node& n, const IgemmConvShape& s, const IgemmTile& t) {
  const void* w = L.weight(n.inputs[1]);
  const void* b = n.inputs.size() > 2 ? L.weight(n.inputs[2]) : nullptr;
  const int in0 = n.inputs[0], out = n.outputs[0], res = n.inputs.size() > 3 ? n.inputs[3] : -1;
  const DType dt = L.g.values[out].dtype;
  const Activation act = n.activation();
  const ValuePtr ptr = L.ptr;
  L.step(igemm_tile_name(t), [=](const Exec& x) {
    igemm_conv_nhwc(ptr(x, in0), w, b, res >= 0 ? ptr(x, res) : nullptr, ptr(x, out), dt, s, act, t, x.stream);
  });
}

}  // namespace

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

// The key lower_Conv2d shares a loaded conv's op under.
std::string shared_conv_key(const ConvDesc& d, const std::string& tactic) { return conv_signature(d).str() + " | " + tactic; }

void prebuild_recorded_convs(Lowering& L) {
  struct Job {
    ConvDesc d;
    std::string key, tactic;
    std::unique_ptr<ConvOp> op;
  };
  std::vector<Job> jobs;
  std::set<std::string> seen;
  for (size_t ni = 0; ni < L.g.nodes.size(); ++ni) {
    const Node& n = L.g.nodes[ni];
    if (n.op != Op::Conv2d || L.f.fused_away[ni] || L.f.wp.launches.count(ni) || L.f.view_convs.count(ni) ||
        L.f.se.mlp_at.count(ni) || (!L.f.reference.empty() && L.f.reference[ni]) || is_quantized_layer(L.g, n))
      continue;
    std::string tactic = L.m.recorded_tactic(L.batch, n.name);
    if (!parse_engine_tag(tactic)) continue;  // kiln's own kernel, or nothing recorded
    const ConvDesc d = conv_desc(L.g, n, L.m.opts.allow_tf32, L.stride_or_0(n.inputs[0]), L.stride_or_0(n.outputs[0]));
    std::string key = shared_conv_key(d, tactic);
    if (seen.insert(key).second) jobs.push_back({d, std::move(key), std::move(tactic), nullptr});
  }
  if (jobs.empty()) return;
  // Plan builds are host work (runtime-compiled engines compile kernels
  // here): ~10-15 ms per conv on the H200's host, so resnet50 took ~0.7 s
  // for one batch size on one thread. cuDNN allows concurrent calls on
  // different handles; each worker has its own, kept with the program (an
  // op graph refers to the handle it was built with), and the ops run on
  // the context's handle like every other op.
  const size_t workers = std::min<size_t>(jobs.size(), std::clamp<unsigned>(std::thread::hardware_concurrency(), 1, 8));
  std::atomic<size_t> next{0};
  std::vector<PhaseCounters> counted(workers);
  std::vector<std::unique_ptr<CudnnHandle>> handles(workers);
  int device = 0;
  KILN_CUDA_CHECK(cudaGetDevice(&device));
  auto work = [&](size_t w) {
    try {
      KILN_CUDA_CHECK(cudaSetDevice(device));
      handles[w] = std::make_unique<CudnnHandle>();
    } catch (...) {  // nothing may leave a worker thread
      return;        // no handle: lower_Conv2d builds these ops itself
    }
    const PhaseCounters before = phase_counters();
    for (size_t j = next++; j < jobs.size(); j = next++) {
      try {
        jobs[j].op = std::make_unique<ConvOp>(handles[w]->h, jobs[j].d, jobs[j].tactic);
      } catch (...) {
        // lower_Conv2d builds it again and reports the error naming the layer.
      }
    }
    counted[w] = phase_counters() - before;
  };
  std::vector<std::thread> threads;
  for (size_t w = 1; w < workers; ++w) threads.emplace_back(work, w);
  work(0);
  for (auto& t : threads) t.join();
  // The workers' phase times join this thread's (summed over threads: they can exceed the wall time).
  for (size_t w = 1; w < workers; ++w) phase_counters() += counted[w];
  for (auto& h : handles)
    if (h) L.p.build_handles.push_back(std::move(h));
  for (Job& j : jobs)
    if (j.op) L.p.shared_convs[j.key] = L.p.convs.emplace_back(std::move(j.op)).get();
}

void lower_Conv2d(Lowering& L, size_t ni) {
  if (is_quantized_layer(L.g, L.g.nodes[ni])) return lower_quantized_conv(L, ni);
  if (L.f.wp.launches.count(ni)) return lower_window_conv(L, ni);
  const Graph& g = L.g;
  const Node& n = g.nodes[ni];
  const int in0 = n.inputs[0], out = n.outputs[0];
  const Value& ov = g.values[out];
  const DType dt = ov.dtype;
  ConvDesc d = conv_desc(g, n, L.m.opts.allow_tf32, L.stride_or_0(in0), L.stride_or_0(out));
  const std::string recorded = L.m.recorded_tactic(L.batch, n.name);
  // conv_knobs: on by default up to batch 4, where cuDNN's heuristic tiles leave SMs idle
  // (r18vd batch 1: 0.690 -> 0.652 ms on the H100; no gain at batch 8 in the probe).
  // (A view block's conv arrives with its op built by the block timing: no variants there.)
  if (recorded.empty() && L.tactics.timing() && !L.f.view_convs.count(ni) &&
      L.m.opts.switches.get(Switch::ConvKnobs).value_or(L.batch <= 4))
    d.knob_variants = kConvKnobVariants;
  const std::optional<IgemmConvShape> igs = igemm_shape(d, L.m.opts.switches);
  // Loading a conv recorded with one of kiln's implicit-GEMM tiles: no cuDNN plan to build.
  if (const std::optional<IgemmTile> t = parse_igemm_tile(recorded_tactic_name(recorded));
      t && igs && !L.f.view_convs.count(ni) && igemm_conv_unsupported(dt, *igs, *t).empty()) {
    L.record(n.name, igemm_tile_name(*t), -1.f);
    return igemm_step(L, n, *igs, *t);
  }
  // Loading a conv recorded with the GEMM conv or the sm90 conv (replayed exactly, or an error naming it): no cuDNN plan.
  if (lower_recorded_gemm_conv(L, n, d, recorded)) return;
  if (lower_recorded_sm90_conv(L, n, d, recorded, L.f.view_convs.count(ni) > 0)) return;
  const bool view_conv = L.f.view_convs.count(ni) > 0;
  if (lower_recorded_direct_conv(L, n, d, recorded, view_conv)) return;
  // kiln's direct conv (switch direct_conv): a candidate where it takes the conv.
  const bool direct = L.m.opts.switches.get(Switch::DirectConv).value_or(false) && direct_conv_refusal(d, view_conv).empty();
  ConvOp* op = nullptr;
  if (L.f.view_convs.count(ni)) {
    op = L.p.convs.emplace_back(std::move(L.f.view_convs.at(ni))).get();
  } else if (!recorded.empty()) {
    // Loading: layers of one shape with one recorded tactic share one cuDNN
    // plan (a plan holds no tensor addresses; each step passes its own), so
    // resnet50's repeated blocks build 24 plans for 53 convs. Building, each layer
    // keeps its own op: its tactics are timed and selected one layer at a time.
    ConvOp*& shared = L.p.shared_convs[shared_conv_key(d, recorded)];
    if (!shared) shared = L.p.convs.emplace_back(std::make_unique<ConvOp>(L.m.cudnn.h, d, recorded)).get();
    op = shared;
  } else {
    op = L.p.convs.emplace_back(std::make_unique<ConvOp>(L.m.cudnn.h, d)).get();
  }
  const void* w = L.weight(n.inputs[1]);
  const void* b = d.has_bias ? L.weight(n.inputs[2]) : nullptr;
  const int res = d.has_residual ? n.inputs[3] : -1;
  const int64_t count = shape_numel(ov.shape);
  auto [one, shift] = op->epilogue_fused() ? std::pair<const float*, const float*>{} : unfused_epilogue(L, n, d);
  const CudnnConvRun conv{op, w, b, one, shift, d.act, dt, count, d.k};

  // Scratch for timing: a strided tensor spans its root's pixel stride.
  Scratch xb(value_bytes(g.values[in0]) / size_t(d.c) * size_t(d.x_stride ? d.x_stride : d.c));
  Scratch yb(value_bytes(ov) / size_t(d.k) * size_t(d.y_stride ? d.y_stride : d.k));
  Scratch rb(d.has_residual ? value_bytes(ov) : 0);
  cudnnHandle_t h = L.m.cudnn.h;
  bool own_kernel = false, igemm = false;
  std::vector<Candidate> cands;
  for (int t = 0; t < op->tactic_count(); ++t) {
    cands.push_back({op->tactic_name(t), [op, t, &own_kernel] { return own_kernel = false, op->try_select(t); },
                     [&, op](cudaStream_t s, void* ws, size_t cap) {
                       if (op->workspace_bytes() > cap) return false;
                       conv(h, xb.get(s), rb.get(s), yb.get(s), ws, s);
                       return true;
                     }});
    cands.back().always_time = op->tactic_is_variant(t);  // switch conv_knobs: past the opt level's count
  }
  const int heuristic = op->selected();
  // kiln's own depthwise kernel (dense tensors only) is a candidate next to cuDNN's.
  const bool depthwise = d.groups == d.c && d.k == d.c && d.c > 1 && d.x_stride == 0 && d.y_stride == 0;
  const DepthwiseShape dws{d.n, d.h, d.w, d.c, d.out_h(), d.out_w(), d.r, d.s, d.stride_h, d.stride_w,
                           d.pad_t, d.pad_l, d.dil_h, d.dil_w};
  const void* taps = nullptr;
  if (depthwise) {
    auto tap_major = [&] {
      auto f = L.g.values[n.inputs[1]].constant->to_f32();
      HostTensor t = HostTensor::from_f32_as(dt, {d.r * d.s, d.c}, depthwise_weights_tap_major(f.data(), d.c, d.r, d.s));
      DeviceBuffer buf(t.nbytes());
      KILN_CUDA_CHECK(cudaMemcpy(buf.get(), t.blob.data, t.nbytes(), cudaMemcpyHostToDevice));
      return buf;
    };
    Candidate own{kDepthwiseTactic,
                  // tap_major by value: it is local to this block, and the selector calls this after it.
                  [&, tap_major] { return taps = L.engine_buffer(n.name + "#tap_major", tap_major), igemm = false, own_kernel = true; },
                  [&](cudaStream_t s, void*, size_t) {
                    depthwise_conv_nhwc(xb.get(s), taps, b, d.has_residual ? rb.get(s) : nullptr, yb.get(s), dt, dws, d.act, s);
                    return true;
                  }};
    own.always_time = true;
    cands.push_back(std::move(own));
  }
  // kiln's implicit-GEMM conv (switch igemm_conv): every tile worth timing.
  IgemmTile tile{};
  if (igs) {
    for (const IgemmTile& t : igemm_candidates(*igs, d.dtype, recorded)) {
      Candidate own{igemm_tile_name(t), [&tile, &igemm, &own_kernel, t] { return tile = t, igemm = own_kernel = true; },
                    [&, t](cudaStream_t s, void*, size_t) {
                      igemm_conv_nhwc(xb.get(s), w, b, d.has_residual ? rb.get(s) : nullptr, yb.get(s), dt, *igs, d.act,
                                      t, s);
                      return true;
                    }};
      own.always_time = true;
      cands.push_back(std::move(own));
    }
  }
  // kiln's direct conv (few input channels: an RGB stem), always timed.
  const IgemmConvShape cs = dense_conv_shape(d);  // the direct and sm90 convs' view of d
  if (direct) {
    Candidate own{kDirectConvTactic, [] { return true; }, [&, cs](cudaStream_t s, void*, size_t) {
                    direct_conv_nhwc(xb.get(s), w, b, d.has_residual ? rb.get(s) : nullptr, yb.get(s), dt, cs, d.act, s);
                    return true;
                  }};
    own.always_time = true;
    cands.push_back(std::move(own));
  }
  // Its NCHW form where the conv reads an engine input's conversion alone: timed doing the conversion's work too.
  const int nchw_input = direct ? nchw_engine_input(L, n) : -1;
  Scratch x32(nchw_input >= 0 ? size_t(d.n) * d.c * d.h * d.w * sizeof(float) : 0);
  if (nchw_input >= 0) {
    Candidate own{kDirectConvNchwTactic, [] { return true; }, [&, cs](cudaStream_t s, void*, size_t) {
                    direct_conv_nchw_f32(static_cast<const float*>(x32.get(s)), w, b, d.has_residual ? rb.get(s) : nullptr,
                                         yb.get(s), dt, cs, d.act, s);
                    return true;
                  }};
    own.always_time = true;
    cands.push_back(std::move(own));
  }
  // kiln's sm90 conv (switch sm90_conv): every configuration that takes the conv (view convs excepted: their op
  // arrives built by the block timing). Chosen by name below.
  const std::vector<int> sm90 = L.f.view_convs.count(ni) ? std::vector<int>{} : sm90_conv_candidates(d, L.m.opts.switches);
  for (const int cfg : sm90) {
    Candidate own{conv_sm90_config_name(cfg), [] { return true; }, [&, cfg, cs](cudaStream_t s, void*, size_t) {
                    conv_sm90_nhwc(cfg, xb.get(s), w, b, d.has_residual ? rb.get(s) : nullptr, yb.get(s), dt, cs, d.act,
                                   kSm90ConvPdl, s);
                    return true;
                  }};
    own.always_time = true;
    cands.push_back(std::move(own));
  }
  // kiln's GEMM conv (switch gemm_conv; loading with a record needs none: lower_recorded_gemm_conv took a gemm_conv record).
  const std::shared_ptr<GemmConvOp> gemm = recorded.empty() ? gemm_conv_op(L, d) : nullptr;
  if (gemm) add_gemm_conv_candidates(cands, gemm.get(), w, b, xb, yb, d.has_residual ? &rb : nullptr);
  // The candidates are part of the question: a cache entry timed without kiln's tiles must not
  // answer a build that offers them (and one naming a tile is no answer without them).
  LayerSignature sig = conv_signature(d);
  if (igs) sig.attr("igemm", 1);
  if (gemm_conv_on(L, d)) sig.attr("gemm_conv", 1);
  if (!sm90.empty()) sig.attr("sm90_conv", 1);
  if (direct) sig.attr("direct_conv", nchw_input >= 0 ? 2 : 1);
  if (d.knob_variants) sig.attr("knob_variants", d.knob_variants);
  const TacticChoice c = L.tactics.choose(n.name, sig, cands, heuristic);
  L.tactics.finish();  // scratch buffers die with this function
  L.record(n.name, cands[c.index].name, c.us);
  if (gemm && parse_gemm_conv_tactic(cands[c.index].name)) return gemm_conv_step(L, n, gemm);
  if (const int cfg = conv_sm90_config_of(cands[c.index].name); cfg >= 0) return sm90_conv_step(L, n, d, cfg);
  if (cands[c.index].name == kDirectConvTactic) return direct_conv_step(L, n, d);
  if (cands[c.index].name == kDirectConvNchwTactic) return direct_conv_nchw_step(L, n, d, nchw_input);
  const ValuePtr ptr = L.ptr;
  if (own_kernel && igemm) return igemm_step(L, n, *igs, tile);
  if (own_kernel) {
    const Activation act = d.act;
    L.step(kDepthwiseTactic, [=](const Exec& x) {
      depthwise_conv_nhwc(ptr(x, in0), taps, b, res >= 0 ? ptr(x, res) : nullptr, ptr(x, out), dt, dws, act, x.stream);
    });
    return;
  }
  L.p.workspace_bytes = std::max(L.p.workspace_bytes, op->workspace_bytes());
  L.step(cat("cudnn ", op->tactic_name(op->selected()), op->epilogue_fused() ? "" : " +epilogue kernels"),
         [=](const Exec& x) {
           conv(x.cudnn, ptr(x, in0), res >= 0 ? ptr(x, res) : nullptr, ptr(x, out), x.workspace, x.stream);
         });
}

// One launch of kiln's window conv: the group led by conv `lead` (its
// filters and biases side by side in one buffer when several), the chain
// add fused into its load, and its side job (pass-through pool or copy).
void lower_window_conv(Lowering& L, size_t lead) {
  const Graph& g = L.g;
  const GraphFacts& f = L.f;
  const Node& n = g.nodes[lead];
  const std::vector<size_t>& run = f.wp.launches.at(lead);
  const size_t add = f.wp.convs.at(lead);
  const int xv = add == kNoNode ? n.inputs[0] : g.nodes[add].inputs[0], xa = add == kNoNode ? -1 : g.nodes[add].inputs[1];
  const int out = n.outputs[0];
  const DType dt = g.values[out].dtype;
  WindowConvShape ws = window_conv_shape(g, f.cv, n, xv, xa);
  const bool has_bias = n.inputs.size() > 2;
  const void* w = L.weight(n.inputs[1]);
  const void* b = has_bias ? L.weight(n.inputs[2]) : nullptr;
  if (run.size() > 1) {
    ws.groups = as_int(static_cast<int64_t>(run.size()));
    ws.x_group_step = f.cv.root_offset(g.nodes[run[1]].inputs[0]) - f.cv.root_offset(n.inputs[0]);
    ws.y_group_step = f.cv.root_offset(g.nodes[run[1]].outputs[0]) - f.cv.root_offset(out);
    auto side_by_side = [&](int input, const char* tag) -> const void* {
      return L.engine_buffer(n.name + tag, [&] {
        const size_t one = L.m.weights.at(n.inputs[input]).size();
        DeviceBuffer buf(one * run.size());
        for (size_t k = 0; k < run.size(); ++k)
          KILN_CUDA_CHECK(cudaMemcpy(static_cast<char*>(buf.get()) + k * one, L.m.weights.at(g.nodes[run[k]].inputs[input]).get(),
                                     one, cudaMemcpyDeviceToDevice));
        return buf;
      });
    };
    w = side_by_side(1, "#window_group_w");
    if (has_bias) b = side_by_side(2, "#window_group_b");
  }
  const auto sd = f.wp.sides.find(lead);
  const bool has_side = sd != f.wp.sides.end();
  const WindowPlan::Side side = has_side ? sd->second : WindowPlan::Side{};
  const PoolShape ps = has_side ? window_side_shape(g, f.cv, side) : PoolShape{};
  const size_t dst_at = size_t(side.dst_at) * dtype_size(dt);
  const Activation act = n.activation();

  // Launch shapes: every tile width and warp count, timed on scratch buffers.
  const int64_t in_px = int64_t(ws.n) * ws.h * ws.w, out_px = int64_t(ws.n) * ws.out_h * ws.out_w;
  const size_t es = dtype_size(dt);
  Scratch xb((in_px * ws.x_stride + (ws.groups - 1) * ws.x_group_step + ws.c) * es);
  Scratch ab(xa >= 0 ? (in_px * ws.x_add_stride + ws.c) * es : 0);
  Scratch yb((out_px * ws.y_stride + (ws.groups - 1) * ws.y_group_step + ws.k) * es);
  WindowLaunch l{};
  std::vector<WindowLaunch> shapes;
  for (int nt : {1, 2, 4})
    for (int warps : {1, 2, 4, 8, 16}) shapes.push_back({nt, warps});
  const WindowLaunch guess = window_conv_launch(ws);
  int heuristic = -1;
  for (size_t i = 0; i < shapes.size(); ++i)
    if (shapes[i].nt == guess.nt && shapes[i].warps == guess.warps) heuristic = static_cast<int>(i);
  if (heuristic < 0) heuristic = static_cast<int>(shapes.size()), shapes.push_back(guess);
  std::vector<Candidate> cands;
  for (const WindowLaunch& s : shapes) {
    Candidate c{window_tactic_name(s), [&l, s] { return l = s, true; }, [&, s](cudaStream_t st, void*, size_t) {
                  window_conv_nhwc(xb.get(st), xa >= 0 ? ab.get(st) : nullptr, w, b, yb.get(st), dt, ws, act, st, {}, s);
                  return true;
                }};
    c.always_time = true;  // cheap to time, and the heuristic is rough
    cands.push_back(std::move(c));
  }
  LayerSignature sig{"window conv", dt, {{ws.n, ws.h, ws.w, ws.c}, {ws.k, ws.r, ws.s}}, {}};
  sig.attr("out_h", ws.out_h).attr("out_w", ws.out_w).attr("stride_h", ws.stride_h).attr("stride_w", ws.stride_w);
  sig.attr("pad_t", ws.pad_t).attr("pad_l", ws.pad_l).attr("dil_h", ws.dil_h).attr("dil_w", ws.dil_w);
  sig.attr("groups", ws.groups).attr("add", xa >= 0).attr("x_stride", ws.x_stride).attr("x_add_stride", ws.x_add_stride);
  sig.attr("y_stride", ws.y_stride).attr("act", static_cast<int64_t>(act));
  const TacticChoice c = L.tactics.choose(n.name, sig, cands, heuristic);
  L.tactics.finish();
  const std::string note = cat(run.size() > 1 ? cat(" x", run.size()) : "", add == kNoNode ? "" : cat(" +", g.nodes[add].name),
                               !has_side ? "" : side.pool_node != kNoNode ? " +pass-through pool" : " +pass-through copy");
  L.record(n.name, cands[c.index].name + note, c.us);
  const ValuePtr ptr = L.ptr;
  L.step(cands[c.index].name + note, [=](const Exec& x) {
    WindowSide wsd;
    if (has_side) wsd.src = ptr(x, side.src), wsd.dst = static_cast<char*>(ptr(x, side.dst)) + dst_at, wsd.pool = ps;
    window_conv_nhwc(ptr(x, xv), xa >= 0 ? ptr(x, xa) : nullptr, w, b, ptr(x, out), dt, ws, act, x.stream, wsd, l);
  });
}

}  // namespace kiln::cuda
