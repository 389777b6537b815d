// ConvOp: see cudnn_conv.hpp. The cuDNN frontend headers are heavy, so they stay in
// this file behind a pimpl.
#include "backends/cuda/cudnn_conv.hpp"

#include <dlfcn.h>

#include <algorithm>
#include <cudnn_frontend.h>
#include <unordered_map>
#include <unordered_set>

#include "backends/cuda/cuda_check.hpp"
#include "backends/cuda/device_buffer.hpp"
#include "backends/cuda/phase_counters.hpp"
#include "backends/cuda/tactics.hpp"
#include "core/error.hpp"

// Built with NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING so the frontend's optional
// NVRTC engines do not make libnvrtc a link dependency; that mode resolves
// cuDNN through this handle. libcudnn is linked anyway, so dlopen just
// returns the already-loaded library.
#if defined NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING
namespace cudnn_frontend {
void* cudnn_dlhandle = dlopen("libcudnn.so.9", RTLD_NOW | RTLD_GLOBAL);
}
#endif

namespace kiln::cuda {
namespace {

namespace fe = cudnn_frontend;

// Fixed uids so the variant pack can be filled without keeping tensor handles.
constexpr int64_t kUidX = 1, kUidW = 2, kUidBias = 3, kUidResidual = 4, kUidY = 5, kUidOne = 6;
// The FP8 epilogue's operands (ConvDesc::fp8_epi); the scalars live in
// ConvOp::Impl::epi_scalars, 16 bytes apart, in kEpiScalar order.
constexpr int64_t kUidAlpha = 7, kUidResMul = 8, kUidInvOut = 9, kUidHi = 10, kUidLo = 11;
enum EpiScalar { kResMul, kInvOut, kHi, kLo, kEpiScalars };

// The frontend keeps each engine config's notes in a protected member; a
// subclass is the only way to read them without re-querying the backend.
class NotedGraph : public fe::graph::Graph {
 public:
  const std::vector<fe::NumericalNote_t>& numeric_notes_at(int64_t i) const { return plans.numeric_notes.at(i); }
  const std::vector<fe::BehaviorNote_t>& behavior_notes_at(int64_t i) const { return plans.behavior_notes.at(i); }
  // Graph::create_execution_plan with the knobs as the backend numbers them
  // (an engine tag's "_k<type>"): the frontend's own KnobType_t has no word
  // for some backend knobs (USE_TEX, LDGC ... map to NOT_SET), so a tag
  // replayed through it loses them and names another config.
  fe::error_t create_plan_backend_knobs(int64_t engine_id, const std::vector<std::pair<int64_t, int64_t>>& knobs) {
    namespace d = fe::detail;
    d::backend_descriptor engine(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
    if (engine.get_status() != CUDNN_STATUS_SUCCESS)
      return {fe::error_code_t::CUDNN_BACKEND_API_FAILED, "engine descriptor"};
    if (auto e = d::create_engine(engine, engine_id, operation_graph->get_raw_desc(), device_properties); e.is_bad()) return e;
    std::vector<d::backend_descriptor> choices;
    for (const auto& [type, value] : knobs) {
      d::backend_descriptor choice(CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR);
      const auto t = static_cast<cudnnBackendKnobType_t>(type);
      const int64_t v = value;
      if (choice.get_status() != CUDNN_STATUS_SUCCESS ||
          d::set_attribute(choice.get_ptr(), CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE, CUDNN_TYPE_KNOB_TYPE, 1, &t) != CUDNN_STATUS_SUCCESS ||
          d::set_attribute(choice.get_ptr(), CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE, CUDNN_TYPE_INT64, 1, &v) != CUDNN_STATUS_SUCCESS ||
          d::finalize(choice.get_ptr()) != CUDNN_STATUS_SUCCESS)
        return {fe::error_code_t::CUDNN_BACKEND_API_FAILED, "knob choice"};
      choices.push_back(std::move(choice));
    }
    auto config = fe::make_shared_backend_pointer(static_cast<cudnnBackendDescriptorType_t>(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR));
    if (auto e = d::create_engine_config(config, engine, choices); e.is_bad()) return e;
    plans.enqueue_engine_configs({config});
    return plans.query_properties();
  }
  // The knobs engine `engine_id` takes on this graph, as the backend numbers
  // them (the frontend's query_knobs maps some types to NOT_SET); empty when
  // the query fails.
  std::vector<KnobRange> knob_ranges(int64_t engine_id) const {
    namespace d = fe::detail;
    d::backend_descriptor engine(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
    if (engine.get_status() != CUDNN_STATUS_SUCCESS ||
        d::create_engine(engine, engine_id, operation_graph->get_raw_desc(), device_properties).is_bad())
      return {};
    std::vector<d::backend_descriptor> infos;
    std::vector<cudnnBackendDescriptor_t> raw;
    for (int i = 0; i < CUDNN_KNOB_TYPE_COUNTS; ++i) {
      infos.emplace_back(CUDNN_BACKEND_KNOB_INFO_DESCRIPTOR);
      if (infos.back().get_status() != CUDNN_STATUS_SUCCESS) return {};
      raw.push_back(infos.back().get_ptr());
    }
    int64_t count = 0;
    if (d::get_attribute(engine.get_ptr(), CUDNN_ATTR_ENGINE_KNOB_INFO, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                         CUDNN_KNOB_TYPE_COUNTS, &count, raw.data()) != CUDNN_STATUS_SUCCESS)
      return {};
    std::vector<KnobRange> out;
    for (int64_t i = 0; i < std::min<int64_t>(count, CUDNN_KNOB_TYPE_COUNTS); ++i) {
      cudnnBackendKnobType_t type;
      KnobRange k;
      int64_t n = 0;
      if (d::get_attribute(raw[i], CUDNN_ATTR_KNOB_INFO_TYPE, CUDNN_TYPE_KNOB_TYPE, 1, &n, &type) != CUDNN_STATUS_SUCCESS ||
          d::get_attribute(raw[i], CUDNN_ATTR_KNOB_INFO_MINIMUM_VALUE, CUDNN_TYPE_INT64, 1, &n, &k.min) != CUDNN_STATUS_SUCCESS ||
          d::get_attribute(raw[i], CUDNN_ATTR_KNOB_INFO_MAXIMUM_VALUE, CUDNN_TYPE_INT64, 1, &n, &k.max) != CUDNN_STATUS_SUCCESS ||
          d::get_attribute(raw[i], CUDNN_ATTR_KNOB_INFO_STRIDE, CUDNN_TYPE_INT64, 1, &n, &k.stride) != CUDNN_STATUS_SUCCESS)
        return {};
      k.type = static_cast<int64_t>(type);
      out.push_back(k);
    }
    return out;
  }
};

fe::DataType_t to_fe(DType t) {
  switch (t) {
    case DType::F32: return fe::DataType_t::FLOAT;
    case DType::F16: return fe::DataType_t::HALF;
    case DType::BF16: return fe::DataType_t::BFLOAT16;
    default: fail_runtime("cuda conv: unsupported dtype ", dtype_name(t));
  }
}

std::vector<int64_t> nhwc_strides(int64_t n, int64_t c, int64_t h, int64_t w, int64_t pixel_stride = 0) {
  (void)n;
  const int64_t p = pixel_stride > 0 ? pixel_stride : c;
  return {h * w * p, 1, w * p, p};
}

fe::DataType_t to_fe_fp8_out(DType t) { return t == DType::F8E4M3 ? fe::DataType_t::FP8_E4M3 : to_fe(t); }

// An engine config noted TENSOR_CORE (TF32) or DOWN_CONVERT_INPUTS: it rounds f32 operands.
bool rounds_f32(const std::vector<fe::NumericalNote_t>& num) {
  auto has = [&](fe::NumericalNote_t n) { return std::find(num.begin(), num.end(), n) != num.end(); };
  return has(fe::NumericalNote_t::TENSOR_CORE) || has(fe::NumericalNote_t::DOWN_CONVERT_INPUTS);
}

bool has_epilogue(const ConvDesc& d) { return d.has_bias || d.has_residual || d.act != Activation::None; }

fe::graph::Pointwise_attributes activation_attrs(Activation a) {
  auto p = fe::graph::Pointwise_attributes().set_name("act").set_compute_data_type(fe::DataType_t::FLOAT);
  switch (a) {
    case Activation::Relu: p.set_mode(fe::PointwiseMode_t::RELU_FWD); break;
    case Activation::Relu6:
      p.set_mode(fe::PointwiseMode_t::RELU_FWD).set_relu_lower_clip(0.f).set_relu_upper_clip(6.f);
      break;
    case Activation::Silu: p.set_mode(fe::PointwiseMode_t::SWISH_FWD).set_swish_beta(1.f); break;
    case Activation::Sigmoid: p.set_mode(fe::PointwiseMode_t::SIGMOID_FWD); break;
    case Activation::Gelu: p.set_mode(fe::PointwiseMode_t::GELU_FWD); break;  // cuDNN's GELU_FWD is the erf form
    case Activation::None: break;
    default: fail_unknown_activation(a, "cuda conv epilogue");
  }
  return p;
}

std::string notes_string(const std::vector<fe::NumericalNote_t>& num, const std::vector<fe::BehaviorNote_t>& beh) {
  std::string out;
  auto add = [&](const char* s) {
    if (!out.empty()) out += ',';
    out += s;
  };
  for (auto n : num) {
    switch (n) {
      case fe::NumericalNote_t::TENSOR_CORE: add("tensor_core"); break;
      case fe::NumericalNote_t::DOWN_CONVERT_INPUTS: add("down_convert"); break;
      case fe::NumericalNote_t::REDUCED_PRECISION_REDUCTION: add("reduced_precision"); break;
      case fe::NumericalNote_t::FFT: add("fft"); break;
      case fe::NumericalNote_t::NONDETERMINISTIC: add("nondeterministic"); break;
      case fe::NumericalNote_t::WINOGRAD: add("winograd"); break;
      default: break;  // the frontend pads the list with NOT_SET
    }
  }
  for (auto b : beh)
    if (b == fe::BehaviorNote_t::RUNTIME_COMPILATION) add("runtime_compiled");
  return out;
}

}  // namespace

struct ConvOp::Impl {
  enum class State { Unbuilt, Built, Failed };
  struct Tactic {
    int64_t index;  // engine-config index inside the frontend graph
    std::string name, notes;
    State state = State::Unbuilt;
    size_t workspace = 0;
    float time_us = -1.f;
    bool variant = false;  // a knob variant (add_knob_variants), not a heuristics config
  };

