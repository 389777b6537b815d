#include <cstring>

#include "core/error.hpp"
#include "ir/node_select.hpp"
#include "ir/serialize.hpp"
#include "passes/pass.hpp"
#include "runtime/engine_impl.hpp"
#include "tasks/runtime_config.hpp"

namespace kiln {

const char* version() { return KILN_VERSION; }

std::vector<std::string> parse_labels(const std::string& text, const std::string& source) {
  auto j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_array()) fail_input(source, ": expected a JSON list of strings");
  std::vector<std::string> labels;
  for (const auto& e : j) {
    if (!e.is_string()) fail_input(source, ": expected a JSON list of strings");
    labels.push_back(e.get<std::string>());
  }
  return labels;
}

namespace {

TensorInfo info_of(const Graph& g, int v) {
  return {g.values[v].name, g.values[v].shape, dtype_name(g.values[v].dtype)};
}

}  // namespace

ShapedPlan plan_for_batch(const Graph& g, int64_t batch, const EngineSwitches& switches, bool dense) {
  auto with_batch = [&g](int64_t b) {
    Graph s = g;
    for (int in : s.inputs) s.values[in].shape[0] = b;
    s.infer_shapes();
    return s;
  };
  ShapedPlan p{with_batch(batch), {}, {}, {}, {}};
  if (dense) {
    p.views.parent.assign(p.graph.values.size(), -1);
    p.views.channel_offset.assign(p.graph.values.size(), 0);
  } else {
    p.views = plan_channel_views(p.graph);
  }
  p.adds = cpu::plan_prologue_adds(p.graph, !dense);
  if (batch > 1) p.one = with_batch(1);
  // A fused add's output is never written: it borrows its first operand's bytes instead of its own.
  std::vector<int> add_alias(p.graph.values.size(), -1);
  for (size_t i = 0; i < p.graph.nodes.size(); ++i)
    if (p.adds.fused[i]) add_alias[p.graph.nodes[i].outputs[0]] = p.graph.nodes[i].inputs[0];
  p.memory = plan_memory_with_views(
      p.graph, cpu::activation_bytes, [&](int v) { return p.views.parent[v] >= 0 ? p.views.parent[v] : add_alias[v]; }, 64,
      p.adds.live_until(p.graph));
  return p;
}

Engine::Engine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Engine::~Engine() = default;

