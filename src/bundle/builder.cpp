#include "bundle/builder.hpp"

#include <algorithm>
#include <chrono>
#include <cstdlib>

#include "backends/backend.hpp"
#include "bundle/bundle.hpp"
#include "checkpoint/hf_cache.hpp"
#include "core/error.hpp"
#include "core/file.hpp"
#include "families/family.hpp"
#include "ir/serialize.hpp"
#include "passes/pass.hpp"

namespace kiln {

using nlohmann::json;

namespace {

json read_config(const std::filesystem::path& path) {
  Blob b = map_file(path);
  json j = json::parse(b.data, b.data + b.size, nullptr, false);
  if (j.is_discarded() || !j.is_object()) fail_input(path.string(), ": not a JSON object");
  return j;
}

std::map<std::string, int> op_counts(const Graph& g) {
  std::map<std::string, int> m;
  for (const auto& n : g.nodes) ++m[op_name(n.op)];
  return m;
}

}  // namespace

std::string default_tactic_cache() {
  // Environment variables may say where files go (DESIGN §7), never what an engine computes.
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return (std::filesystem::path(x) / "kiln" / "tactics.json").string();
  if (const char* h = std::getenv("HOME"); h && *h) return (std::filesystem::path(h) / ".cache" / "kiln" / "tactics.json").string();
  return "";
}

namespace {
std::vector<int> planned_batches(const BuildOptions& o) {
  std::vector<int> all{o.batch};
  for (int b : o.batches)
    if (std::find(all.begin(), all.end(), b) == all.end()) all.push_back(b);
  std::sort(all.begin(), all.end());
  return all;
}
}  // namespace

BuildSummary build_bundle(const BuildOptions& o, const std::filesystem::path& out) {
  const auto t0 = std::chrono::steady_clock::now();
  if (o.batch < 1 || o.batch > 4096) fail_usage("--batch must be in 1..4096");
  int largest = o.batch;
  for (int b : o.batches) {
    if (b < 1 || b > 4096) fail_usage("--batch must be in 1..4096, got ", b);
    largest = std::max(largest, b);
  }
  if (o.max_batch < largest || o.max_batch > 4096)
    fail_usage("--max-batch must be in ", largest, "..4096 (at least every --batch), got ", o.max_batch);
  if (o.opt_level < 0 || o.opt_level > 5) fail_usage("--opt-level must be in 0..5");
  const Backend& backend = backend_registry().get(o.backend);
  if (o.precision != DType::F32 && o.precision != DType::F16 && o.precision != DType::BF16)
    fail_usage("precision ", dtype_name(o.precision), " is not supported (f32, f16, bf16)");
  auto say = [&](const std::string& s) {
    if (o.log) *o.log << s << std::endl;
  };

  ResolvedModel model = resolve_model(o.model, o.revision);
  say(cat("model: ", model.dir.string()));
  ModelSource src;
  src.dir = model.dir;
  src.config_path = model.dir / "config.json";
  src.config = read_config(src.config_path);
  Checkpoint ckpt = Checkpoint::open(model.dir);
  src.checkpoint = &ckpt;
  const Family& family = family_registry().select(src);
  say(cat("family: ", family.name(), " (", ckpt.size(), " tensors)"));

  FamilyBuild fb = family.build(BuildRequest{&src, o.batch});
  BuildSummary summary;
  summary.family = family.name();
  summary.model_dir = model.dir.string();
  summary.nodes_before = fb.graph.nodes.size();
  PipelineOptions popts;
  popts.precision = o.precision;
  popts.fusions = fusion_options(o.switches);
  popts.verify = o.verify;
  popts.log = o.log;
  // Channel rows padded as the backend's kernels want them (cuDNN NHWC: 16 bytes).
  if (const int64_t align = backend.channel_align_bytes()) popts.channel_align = align / static_cast<int64_t>(dtype_size(o.precision));
  run_pipeline(fb.graph, popts);
  summary.nodes_after = fb.graph.nodes.size();
  summary.op_counts = op_counts(fb.graph);
  say(cat("graph: ", summary.nodes_before, " nodes -> ", summary.nodes_after, " after passes"));

  if (const std::string why = backend.supports(fb.graph); !why.empty()) fail_input(why);
  // Compiled with tuning now (CUDA: tactics timed on this GPU); the bundle
  // records the choices and loading replays them.
  say(cat("compiling for ", backend.name(), " (opt level ", o.opt_level, ")"));
  CompileOptions co;
  co.tune = true;
  co.opt_level = o.opt_level;
  co.allow_tf32 = o.allow_tf32;
  co.switches = o.switches;
  co.batches.assign(o.batches.begin(), o.batches.end());
  co.reference = o.reference;  // every pattern must name a layer; only the CPU backend takes any
  co.tactic_cache = o.tactic_cache;
  co.log = o.log;
  co.progress = o.progress;
  const std::vector<std::pair<std::string, std::string>> record = backend.compile(fb.graph, co)->record();
  SerializedGraph sg = serialize_graph(fb.graph);
  json provenance = {
      {"kiln_version", KILN_VERSION},
      {"checkpoint", {{"source", model.hf_id.empty() ? model.dir.string() : model.hf_id},
                      {"revision", model.revision},
                      {"files", ckpt.file_sha256()}}},
      {"build", {{"precision", dtype_name(o.precision)}, {"backend", o.backend}, {"batch", o.batch}, {"batches", planned_batches(o)}, {"opt_level", o.opt_level}, {"allow_tf32", o.allow_tf32},
                 {"max_batch", o.max_batch}, {"switches", o.switches.to_json()}, {"reference", o.reference},
                 {"fusion_marks", kFusionMarksVersion}}},
      {"quantization", nullptr},
  };
  BundleWriter w(BundleInfo{kBundleFormat, KILN_VERSION, family.name(), fb.task, o.backend});
  w.add_section("graph.json", sg.graph_json);
  w.add_section("weights.bin", std::move(sg.weights));
  w.add_section("runtime.json", fb.runtime.dump(1));
  w.add_section("labels.json", json(fb.labels).dump());
  w.add_section("provenance.json", provenance.dump(1));
  for (const auto& [name, text] : record) w.add_section(name, text);
  w.write(out);
  summary.bundle_bytes = std::filesystem::file_size(out);
  summary.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  say(cat("wrote ", out.string(), " (", summary.bundle_bytes, " bytes) in ", summary.seconds, " s"));
  return summary;
}

}  // namespace kiln