  ConvDesc d;
  bool fused = false;
  std::unique_ptr<NotedGraph> graph;
  std::vector<Tactic> tactics;
  int selected = -1;
  std::string last_error;
  DeviceBuffer one;     // fp8: the f32 1 the graph's pointwise multiply reads
  bool fp8_one = true;  // fp8: the graph has the multiply (else conv -> y alone, the second attempt)
  DeviceBuffer epi_scalars;  // fp8_epi: residual_mul, inv_out_scale, 448, -448 (kEpiScalar), 16 bytes apart

  // Builds the operation graph and its candidate list; false (with last_error)
  // when cuDNN rejects the pattern or offers no usable engine config.
  // A recorded `prefer` in cuDNN's tag form is first replayed by engine id
  // and knobs (make_graph_once with `tag`: no heuristics query); when that
  // gives no plan that builds, the query decides, as without a record.
  bool make_graph(cudnnHandle_t h, bool fuse);
  bool make_graph_once(cudnnHandle_t h, bool fuse, const EngineTag* tag);
  // fp8_epi's pointwise chain after the conv's f32 sum (uploads epi_scalars).
  std::shared_ptr<fe::graph::Tensor_attributes> fp8_epilogue_chain(fe::graph::Graph& gr,
                                                                   std::shared_ptr<fe::graph::Tensor_attributes> cur);
  // Builds and selects `prefer` when it is a candidate and builds, else the
  // first candidate that builds; false (graph dropped) when none does.
  bool select_first();
  bool build(int i);
  // Appends up to d.knob_variants configs to `list`: the first kVariantEngines
  // engines of the heuristics' list, each knob_varies_work knob moved through
  // knob_values one at a time (the others as the heuristic set them). A
  // variant cuDNN rejects, or one already listed, is skipped.
  void add_knob_variants(NotedGraph& gr, std::vector<Tactic>& list, std::unordered_set<std::string>& seen,
                         bool strict_f32) const;
  // Session 25's sweep (H200, bench/results/2026-12-06-session25): every winning
  // variant was one of the first two engines' (the third's best was 40 % slower).
  static constexpr size_t kVariantEngines = 2;
  std::string prefer;  // the tactic to build first (ConvOp's constructor)
};

bool ConvOp::Impl::make_graph(cudnnHandle_t h, bool fuse) {
  const std::optional<EngineTag> tag = parse_engine_tag(prefer);
  return (tag && make_graph_once(h, fuse, &*tag)) || make_graph_once(h, fuse, nullptr);
}

bool ConvOp::Impl::make_graph_once(cudnnHandle_t h, bool fuse, const EngineTag* tag) {
  namespace g = fe::graph;
  if (d.fp8_epi.on && (fuse || !fp8_one)) {
    // The bare-conv retry would write raw sums where the layer's outputs belong.
    last_error = "no cuDNN engine for the FP8 conv with its epilogue";
    return false;
  }
  const bool i8 = d.fp8 && d.code == DType::I8;
  // An i8 fprop computes and writes int32 (exact sums), not f32.
  const fe::DataType_t acc_t = i8 ? fe::DataType_t::INT32 : fe::DataType_t::FLOAT;
  const fe::DataType_t dt = i8 ? fe::DataType_t::INT32 : to_fe(d.dtype);
  auto gr = std::make_unique<NotedGraph>();
  gr->set_io_data_type(dt).set_intermediate_data_type(acc_t).set_compute_data_type(acc_t);

  const int64_t cg = d.c / d.groups, oh = d.out_h(), ow = d.out_w();
  const fe::DataType_t in_dt = !d.fp8 ? dt : i8 ? fe::DataType_t::INT8 : fe::DataType_t::FP8_E4M3;
  auto x = gr->tensor(g::Tensor_attributes()
                          .set_name("x")
                          .set_uid(kUidX)
                          .set_data_type(in_dt)
                          .set_dim({d.n, d.c, d.h, d.w})
                          .set_stride(nhwc_strides(d.n, d.c, d.h, d.w, d.x_stride)));
  // Groups are implied by the filter's channel count (c/groups), as in cuDNN's backend.
  auto w = gr->tensor(g::Tensor_attributes()
                          .set_name("w")
                          .set_uid(kUidW)
                          .set_data_type(in_dt)
                          .set_dim({d.k, cg, d.r, d.s})
                          .set_stride(nhwc_strides(d.k, cg, d.r, d.s)));
  auto conv_attrs = g::Conv_fprop_attributes()
                        .set_name("conv")
                        .set_pre_padding({d.pad_t, d.pad_l})
                        .set_post_padding({d.pad_b, d.pad_r})
                        .set_stride({d.stride_h, d.stride_w})
                        .set_dilation({d.dil_h, d.dil_w})
                        .set_compute_data_type(acc_t);
  auto cur = gr->conv_fprop(x, w, conv_attrs);
  if (fuse) {
    auto add = g::Pointwise_attributes().set_mode(fe::PointwiseMode_t::ADD).set_compute_data_type(fe::DataType_t::FLOAT);
    cur->set_data_type(fe::DataType_t::FLOAT);
    if (d.has_bias) {
      auto b = gr->tensor(g::Tensor_attributes()
                              .set_name("bias")
                              .set_uid(kUidBias)
                              .set_data_type(dt)
                              .set_dim({1, d.k, 1, 1})
                              .set_stride({d.k, 1, d.k, d.k}));
      cur = gr->pointwise(cur, b, add.set_name("bias_add"));
      cur->set_data_type(fe::DataType_t::FLOAT);
    }
    if (d.has_residual) {
      auto r = gr->tensor(g::Tensor_attributes()
                              .set_name("residual")
                              .set_uid(kUidResidual)
                              .set_data_type(dt)
                              .set_dim({d.n, d.k, oh, ow})
                              .set_stride(nhwc_strides(d.n, d.k, oh, ow)));
      cur = gr->pointwise(cur, r, add.set_name("residual_add"));
      cur->set_data_type(fe::DataType_t::FLOAT);
    }
    if (d.act != Activation::None) cur = gr->pointwise(cur, activation_attrs(d.act));
  } else if (d.fp8 && d.fp8_epi.on) {
    cur = fp8_epilogue_chain(*gr, cur);
  } else if (i8 && fp8_one) {
    cur->set_data_type(fe::DataType_t::INT32);
    cur = gr->pointwise(cur, g::Pointwise_attributes().set_name("identity").set_mode(fe::PointwiseMode_t::IDENTITY));
  } else if (d.fp8 && fp8_one) {
    cur->set_data_type(fe::DataType_t::FLOAT);
    auto one_t = gr->tensor(g::Tensor_attributes()
                                .set_name("one")
                                .set_uid(kUidOne)
                                .set_data_type(fe::DataType_t::FLOAT)
                                .set_dim({1, 1, 1, 1})
                                .set_stride({1, 1, 1, 1}));
    auto times = g::Pointwise_attributes().set_name("times_one").set_mode(fe::PointwiseMode_t::MUL);
    cur = gr->pointwise(cur, one_t, times.set_compute_data_type(fe::DataType_t::FLOAT));
  }
  cur->set_output(true)
      .set_name("y")
      .set_uid(kUidY)
      .set_data_type(d.fp8_epi.on ? to_fe_fp8_out(d.fp8_epi.out) : dt)
      .set_dim({d.n, d.k, oh, ow})
      .set_stride(nhwc_strides(d.n, d.k, oh, ow, d.y_stride));

  auto check = [&](fe::error_t e, const char* what) {
    if (e.is_good()) return true;
    last_error = std::string(what) + ": " + e.get_message();
    return false;
  };
  {
    const PhaseTimer timer(&phase_counters().cudnn_graph);
    if (!check(gr->validate(), "validate")) return false;
    if (!check(gr->build_operation_graph(h), "build_operation_graph")) return false;
    if (tag) {
      // Loading: the bundle names the engine config, so build just that one
      // (the heuristics query costs ~10-20 ms per graph). Anything short of a
      // built plan with the recorded tag falls back to the full query (make_graph).
      auto e = gr->create_plan_backend_knobs(tag->engine, tag->knobs);
      std::string name;
      if (e.is_bad() || gr->get_execution_plan_count() != 1 || gr->get_plan_name_at_index(0, name).is_bad() ||
          name != prefer) {
        last_error = "replay of " + prefer + " failed";
        return false;
      }
    } else if (!check(gr->create_execution_plans({fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK}), "create_execution_plans")) {
      return false;
    }
  }

  // f32 must stay f32: engines noted TENSOR_CORE run TF32 and DOWN_CONVERT
  // ones round the inputs, both far outside the 1e-4 accuracy f32 promises.
  // (FP8 engines are tensor-core engines with f32 output: the filter does not apply.)
  const bool strict_f32 = d.dtype == DType::F32 && !d.allow_tf32 && !d.fp8;
  std::vector<Tactic> list;
  std::unordered_set<std::string> seen;  // heuristics A and fallback overlap
  for (int64_t i = 0; i < gr->get_execution_plan_count(); ++i) {
    const auto& num = gr->numeric_notes_at(i);
    if (strict_f32 && rounds_f32(num))
      continue;
    std::string name;
    if (gr->get_plan_name_at_index(i, name).is_bad()) continue;
    if (!seen.insert(name).second) continue;
    list.push_back(Tactic{i, name, notes_string(num, gr->behavior_notes_at(i))});
  }
  if (!tag && d.knob_variants > 0) add_knob_variants(*gr, list, seen, strict_f32);
  if (list.empty()) {
    last_error = "no engine config left after filtering";
    return false;
  }
  graph = std::move(gr);
  tactics = std::move(list);
  return select_first();
}

void ConvOp::Impl::add_knob_variants(NotedGraph& gr, std::vector<Tactic>& list, std::unordered_set<std::string>& seen,
                                     bool strict_f32) const {
  std::vector<EngineTag> bases;
  for (const Tactic& t : list) {
    const std::optional<EngineTag> tag = parse_engine_tag(t.name);
    if (!tag || std::any_of(bases.begin(), bases.end(), [&](const EngineTag& b) { return b.engine == tag->engine; }))
      continue;
    bases.push_back(*tag);
    if (bases.size() == kVariantEngines) break;
  }
  int added = 0;
  for (const EngineTag& base : bases)
    for (const KnobRange& k : gr.knob_ranges(base.engine)) {
      if (!knob_varies_work(k.type)) continue;
      for (const int64_t v : knob_search_values(k, d.knob_samples)) {
        if (added >= d.knob_variants) return;
        EngineTag t = base;
        auto it = std::find_if(t.knobs.begin(), t.knobs.end(), [&](const auto& kv) { return kv.first == k.type; });
        if (it != t.knobs.end()) it->second = v;
        else t.knobs.emplace_back(k.type, v);
        if (gr.create_plan_backend_knobs(t.engine, t.knobs).is_bad()) continue;
        const int64_t i = gr.get_execution_plan_count() - 1;
        const auto& num = gr.numeric_notes_at(i);
        if (strict_f32 && rounds_f32(num))
          continue;
        std::string name;
        if (gr.get_plan_name_at_index(i, name).is_bad() || !seen.insert(name).second) continue;
        Tactic tac{i, name, notes_string(num, gr.behavior_notes_at(i))};
        tac.variant = true;
        list.push_back(std::move(tac));
        ++added;
      }
    }
}

bool ConvOp::Impl::select_first() {
  selected = -1;
  // A tactic the caller will select anyway (the bundle's record) is built
  // alone: building the heuristic default too would cost a second plan build
  // (runtime-compiled engines compile kernels) for a plan never run.
  if (!prefer.empty())
    for (int i = 0; i < static_cast<int>(tactics.size()); ++i)
      if (tactics[i].name == prefer && build(i)) {
        selected = i;
        return true;
      }
  // Default: the first candidate (heuristics order) that actually builds.
  for (int i = 0; i < static_cast<int>(tactics.size()); ++i)
    if (build(i)) {
      selected = i;
      return true;
    }
  last_error = "no engine config builds: " + last_error;
  graph.reset();
  tactics.clear();
  return false;
}

std::shared_ptr<fe::graph::Tensor_attributes> ConvOp::Impl::fp8_epilogue_chain(
    fe::graph::Graph& gr, std::shared_ptr<fe::graph::Tensor_attributes> cur) {
  namespace g = fe::graph;
  const ConvDesc::Fp8Epilogue& e = d.fp8_epi;
  const int64_t oh = d.out_h(), ow = d.out_w();
  if (!epi_scalars.get()) {
    float v[kEpiScalars * 4] = {};
    v[kResMul * 4] = e.residual_mul, v[kInvOut * 4] = e.inv_out_scale, v[kHi * 4] = 448.f, v[kLo * 4] = -448.f;
    epi_scalars = DeviceBuffer(sizeof(v));
    KILN_CUDA_CHECK(cudaMemcpy(epi_scalars.get(), v, sizeof(v), cudaMemcpyHostToDevice));
  }
  auto scalar = [&](const char* name, int64_t uid) {
    return gr.tensor(g::Tensor_attributes().set_name(name).set_uid(uid).set_data_type(fe::DataType_t::FLOAT)
                         .set_dim({1, 1, 1, 1}).set_stride({1, 1, 1, 1}));
  };
  auto per_channel = [&](const char* name, int64_t uid) {
    return gr.tensor(g::Tensor_attributes().set_name(name).set_uid(uid).set_data_type(fe::DataType_t::FLOAT)
                         .set_dim({1, d.k, 1, 1}).set_stride({d.k, 1, d.k, d.k}));
  };
  auto op = [&](const char* name, fe::PointwiseMode_t mode) {
    return g::Pointwise_attributes().set_name(name).set_mode(mode).set_compute_data_type(fe::DataType_t::FLOAT);
  };
  auto f32 = [](std::shared_ptr<g::Tensor_attributes> t) {
    t->set_data_type(fe::DataType_t::FLOAT);
    return t;
  };
  // The CPU's order (quant::LayerEpilogue::apply): sum x alpha + bias, + residual x residual_mul, act, x inv_out_scale.
  f32(cur);
  cur = f32(gr.pointwise(cur, per_channel("alpha", kUidAlpha), op("alpha_mul", fe::PointwiseMode_t::MUL)));
  if (e.bias) cur = f32(gr.pointwise(cur, per_channel("bias", kUidBias), op("bias_add", fe::PointwiseMode_t::ADD)));
  if (e.residual) {
    auto r = gr.tensor(g::Tensor_attributes().set_name("residual").set_uid(kUidResidual)
                           .set_data_type(to_fe_fp8_out(e.residual_dtype)).set_dim({d.n, d.k, oh, ow})
                           .set_stride(nhwc_strides(d.n, d.k, oh, ow)));
    if (e.residual_mul != 1.f) r = f32(gr.pointwise(r, scalar("residual_mul", kUidResMul), op("residual_mul", fe::PointwiseMode_t::MUL)));
    cur = f32(gr.pointwise(cur, r, op("residual_add", fe::PointwiseMode_t::ADD)));
  }
  if (e.act != Activation::None) cur = f32(gr.pointwise(cur, activation_attrs(e.act)));
  if (e.scale_after) cur = f32(gr.pointwise(cur, scalar("inv_out_scale", kUidInvOut), op("out_scale", fe::PointwiseMode_t::MUL)));
  if (e.out == DType::F8E4M3) {
    // Saturate as the CPU's encoder (f32_to_e4m3: finite values past 448 give +-448) whatever cuDNN's cast does.
    cur = f32(gr.pointwise(cur, scalar("hi", kUidHi), op("clamp_hi", fe::PointwiseMode_t::MIN)));
    cur = gr.pointwise(cur, scalar("lo", kUidLo), op("clamp_lo", fe::PointwiseMode_t::MAX));
  }
  return cur;
}

bool ConvOp::Impl::build(int i) {
  Tactic& t = tactics[i];
  if (t.state == State::Built) return true;
  if (t.state == State::Failed) return false;
  const PhaseTimer timer(&phase_counters().cudnn_plan_build);
  auto e = graph->build_plan_at_index(t.index);
  if (e.is_good()) {
    int64_t ws = 0;
    e = graph->get_workspace_size_plan_at_index(t.index, ws);
    t.workspace = static_cast<size_t>(ws);
  }
  if (e.is_bad()) {
    last_error = t.name + ": " + e.get_message();
    t.state = State::Failed;
    return false;
  }
  t.state = State::Built;
  return true;
}

ConvOp::ConvOp(cudnnHandle_t h, const ConvDesc& d, const std::string& prefer) : impl_(std::make_unique<Impl>()) {
  impl_->prefer = prefer;
  if (d.groups < 1 || d.c % d.groups != 0 || d.k % d.groups != 0)
    fail_runtime("cuda conv: channels ", d.c, "->", d.k, " not divisible by groups ", d.groups);
  if (d.out_h() < 1 || d.out_w() < 1) fail_runtime("cuda conv: empty output");
  if ((d.x_stride != 0 && d.x_stride < d.c) || (d.y_stride != 0 && d.y_stride < d.k))
    fail_runtime("cuda conv: pixel strides ", d.x_stride, "/", d.y_stride, " below the channel counts ", d.c, "/", d.k);
  if (d.fp8 && (has_epilogue(d) || d.groups != 1 || d.c % 16 || d.k % 16 || d.dtype != DType::F32))
    fail_runtime("cuda conv: the FP8 fprop takes groups 1, channels multiples of 16, an f32 raw output and no epilogue (got ",
                 d.c, "->", d.k, " groups ", d.groups, ")");
  impl_->d = d;
  if (d.fp8 && d.code != DType::F8E4M3 && d.code != DType::I8)
    fail_runtime("cuda conv: 8-bit fprop of ", dtype_name(d.code), " (e4m3 or i8)");
  if (d.fp8 && d.code == DType::I8 && d.fp8_epi.on) fail_runtime("cuda conv: the i8 fprop has no fused epilogue");
  if (d.fp8 && d.code == DType::F8E4M3) {
    const float one = 1.f;
    impl_->one = DeviceBuffer(sizeof(one));
    KILN_CUDA_CHECK(cudaMemcpy(impl_->one.get(), &one, sizeof(one), cudaMemcpyHostToDevice));
  }
  if (has_epilogue(d) && impl_->make_graph(h, true)) {
    impl_->fused = true;
    return;
  }
  std::string fused_error = impl_->last_error;
  if (d.fp8 && !impl_->make_graph(h, false)) {
    // No engine for conv -> x1 -> f32: try the bare conv with an f32 output.
    fused_error = std::string(d.code == DType::I8 ? "i8 conv -> identity -> i32: " : "FP8 conv -> multiply by 1 -> f32: ") +
                  impl_->last_error;
    impl_->fp8_one = false;
  }
  if (!(d.fp8 && impl_->fp8_one) && !impl_->make_graph(h, false))
    fail_runtime("cuda conv: cuDNN supports no engine for ", d.n, "x", d.c, "x", d.h, "x", d.w, " k=", d.k, " ",
                 d.r, "x", d.s, " groups=", d.groups, " ",
                 !d.fp8 ? dtype_name(d.dtype) : d.code == DType::I8 ? "i8 -> i32 (INT8 fprop)" : "e4m3 -> f32 (FP8 fprop)", ": ",
                 impl_->last_error,
                 fused_error.empty() ? "" : (d.fp8 ? " (first attempt, " : " (fused attempt: "), fused_error,
                 fused_error.empty() ? "" : ")");
}

ConvOp::~ConvOp() = default;
ConvOp::ConvOp(ConvOp&&) noexcept = default;
ConvOp& ConvOp::operator=(ConvOp&&) noexcept = default;

const ConvDesc& ConvOp::desc() const { return impl_->d; }
bool ConvOp::epilogue_fused() const { return impl_->fused || !has_epilogue(impl_->d); }
int ConvOp::tactic_count() const { return static_cast<int>(impl_->tactics.size()); }
int ConvOp::selected() const { return impl_->selected; }

static void check_index(int i, int n) {
  if (i < 0 || i >= n) fail_runtime("cuda conv: tactic ", i, " out of range [0, ", n, ")");
}

std::string ConvOp::tactic_name(int i) const {
  check_index(i, tactic_count());
  return impl_->tactics[i].name;
}

std::string ConvOp::tactic_notes(int i) const {
  check_index(i, tactic_count());
  return impl_->tactics[i].notes;
}

bool ConvOp::try_select(int i) {
  check_index(i, tactic_count());
  if (!impl_->build(i)) return false;
  impl_->selected = i;
  return true;
}

void ConvOp::select(int i) {
  if (!try_select(i)) fail_runtime("cuda conv: tactic ", i, " does not build: ", impl_->last_error);
}

size_t ConvOp::workspace_bytes() const { return impl_->tactics[impl_->selected].workspace; }

float ConvOp::tuned_time_us(int i) const {
  check_index(i, tactic_count());
  return impl_->tactics[i].time_us;
}

bool ConvOp::tactic_is_variant(int i) const {
  check_index(i, tactic_count());
  return impl_->tactics[i].variant;
}

std::string ConvOp::engine_knobs(int i) const {
  check_index(i, tactic_count());
  const std::optional<EngineTag> tag = parse_engine_tag(impl_->tactics[i].name);
  if (!tag || !impl_->graph) return "";
  std::string out;
  for (const KnobRange& k : impl_->graph->knob_ranges(tag->engine))
    out += (out.empty() ? "k" : " k") + std::to_string(k.type) + "=[" + std::to_string(k.min) + ".." +
           std::to_string(k.max) + "/" + std::to_string(k.stride) + "]";
  return out;
}

void ConvOp::run(cudnnHandle_t h, const void* x, const void* w, const void* bias, const void* residual, void* y,
                 void* workspace, cudaStream_t s) const {
  const Impl& m = *impl_;
  KILN_CUDNN_CHECK(cudnnSetStream(h, s));
  // Only uids that exist in the graph: the conv-only fallback has no bias/residual slot.
  std::unordered_map<int64_t, void*> pack{{kUidX, const_cast<void*>(x)},
                                          {kUidW, const_cast<void*>(w)},
                                          {kUidY, y}};
  if (m.fused && m.d.has_bias) pack[kUidBias] = const_cast<void*>(bias);
  if (m.fused && m.d.has_residual) pack[kUidResidual] = const_cast<void*>(residual);
  if (m.d.fp8 && m.d.code == DType::F8E4M3 && m.fp8_one) pack[kUidOne] = m.one.get();
  auto e = m.graph->execute_plan_at_index(h, pack, workspace, m.tactics[m.selected].index);
  if (e.is_bad()) fail_runtime("cuda conv: execute ", m.tactics[m.selected].name, ": ", e.get_message());
}

void ConvOp::run_fp8_fused(cudnnHandle_t h, const void* x, const void* w, const float* alpha, const float* bias,
                           const void* residual, void* y, void* workspace, cudaStream_t s) const {
  const Impl& m = *impl_;
  const ConvDesc::Fp8Epilogue& e = m.d.fp8_epi;
  if (!e.on) fail_runtime("cuda conv: run_fp8_fused on a graph without the FP8 epilogue");
  if ((e.bias && !bias) || (e.residual && !residual)) fail_runtime("cuda conv: FP8 epilogue without its bias or residual");
  KILN_CUDNN_CHECK(cudnnSetStream(h, s));
  char* sc = static_cast<char*>(const_cast<void*>(m.epi_scalars.get()));
  std::unordered_map<int64_t, void*> pack{{kUidX, const_cast<void*>(x)},
                                          {kUidW, const_cast<void*>(w)},
                                          {kUidY, y},
                                          {kUidAlpha, const_cast<float*>(alpha)}};
  if (e.bias) pack[kUidBias] = const_cast<float*>(bias);
  if (e.residual) pack[kUidResidual] = const_cast<void*>(residual);
  if (e.residual && e.residual_mul != 1.f) pack[kUidResMul] = sc + 16 * kResMul;
  if (e.scale_after) pack[kUidInvOut] = sc + 16 * kInvOut;
  if (e.out == DType::F8E4M3) pack[kUidHi] = sc + 16 * kHi, pack[kUidLo] = sc + 16 * kLo;
  auto r = m.graph->execute_plan_at_index(h, pack, workspace, m.tactics[m.selected].index);
  if (r.is_bad()) fail_runtime("cuda conv: execute ", m.tactics[m.selected].name, ": ", r.get_message());
}

int ConvOp::autotune(cudnnHandle_t h, const void* x, const void* w, const void* bias, const void* residual, void* y,
                     void* workspace, size_t ws_cap, cudaStream_t s, int max_candidates) {
  Impl& m = *impl_;
  const int original = m.selected;
  int best = -1;
  const int n = std::min(tactic_count(), std::max(1, max_candidates));
  for (int i = 0; i < n; ++i) {
    m.tactics[i].time_us = -1.f;
    if (!m.build(i) || m.tactics[i].workspace > ws_cap) continue;
    m.selected = i;
    try {
      m.tactics[i].time_us = time_enqueue_us(s, [&] { run(h, x, w, bias, residual, y, workspace, s); });
    } catch (const Error&) {
      cudaStreamSynchronize(s);
      continue;  // an engine that fails to execute is simply not a candidate
    }
    if (best < 0 || m.tactics[i].time_us < m.tactics[best].time_us) best = i;
  }
  m.selected = best >= 0 ? best : original;
  return m.selected;
}

std::vector<float> kcrs_to_krsc(const float* w, int k, int c_per_group, int r, int s) {
  std::vector<float> out(static_cast<size_t>(k) * c_per_group * r * s);
  for (int ko = 0; ko < k; ++ko)
    for (int ci = 0; ci < c_per_group; ++ci)
      for (int y = 0; y < r; ++y)
        for (int x = 0; x < s; ++x)
          out[((static_cast<size_t>(ko) * r + y) * s + x) * c_per_group + ci] =
              w[((static_cast<size_t>(ko) * c_per_group + ci) * r + y) * s + x];
  return out;
}

bool knob_varies_work(int64_t type) {
  switch (type) {
    case CUDNN_KNOB_TYPE_TILE_SIZE:
    case CUDNN_KNOB_TYPE_SPLIT_K_SLC:
    case CUDNN_KNOB_TYPE_KERNEL_CFG:
    case CUDNN_KNOB_TYPE_TILE_CGA_M:
    case CUDNN_KNOB_TYPE_TILE_CGA_N:
    case CUDNN_KNOB_TYPE_CTA_COUNT:
    case CUDNN_KNOB_TYPE_STREAM_K:
    case CUDNN_KNOB_TYPE_SPLIT_P_SLC:
    case CUDNN_KNOB_TYPE_TILE_M:
    case CUDNN_KNOB_TYPE_TILE_N: return true;
    default: return false;
  }
}

std::vector<int64_t> knob_search_values(const KnobRange& k, int samples) {
  if (k.type != CUDNN_KNOB_TYPE_SPLIT_K_SLC && k.type != CUDNN_KNOB_TYPE_SPLIT_P_SLC) return knob_values(k, samples);
  KnobRange r = k;
  r.max = std::min(k.max, kMaxKnobSplit);
  return knob_values(r, std::min(samples, 4));
}

std::vector<int64_t> knob_values(const KnobRange& k, int samples) {
  const size_t kMax = static_cast<size_t>(std::max(samples, 2));
  std::vector<int64_t> out;
  if (k.max < k.min) return out;
  const __int128 stride = std::max<int64_t>(k.stride, 1);  // 128-bit: a hostile range must not overflow
  const __int128 steps = (static_cast<__int128>(k.max) - k.min) / stride;
  if (steps < static_cast<__int128>(kMax)) {
    for (__int128 i = 0; i <= steps; ++i) out.push_back(static_cast<int64_t>(k.min + i * stride));
    return out;
  }
  out.push_back(k.min);
  for (__int128 p = 1; p < k.max && out.size() + 1 < kMax; p *= 2)
    if (p > k.min && (p - k.min) % stride == 0) out.push_back(static_cast<int64_t>(p));
  out.push_back(k.max);
  return out;
}

std::optional<EngineTag> parse_engine_tag(const std::string& tag) {
  if (tag.rfind("eng", 0) != 0) return std::nullopt;
  size_t pos = 3;
  auto number = [&](int64_t& v) {  // at most 18 digits: no overflow
    const size_t start = pos;
    int64_t x = 0;
    while (pos < tag.size() && tag[pos] >= '0' && tag[pos] <= '9' && pos - start < 18) x = x * 10 + (tag[pos++] - '0');
    v = x;
    return pos > start && (pos == tag.size() || tag[pos] < '0' || tag[pos] > '9');
  };
  EngineTag t;
  if (!number(t.engine)) return std::nullopt;
  while (pos < tag.size()) {
    int64_t type = 0, choice = 0;
    if (tag.compare(pos, 2, "_k") != 0) return std::nullopt;
    pos += 2;
    if (!number(type) || type >= CUDNN_KNOB_TYPE_COUNTS) return std::nullopt;
    if (pos >= tag.size() || tag[pos++] != '=') return std::nullopt;
    const bool negative = pos < tag.size() && tag[pos] == '-';  // knob choices may be -1
    if (negative) ++pos;
    if (!number(choice)) return std::nullopt;
    for (const auto& k : t.knobs)
      if (k.first == type) return std::nullopt;
    t.knobs.emplace_back(type, negative ? -choice : choice);
  }
  return t;
}

}  // namespace kiln::cuda