namespace {

// Everything Engine::load does after the container is validated; the
// memory and the path entry points differ only in how the Bundle is made.
std::unique_ptr<Engine::Impl> load_impl(Bundle bundle, const LoadOptions& options) {
  const std::string bundle_path = bundle.path().string();
  auto impl = std::make_unique<Engine::Impl>();
  impl->bundle = std::move(bundle);
  const Bundle& b = impl->bundle;
  const std::string src = bundle_path + ": ";
  impl->graph = deserialize_graph(b.section_text("graph.json"), b.section("weights.bin"), src + "graph.json");
  impl->runtime_text = b.section_text("runtime.json");
  validate_runtime_json(impl->runtime_text, src + "runtime.json");
  impl->labels = parse_labels(b.section_text("labels.json"), src + "labels.json");
  impl->provenance = nlohmann::json::parse(b.section_text("provenance.json"), nullptr, false);
  if (impl->provenance.is_discarded() || !impl->provenance.is_object())
    fail_input(src, "provenance.json: not a JSON object");
  impl->family = b.info().family;
  impl->task = b.info().task;
  impl->backend = options.backend.empty() ? b.info().backend : options.backend;
  const auto build = impl->provenance.value("build", nlohmann::json::object());
  if (!build.is_object()) fail_input(src, "provenance.json: 'build' must be an object");
  auto field = [&](const char* key, nlohmann::json fallback, bool ok(const nlohmann::json&), const char* want) {
    const auto it = build.find(key);
    if (it == build.end()) return fallback;
    if (!ok(*it)) fail_input(src, "provenance.json: build.", key, " must be ", want, ", got ", it->dump());
    return *it;
  };
  impl->precision = field("precision", "f32", [](const nlohmann::json& j) { return j.is_string(); }, "a string")
                        .get<std::string>();
  [[maybe_unused]] const int opt_level = field("opt_level", 3, [](const nlohmann::json& j) { return j.is_number_integer(); }, "an integer")
                            .get<int>();
  [[maybe_unused]] const bool allow_tf32 = field("allow_tf32", false, [](const nlohmann::json& j) { return j.is_boolean(); }, "true or false")
                              .get<bool>();
  impl->switches = EngineSwitches::from_json(build.value("switches", nlohmann::json()), src + "provenance.json: build");
  // Bundles from before fusion marks were recorded (no build.fusion_marks):
  // the marks their build would have set, from the switches it recorded.
  if (!build.contains("fusion_marks")) mark_fusions(impl->graph, fusion_options(impl->switches));
  const auto max_batch = build.value("max_batch", nlohmann::json(4096));
  if (!max_batch.is_number_integer() || max_batch.get<int64_t>() < 1 || max_batch.get<int64_t>() > 4096)
    fail_input(src, "provenance.json: build.max_batch must be an integer in 1..4096, got ", max_batch.dump());
  impl->max_batch = max_batch.get<int64_t>();
  const auto reference = build.value("reference", nlohmann::json::array());
  if (!reference.is_array()) fail_input(src, "provenance.json: build.reference must be a list of strings");
  for (const auto& r : reference) {
    if (!r.is_string()) fail_input(src, "provenance.json: build.reference must be a list of strings");
    impl->reference.push_back(r.get<std::string>());
  }
  if (impl->backend == "cuda") {
    if (!impl->reference.empty())
      fail_usage(src, "this bundle forces layers onto the plain reference path (kiln build --reference), which only "
                 "the CPU backend runs; load it with --backend cpu");
#ifdef KILN_HAVE_CUDA
    std::string why;
    if (!cuda::device_available(&why))
      fail_runtime(src, "this is a CUDA bundle and ", why, "; run it on the CPU with --backend cpu (LoadOptions::backend = \"cpu\")");
    cuda::CudaOptions co;
    co.opt_level = opt_level;
    co.allow_tf32 = allow_tf32;
    co.switches = impl->switches;  // co.tactic_cache stays empty: loading never reads or writes the cache
    co.log = options.log;
    const std::string mine = "tactics." + cuda::gpu_slug(cuda::current_gpu_key().gpu) + ".json";
    for (const auto& name : b.section_names())
      if (name.rfind("tactics.", 0) == 0 && (co.tactics.is_null() || name == mine)) {
        co.tactics = nlohmann::json::parse(b.section_text(name), nullptr, false);
        if (!co.tactics.is_object()) fail_input(src, name, ": not a JSON object");
      }
    impl->cuda = std::make_shared<cuda::CudaEngine>(impl->graph, co);
#else
    fail_runtime(src, "this kiln was built without the CUDA backend; run the bundle with --backend cpu");
#endif
  } else if (impl->backend == "cpu") {
    for (const Node& n : impl->graph.nodes)
      if (!cpu::supports(impl->graph, n)) fail_input(src, "layer '", n.name, "' is not supported by the CPU backend");
    impl->cpu = std::make_unique<cpu::CpuProgram>(impl->graph);
    if (!impl->reference.empty()) impl->cpu->use_reference(select_nodes(impl->graph, impl->reference, src + "reference pattern"));
  } else {
    fail_usage("unknown backend '", impl->backend, "' (cpu, cuda)");
  }
  return impl;
}

}  // namespace

std::shared_ptr<const Engine> Engine::load(const std::string& bundle_path, const LoadOptions& options) {
  return std::shared_ptr<const Engine>(new Engine(load_impl(Bundle::open(bundle_path), options)));
}

std::shared_ptr<const Engine> Engine::load_from_memory(const void* data, size_t size, const LoadOptions& options,
                                                       const std::string& name) {
  Bundle b = Bundle::from_bytes(Blob::copy_of(data, size), name);
  return std::shared_ptr<const Engine>(new Engine(load_impl(std::move(b), options)));
}

const std::string& Engine::family() const { return impl_->family; }
const std::string& Engine::task() const { return impl_->task; }
const std::string& Engine::backend() const { return impl_->backend; }
const std::string& Engine::precision() const { return impl_->precision; }
const std::vector<std::string>& Engine::labels() const { return impl_->labels; }
std::string Engine::runtime_json() const { return impl_->runtime_text; }
size_t Engine::node_count() const { return impl_->graph.nodes.size(); }
int64_t Engine::max_batch() const { return impl_->max_batch; }

std::vector<TensorInfo> Engine::inputs() const {
  std::vector<TensorInfo> r;
  for (int v : impl_->graph.inputs) r.push_back(info_of(impl_->graph, v));
  return r;
}
std::vector<TensorInfo> Engine::outputs() const {
  std::vector<TensorInfo> r;
  for (int v : impl_->graph.outputs) r.push_back(info_of(impl_->graph, v));
  return r;
}

std::unique_ptr<ExecutionContext> Engine::create_context() const {
  auto impl = std::make_unique<ExecutionContext::Impl>();
  impl->engine = shared_from_this();
#ifdef KILN_HAVE_CUDA
  if (impl_->cuda) impl->cuda = std::make_shared<cuda::CudaContext>(impl_->cuda);
#endif
  return std::unique_ptr<ExecutionContext>(new ExecutionContext(std::move(impl)));
}

}  // namespace kiln
