#include "bundle/builder.hpp"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <set>

#include "backends/backend.hpp"
#include "bundle/bundle.hpp"
#include "checkpoint/hf_cache.hpp"
#include "core/error.hpp"
#include "core/file.hpp"
#include "core/float_text.hpp"
#include "families/family.hpp"
#include "ir/serialize.hpp"
#include "passes/pass.hpp"
#include "quant/calib_images.hpp"
#include "quant/calibrate.hpp"
#include "quant/recipe.hpp"

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
// The recipe of a --quantize build: the file's (its precision must be the
// one asked for) or the default one, with --calib-method/--percentile applied.
quant::Recipe build_recipe(const BuildOptions& o) {
  const DType precision = quant::precision_from_name(o.quantize, "--quantize");
  quant::Recipe r;
  r.precision = precision;
  if (!o.recipe.empty()) {
    r = quant::read_recipe(o.recipe);
    if (r.precision != precision)
      fail_usage("--quantize ", o.quantize, " but recipe ", o.recipe, " says precision '", quant::precision_name(r.precision), "'");
  }
  if (!o.calib_method.empty()) {
    r.calibration.method = quant::calib_method_from_name(o.calib_method, "--calib-method");
    if (r.calibration.method != quant::CalibMethod::Percentile) r.calibration.percentile = 99.99;
  }
  if (o.percentile >= 0) {
    if (r.calibration.method != quant::CalibMethod::Percentile) fail_usage("--percentile needs --calib-method percentile");
    if (!(o.percentile > 0 && o.percentile <= 100)) fail_usage("--percentile must be in (0, 100], got ", o.percentile);
    r.calibration.percentile = o.percentile;
  }
  return r;
}

void check_quant_options(const BuildOptions& o) {
  if (o.quantize.empty()) {
    for (const auto& [flag, v] : {std::pair<const char*, const std::string*>{"--recipe", &o.recipe}, {"--calib", &o.calib},
                                  {"--calib-method", &o.calib_method}, {"--scales", &o.scales}, {"--write-scales", &o.write_scales}})
      if (!v->empty()) fail_usage(flag, " needs --quantize fp8|int8");
    return;
  }
  quant::precision_from_name(o.quantize, "--quantize");  // fp8 or int8, else a usage error naming it
  if (o.backend != "cpu" && o.backend != "cuda")
    fail_usage("--quantize: the ", o.backend, " backend has no FP8/INT8 kernels; build with --backend cuda or cpu");
  if (o.calib.empty() == o.scales.empty()) fail_usage("--quantize needs exactly one of --calib DIR and --scales FILE");
  if (o.calib_images < 1) fail_usage("--calib-images must be at least 1, got ", o.calib_images);
  if (!o.scales.empty() && (!o.calib_method.empty() || o.percentile >= 0))
    fail_usage("--calib-method/--percentile apply to --calib; the scales in ", o.scales, " are already calibrated");
}

