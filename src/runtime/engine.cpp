#include <chrono>
#include <cstring>

#include "core/error.hpp"
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

Engine::Engine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Engine::~Engine() = default;

namespace {

// Everything Engine::load does after the container is validated; the
// memory and the path entry points differ only in how the Bundle is made.
std::unique_ptr<Engine::Impl> load_impl(Bundle bundle, const LoadOptions& options,
                                       std::chrono::steady_clock::time_point t0) {
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
  const int opt_level = field("opt_level", 3, [](const nlohmann::json& j) { return j.is_number_integer(); }, "an integer")
                            .get<int>();
  const bool allow_tf32 = field("allow_tf32", false, [](const nlohmann::json& j) { return j.is_boolean(); }, "true or false")
                              .get<bool>();
  impl->switches = EngineSwitches::from_json(build.value("switches", nlohmann::json()), src + "provenance.json: build");
  // Bundles from before fusion marks were recorded (no build.fusion_marks):
  // the marks their build would have set, from the switches it recorded.
  // Bundles from before channel views were marks (true or 1): those marks.
  // Newer bundles carry every mark: the graph is read as it is.
  const nlohmann::json marks = field("fusion_marks", 0, [](const nlohmann::json& j) {
    return (j.is_boolean() && j.get<bool>()) || (j.is_number_integer() && j.get<int64_t>() >= 1);
  }, "true or a positive integer");
  const int64_t marks_version = marks.is_boolean() ? 1 : marks.get<int64_t>();
  const FusionOptions fusions = fusion_options(impl->switches);
  if (marks_version == 0) mark_fusions(impl->graph, fusions);
  else if (marks_version < kFusionMarksVersion && fusions.channel_views) fuse_channel_views(impl->graph);
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
  // The bundle's own backend missing from this build is the machine's limit
  // (runtime); a backend the caller names is a usage error.
  const Backend& backend =
      options.backend.empty()
          ? backend_registry().get(impl->backend, ErrorKind::Runtime, src, "; run the bundle with --backend cpu")
          : backend_registry().get(impl->backend);
  if (const std::string why = backend.supports(impl->graph); !why.empty()) fail_input(src, why);
  CompileOptions co;  // tune stays false: loading replays the bundle's record and never times
  co.opt_level = opt_level;
  co.allow_tf32 = allow_tf32;
  co.switches = impl->switches;
  co.reference = impl->reference;
  co.bundle = &impl->bundle;
  co.source = src;
  co.log = options.log;
  const auto t1 = std::chrono::steady_clock::now();
  impl->compiled = backend.compile(impl->graph, co);
  const auto t2 = std::chrono::steady_clock::now();
  auto ms = [](auto a, auto b) { return std::chrono::duration<double, std::milli>(b - a).count(); };
  impl->load_phases = {{"bundle_read_ms", ms(t0, t1)}, {"backend_compile_ms", ms(t1, t2)}};
  for (auto& kv : impl->compiled->load_phases()) impl->load_phases.push_back(std::move(kv));
  return impl;
}

}  // namespace

std::shared_ptr<const Engine> Engine::load(const std::string& bundle_path, const LoadOptions& options) {
  const auto t0 = std::chrono::steady_clock::now();
  return std::shared_ptr<const Engine>(new Engine(load_impl(Bundle::open(bundle_path), options, t0)));
}

std::shared_ptr<const Engine> Engine::load_from_memory(const void* data, size_t size, const LoadOptions& options,
                                                       const std::string& name) {
  const auto t0 = std::chrono::steady_clock::now();
  Bundle b = Bundle::from_bytes(Blob::copy_of(data, size), name);
  return std::shared_ptr<const Engine>(new Engine(load_impl(std::move(b), options, t0)));
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

std::vector<TensorInfo> Engine::outputs(int64_t batch) const {
  if (batch < 1 || batch > impl_->max_batch)
    fail_input("batch ", batch, " is outside this engine's 1..", impl_->max_batch);
  std::vector<TensorInfo> r = outputs();
  const std::vector<Shape>& shapes = impl_->output_shapes(batch);
  for (size_t k = 0; k < r.size(); ++k) r[k].shape = shapes[k];
  return r;
}

const std::vector<Shape>& Engine::Impl::output_shapes(int64_t batch) const {
  std::lock_guard<std::mutex> lock(shapes_mutex_);
  auto it = output_shapes_.find(batch);
  if (it == output_shapes_.end()) {
    const Graph g = graph_at_batch(graph, batch);
    std::vector<Shape> shapes;
    for (int v : g.outputs) shapes.push_back(g.values[v].shape);
    it = output_shapes_.emplace(batch, std::move(shapes)).first;
  }
  return it->second;  // map nodes stay put: the reference outlives the lock
}

std::unique_ptr<ExecutionContext> Engine::create_context() const {
  auto impl = std::make_unique<ExecutionContext::Impl>();
  impl->engine = shared_from_this();
  impl->backend = impl_->compiled->create_context();
  return std::unique_ptr<ExecutionContext>(new ExecutionContext(std::move(impl)));
}

}  // namespace kiln