// Every value a scales file names must exist in this graph: a file made for
// another model is refused by its first unknown name.
void check_scales_names(const Graph& g, const quant::ActivationScales& s, const std::string& source) {
  std::set<std::string> names;
  for (const Value& v : g.values) names.insert(v.name);
  for (const auto& [name, amax] : s.amax)
    if (!names.count(name))
      fail_input(source, ": value '", name, "' is not in this model's graph (a scales file for another model?)");
}

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
  check_quant_options(o);
  const quant::Recipe recipe = o.quantize.empty() ? quant::Recipe{} : build_recipe(o);

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
  if (const int64_t align = backend.channel_align_bytes()) {
    popts.channel_align = align / static_cast<int64_t>(dtype_size(o.precision));
    popts.channel_align_8bit = align;  // 1-byte codes
  }
  const quant::PartTable family_parts = fb.quant_parts;  // RT-DETR's linear groups, ...
  json quantization = nullptr;   // provenance.quantization
  json quant_scales = nullptr;   // the quant_scales.json section: every scale
  if (!o.quantize.empty())
    popts.quantize = [&](Graph& g) {
      const quant::Selection sel = quant::select_quantized(g, recipe, family_parts);
      if (sel.quantized.empty())
        fail_usage("the recipe quantizes no layer of this model (every conv/linear is excluded: see docs/quantization.md "
                   "for the default exclusions and how to switch them off)");
      quant::ActivationScales scales;
      if (!o.scales.empty()) {
        scales = quant::read_scales(o.scales);
        if (scales.precision != recipe.precision)
          fail_usage(o.scales, " holds ", quant::precision_name(scales.precision), " scales, the build is --quantize ", o.quantize);
        check_scales_names(g, scales, o.scales);
        quant::check_scales_cover(g, sel.quantized, scales, o.scales);
        say(cat("quantize: ", sel.quantized.size(), " layers, scales from ", o.scales));
      } else {
        const auto files = quant::calibration_images(o.calib, o.calib_images);
        // One image per batch: calibrate a batch-1 copy (same value ids and names).
        Graph one = g;
        for (int in : one.inputs) one.values[in].shape[0] = 1;
        one.infer_shapes();
        const int passes = quant::make_collector(recipe.calibration, recipe.precision)->passes();
        say(cat("quantize: ", sel.quantized.size(), " layers; calibrating (", quant::calib_method_name(recipe.calibration.method),
                ") on ", files.size(), " images from ", o.calib, ", ", passes, passes == 1 ? " pass" : " passes"));
        int64_t shown = -1;
        scales = quant::calibrate(one, sel.quantized, recipe.precision, recipe.calibration,
                                  quant::image_calibration_data(files, fb.runtime, fb.task), [&](int64_t done, int64_t total) {
                                    const int64_t tenth = done * 10 / std::max<int64_t>(1, total);
                                    if (tenth != shown || done == total) say(cat("calibration: ", done, "/", total, " batch runs"));
                                    shown = tenth;
                                  });
      }
      if (!o.write_scales.empty()) {
        quant::write_scales(scales, o.write_scales);
        say(cat("wrote scales ", o.write_scales));
      }
      json excluded = json::object();
      for (const auto& e : sel.excluded) excluded[g.nodes[e.node].name] = e.reason;
      std::vector<std::string> quantized;
      for (int i : sel.quantized) quantized.push_back(g.nodes[i].name);
      const json scales_json = json::parse(quant::scales_to_json(scales));
      quantization = {{"precision", o.quantize},
                      {"recipe", json::parse(quant::recipe_to_json(recipe))},
                      {"recipe_file", o.recipe},
                      {"scales_source", o.scales.empty() ? json{{"calib", o.calib}, {"images", scales.batches}} : json{{"scales", o.scales}}},
                      {"quantized", quantized},
                      {"excluded", excluded},
                      {"activation_scales", scales_json},
                      {"activation_scales_section", "quant_scales.json"},
                      {"weight_scales", "graph.json (each 8-bit weight's quant); kiln inspect --scales lists every scale"}};
      const int rewrites = quantize_layers(g, sel.quantized, scales, recipe.residuals_8bit);
      // The activation scales only (the --scales file's form): the weights'
      // per-channel scales live once, in graph.json (a second copy as text
      // was ~5 % of an FP8 efficientnet_b0 bundle); `kiln inspect --scales`
      // prints them all.
      quant_scales = {{"format", 1}, {"activations", scales_json}};
      return rewrites;
    };
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
      {"quantization", quantization},
  };
  BundleWriter w(BundleInfo{kBundleFormat, KILN_VERSION, family.name(), fb.task, o.backend});
  w.add_section("graph.json", sg.graph_json);
  w.add_section("weights.bin", std::move(sg.weights));
  w.add_section("runtime.json", fb.runtime.dump(1));
  w.add_section("labels.json", json(fb.labels).dump());
  w.add_section("provenance.json", provenance.dump(1));
  if (!quant_scales.is_null()) w.add_section("quant_scales.json", quant_scales.dump());
  for (const auto& [name, text] : record) w.add_section(name, text);
  w.write(out);
  summary.bundle_bytes = std::filesystem::file_size(out);
  summary.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  say(cat("wrote ", out.string(), " (", summary.bundle_bytes, " bytes) in ", summary.seconds, " s"));
  return summary;
}

}  // namespace kiln
