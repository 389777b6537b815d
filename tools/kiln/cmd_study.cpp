// kiln study quant MODEL: the FP8/INT8 self-quantization study of issue 13,
// one command that anyone can rerun. It builds the model at 16 bits and with
// each 8-bit precision (same recipe, same calibration images), times every
// variant interleaved round by round in this one process (so clock drift hits
// all alike), measures quality against kiln's fp32 engine of the same
// checkpoint (which itself matches PyTorch fp32 within 1e-6 relative on every
// family, tools/check_full_size.sh), scans for non-finite outputs on stress
// inputs, and writes REPORT.md + study.json: every number in the report comes
// from this run, and the report names the command that regenerates it.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <map>
#include <set>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "bundle/builder.hpp"
#include "commands.hpp"
#include "profile_json.hpp"
#include "core/error.hpp"
#include "core/file.hpp"
#include "kiln/kiln.hpp"
#include "quant/recipe.hpp"
#include "runtime/engine_impl.hpp"
#include "tasks/detection_post.hpp"
#include "tasks/eval_set.hpp"

namespace kiln::cli {

namespace {

namespace fs = std::filesystem;

struct StudyOptions {
  std::string model, calib, images, backend = "cpu", out, calib_method;
  // Recipe files, one 8-bit variant per precision each ("default": no file,
  // the default recipe). With two or more, a variant is labelled
  // "<precision>:<recipe file stem>" everywhere (speed, quality, profiles).
  std::vector<std::string> recipes;
  std::string accuracy;  // an ImageFolder with the bundle's labels as class folders: top-1 accuracy per variant
  std::vector<int> batches{1, 32}, opt_levels{1, 3};
  std::vector<std::string> precisions{"fp8", "int8"};
  std::string base = "fp16";
  int rounds = 30, quality_images = 32, calib_images = 32;
  bool json = false, quiet = false;
  std::string command;  // as given, for the report
  std::string report_from;  // --report-from: re-render REPORT.md from this study.json
};

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

std::vector<std::string> image_files(const fs::path& dir, size_t limit) {
  std::vector<std::string> out;
  std::error_code ec;
  for (fs::recursive_directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string ext = it->path().extension().string();
    if (it->is_regular_file() && (ext == ".jpg" || ext == ".jpeg" || ext == ".png" || ext == ".JPEG" || ext == ".PNG"))
      out.push_back(it->path().string());
  }
  if (ec) fail_input(dir.string(), ": cannot read the folder (", ec.message(), ")");
  std::sort(out.begin(), out.end());
  if (out.size() > limit) out.resize(limit);
  return out;
}

// One variant: a precision ("fp32", "fp16", "fp8", "int8") at one opt level;
// `precision` is the variant's label (with the recipe's stem when a study
// compares recipes), `recipe` the recipe file of an 8-bit one ("" default).
struct Variant {
  std::string precision;
  std::string recipe;
  int opt_level = 1;
  fs::path bundle;
  uint64_t bytes = 0;
  double build_s = 0;
};

bool is_default_recipe(const std::string& r) { return r.empty() || r == "default"; }

// The label of precision p built with recipe r: p alone for the fp32 and
// 16-bit variants and when the study has one recipe.
std::string variant_label(const StudyOptions& o, const std::string& p, const std::string& r) {
  if (o.recipes.size() <= 1 || (p != "fp8" && p != "int8")) return p;
  return p + ":" + (is_default_recipe(r) ? std::string("default") : fs::path(r).stem().string());
}

Variant build_variant(const StudyOptions& o, const std::string& precision, int opt_level, const fs::path& dir,
                      const std::string& recipe = "") {
  const std::string label = variant_label(o, precision, recipe);
  std::string file = label;
  for (char& c : file)
    if (c == ':' || c == '/') c = '_';
  Variant v{label, is_default_recipe(recipe) ? "" : recipe, opt_level, dir / (file + "_o" + std::to_string(opt_level) + ".bundle")};
  BuildOptions b;
  b.model = o.model;
  b.backend = o.backend;
  b.opt_level = opt_level;
  b.batch = o.batches.front();
  b.batches.assign(o.batches.begin() + 1, o.batches.end());
  b.tactic_cache.clear();  // every variant times its own tactics
  const bool eight = precision == "fp8" || precision == "int8";
  b.precision = precision == "fp32" ? DType::F32 : precision == "bf16" ? DType::BF16 : DType::F16;
  if (eight) {
    // The 16-bit side of an 8-bit engine (layers left out by the recipe, the epilogues' outputs).
    b.precision = o.base == "bf16" ? DType::BF16 : DType::F16;
    b.quantize = precision;
    b.calib = o.calib;
    b.calib_images = o.calib_images;
    b.recipe = v.recipe;
    b.calib_method = o.calib_method;
  }
  const auto t0 = std::chrono::steady_clock::now();
  const BuildSummary s = build_bundle(b, v.bundle);
  v.build_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  v.bytes = s.bundle_bytes;
  return v;
}

// Quality of `got` against `ref` over images: top-1 agreement, worst cosine, max|diff| / max|ref|.
struct Quality {
  double top1_agree = 0, min_cosine = 1, max_diff_rel = 0;
};

Quality compare(const std::vector<std::vector<float>>& ref, const std::vector<std::vector<float>>& got) {
  Quality q;
  size_t agree = 0;
  double max_ref = 0, max_diff = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const auto& a = ref[i];
    const auto& b = got[i];
    double dot = 0, na = 0, nb = 0;
    for (size_t k = 0; k < a.size(); ++k) {
      dot += double(a[k]) * b[k], na += double(a[k]) * a[k], nb += double(b[k]) * b[k];
      max_ref = std::max(max_ref, std::abs(double(a[k])));
      max_diff = std::max(max_diff, std::abs(double(a[k]) - b[k]));
    }
    q.min_cosine = std::min(q.min_cosine, na > 0 && nb > 0 ? dot / std::sqrt(na * nb) : (na == nb ? 1.0 : 0.0));
    agree += std::max_element(a.begin(), a.end()) - a.begin() == std::max_element(b.begin(), b.end()) - b.begin();
  }
  q.top1_agree = ref.empty() ? 0 : double(agree) / ref.size();
  q.max_diff_rel = max_ref > 0 ? max_diff / max_ref : max_diff;
  return q;
}

// Logits of each pre-processed image, one engine call per image.
std::vector<std::vector<float>> logits_of(Classifier& clf, const std::vector<std::vector<float>>& pixels) {
  std::vector<std::vector<float>> out;
  for (const auto& px : pixels) out.push_back(clf.classify_preprocessed(px, 1, 1).at(0).logits);
  return out;
}

// Top-1 accuracy of each classifier over an evaluation set. Every image is
// decoded and pre-processed once (the variants share the model's
// pre-processing) and run through all of them, 32 images per engine call.
std::vector<double> accuracies(const std::vector<Classifier*>& clfs, const EvalSet& set) {
  std::vector<size_t> correct(clfs.size(), 0);
  for (size_t i = 0; i < set.items.size(); i += 32) {
    const size_t n = std::min(set.items.size(), i + 32) - i;
    std::vector<float> pixels;
    for (size_t k = i; k < i + n; ++k) {
      const std::vector<float> px = clfs.at(0)->preprocess_file(set.items[k].path);
      pixels.insert(pixels.end(), px.begin(), px.end());
    }
    for (size_t c = 0; c < clfs.size(); ++c) {
      const auto r = clfs[c]->classify_preprocessed(pixels, static_cast<int64_t>(n), 1);
      for (size_t k = 0; k < n; ++k) correct[c] += !r[k].top_k.empty() && r[k].top_k[0].class_id == set.items[i + k].class_id;
    }
  }
  std::vector<double> out;
  for (size_t c : correct) out.push_back(set.items.empty() ? 0.0 : double(c) / set.items.size());
  return out;
}

// Stress inputs in the engine's input space (after normalization): zeros,
// constant 1, saturating values (±50, beyond any normalized photo), noise at
// 10x the normalized range (N(0, 10)).
std::vector<std::pair<std::string, std::vector<float>>> stress_inputs(size_t n) {
  std::mt19937 rng(13);
  std::normal_distribution<float> noise(0.f, 10.f);
  std::vector<float> sat(n), nz(n);
  for (size_t i = 0; i < n; ++i) sat[i] = (i / 7) % 2 ? 50.f : -50.f, nz[i] = noise(rng);
  return {{"zeros", std::vector<float>(n, 0.f)}, {"constant 1", std::vector<float>(n, 1.f)}, {"saturating ±50", sat},
          {"noise 10x", nz}};
}

// Detection models (task "detection"): quality of each variant against the fp32 engine on the
// same pre-processed images — the 16-bit rule of issue #12 (same number of detections at score
// 0.3, each matched by class with IoU >= 0.5 and |score diff| <= 0.05; tasks/detection_post.hpp)
// per image, and the raw logits' worst cosine and max |diff| / max |ref| — and non-finite outputs
// (logits and boxes) on the stress inputs.
struct DetectionRun {
  std::vector<Detections> dets;
  std::vector<std::vector<float>> logits;
};

DetectionRun detection_run(const Engine& e, Detector& det, const std::vector<DetectionInput>& in) {
  DetectionRun r;
  auto ctx = e.create_context();
  const TensorInfo x = e.inputs().at(0);
  for (const DetectionInput& one : in) {
    r.dets.push_back(det.detect_preprocessed({one}, 0.3f).at(0));
    Shape s = x.shape;
    s[0] = 1;
    for (Tensor& t : ctx->run({{x.name, s, one.pixels}}))
      if (t.name == "logits") r.logits.push_back(std::move(t.data));
  }
  return r;
}

nlohmann::json detection_quality(const Engine& e, const DetectionRun& ref, const std::vector<DetectionInput>& in,
                                 const std::vector<std::pair<std::string, std::vector<float>>>& stress) {
  Detector det(e.shared_from_this());
  const DetectionRun got = detection_run(e, det, in);
  size_t agree = 0, ref_boxes = 0;
  std::string first;
  for (size_t i = 0; i < in.size(); ++i) {
    const std::string why = detection_mismatch(ref.dets[i], got.dets[i]);
    agree += why.empty();
    ref_boxes += ref.dets[i].boxes.size();
    if (!why.empty() && first.empty()) first = cat("image ", i, ": ", why);
  }
  const Quality q = compare(ref.logits, got.logits);
  nlohmann::json nonfinite = nlohmann::json::object();
  auto ctx = e.create_context();
  const TensorInfo x = e.inputs().at(0);
  Shape s = x.shape;
  s[0] = 1;
  for (const auto& [name, px] : stress) {
    size_t n = 0;
    for (const Tensor& t : ctx->run({{x.name, s, px}}))
      n += std::count_if(t.data.begin(), t.data.end(), [](float v) { return !std::isfinite(v); });
    nonfinite[name] = n;
  }
  return {{"detection_agreement", in.empty() ? 0.0 : double(agree) / in.size()},
          {"reference_detections", ref_boxes},
          {"first_mismatch", first},
          {"min_cosine", q.min_cosine},
          {"max_diff_rel", q.max_diff_rel},
          {"images", in.size()},
          {"nonfinite_outputs", nonfinite}};
}

void write_text(const fs::path& path, const std::string& text) {
  write_file_atomic(path, [&](std::FILE* f) { write_all(f, text.data(), text.size()); });
}

std::string fmt(double v, int digits = 4) {
  std::ostringstream s;
  s << std::fixed << std::setprecision(digits) << v;
  return s.str();
}

// REPORT.md from study.json alone (so `--report-from` re-renders a run's
// report without rebuilding anything: every number is that run's).
std::string render_report(const nlohmann::json& r) {
  using J = nlohmann::json;
  const std::string base = r.at("base"), backend = r.at("backend"), model = r.at("model");
  const bool detection = r.value("task", "classification") == "detection";
  const std::vector<int> opt_levels = r.at("opt_levels"), batches = r.at("batches");
  const int top = opt_levels.back();
  const J& speed = r.at("speed");
  const J& quality = r.at("quality");
  const J& profiles = r.value("profiles", J::object());
  const std::string calib = r.at("calib"), quality_folder = r.value("quality_folder", calib);
  const std::string calib_method = r.value("calib_method", "");
  const std::string key = "speedup_over_" + base;
  std::ostringstream md;
  md << "# kiln study quant: " << fs::path(model).filename().string() << "\n\n"
     << "Regenerate: `" << r.at("command").get<std::string>() << "` (backend " << backend << ", kiln "
     << r.value("kiln_version", std::string(KILN_VERSION)) << ").\n\n## Summary\n\n";
  for (const auto& s : speed)
    if (s["precision"] != base && s["opt_level"] == top)
      md << "- " << s["precision"].get<std::string>() << " at batch " << s["batch"] << ": " << fmt(s[key].get<double>(), 2) << "× "
         << base << " (" << fmt(s["median_ms"]) << " ms), plan " << fmt(s["plan_mib"], 2) << " MiB\n";
  for (const auto& q : quality)
    if (q["precision"] != base)
      md << "- " << q["precision"].get<std::string>() << " quality vs fp32: "
         << (detection ? "detection agreement " + fmt(q["detection_agreement"], 3) : "top-1 agreement " + fmt(q["top1_agreement"], 3))
         << ", worst " << (detection ? "logits " : "") << "cosine " << fmt(q["min_cosine"], 5) << "\n";

  // The decision, from this run's numbers: TRTMC's 5 % rule decides "equal".
  md << "\n## Decision\n\n";
  const auto row = [&](const std::string& p, int batch) -> const J* {
    for (const auto& s : speed)
      if (s["precision"] == p && s["opt_level"] == top && s["batch"] == batch) return &s;
    return nullptr;
  };
  std::vector<std::string> eight;
  for (const auto& s : speed)
    if (s["precision"] != base && std::find(eight.begin(), eight.end(), s["precision"].get<std::string>()) == eight.end())
      eight.push_back(s["precision"]);
  for (const std::string& p : eight) {
    std::vector<std::string> faster, slower, equal;
    std::string kernels;
    for (int b : batches) {
      const J* q = row(p, b);
      const J* f = row(base, b);
      if (!q || !f) continue;
      const double x = (*q)[key].get<double>();
      (x >= 1.05 ? faster : x < 0.95 ? slower : equal).push_back("batch " + std::to_string(b) + " " + fmt(x, 2) + "×");
      kernels += (kernels.empty() ? "" : ", ") + std::string("batch ") + std::to_string(b) + ": " +
                 std::to_string((*q)["kernels_per_call"].get<int>()) + " against " + std::to_string((*f)["kernels_per_call"].get<int>());
    }
    const auto list = [](const std::vector<std::string>& v) {
      std::string s;
      for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
      return s;
    };
    if (faster.empty() && equal.empty())
      md << "- **Keep " << base << "**: " << p << " is slower at every batch timed at opt level " << top << " (" << list(slower) << ").";
    else if (slower.empty() && equal.empty())
      md << "- **" << p << " pays** at every batch timed at opt level " << top << " (" << list(faster) << "), if its quality below is acceptable.";
    else
      md << "- **" << p << " is mixed** at opt level " << top << ": faster " << (faster.empty() ? "nowhere" : list(faster)) << "; equal (within 5 %) "
         << (equal.empty() ? "nowhere" : list(equal)) << "; slower " << (slower.empty() ? "nowhere" : list(slower)) << ".";
    // The quantize steps of the profiled batch: a 16-bit producer feeding an 8-bit layer.
    int quantize_steps = -1;
    if (r.contains("profiles") && r["profiles"].contains(p)) {
      quantize_steps = 0;
      for (const auto& l : r["profiles"][p]["layers"]) quantize_steps += l["name"].get<std::string>().ends_with(".quantize");
    }
    md << " Kernels per call, " << p << " against " << base << ": " << kernels << " — "
       << (quantize_steps >= 0 ? std::to_string(quantize_steps) + " of the " + p + " engine's steps are quantize kernels (a 16-bit "
                                 "producer feeding an 8-bit layer), and a layer on a two-kernel path runs its epilogue apart"
                               : std::string("each 8-bit layer whose input is not already 8-bit runs a quantize kernel of its own"))
       << " (the table at the end shows where).\n";
  }

  md << "\n## Recipe and calibration\n\n" << r.at("recipe").get<std::string>() << "; calibration on the first "
     << r.at("calib_images") << " images of `" << calib << "`" << (calib_method.empty() ? "" : " (" + calib_method + ")")
     << ". Each bundle's provenance.json holds the recipe, the quantized layers, the exclusions and every scale.\n\n"
     << "## Method\n\nEngine time of one call (`kiln bench`'s region: CUDA one CUDA-graph replay between two events, the "
        "stream synchronized after each; CPU wall clock), the inputs already in place, after one untimed call that plans "
        "the batch size. "
     << r.at("rounds") << " rounds; in each round every variant of the opt level runs once, in turn (interleaved), so drift "
                          "hits all alike; median and min over rounds. Tactics timed per variant (no shared tactic cache).\n\n"
     << "## Speed\n\n| precision | opt level | batch | median ms | min ms | × " << base
     << " | kernels per call | plan MiB |\n|---|---|---|---|---|---|---|---|\n";
  for (const auto& s : speed)
    md << "| " << s["precision"].get<std::string>() << " | " << s["opt_level"] << " | " << s["batch"] << " | " << fmt(s["median_ms"])
       << " | " << fmt(s["min_ms"]) << " | " << fmt(s[key].get<double>(), 3) << " | " << s["kernels_per_call"] << " | "
       << fmt(s["plan_mib"], 2) << " |\n";
  md << "\n## Quality against kiln's fp32 engine (" << r.at("quality_images") << " images of `" << quality_folder << "`)\n\n"
     << (detection ? "Detection agreement: the share of images whose detections at score 0.3 match fp32's (same count, "
                     "each matched by class with IoU >= 0.5 and |score diff| <= 0.05); cosine and diff of the raw logits.\n\n"
                   : "")
     << "| precision | " << (detection ? "detection agreement" : "top-1 agreement")
     << " | worst cosine | max abs diff / max abs ref | non-finite outputs on stress inputs |\n|---|---|---|---|---|\n";
  for (const auto& q : quality) {
    md << "| " << q["precision"].get<std::string>() << " | " << fmt(q[detection ? "detection_agreement" : "top1_agreement"], 3) << " | "
       << fmt(q["min_cosine"], 6) << " | " << fmt(q["max_diff_rel"], 5) << " | ";
    bool first = true;
    for (const auto& [name, n] : q["nonfinite_outputs"].items()) md << (first ? "" : ", ") << name << " " << n, first = false;
    md << " |\n";
  }
  const J& acc = r.value("accuracy_set", J());
  if (acc.is_object()) {
    const double ref_accuracy = acc.at("fp32_accuracy");
    md << "\n## Accuracy against labels (" << acc.at("images") << " images of `" << acc.at("folder").get<std::string>()
       << "`)\n\n| precision | top-1 accuracy | points vs fp32 |\n|---|---|---|\n| fp32 | " << fmt(ref_accuracy, 4) << " | 0 |\n";
    for (const auto& q : quality)
      md << "| " << q["precision"].get<std::string>() << " | " << fmt(q["accuracy"], 4) << " | "
         << fmt(100 * (q["accuracy"].get<double>() - ref_accuracy), 2) << " |\n";
  }
  // Per layer group: ms and steps (kernels, or fused groups) for each precision.
  // study.json files from before session 15 profiled the first batch and did not say so.
  md << "\n## Where the time goes (opt level " << top << ", batch " << r.value("profile_batch", batches.front())
     << "; layers run one by one, so the sum exceeds the engine time)\n\n| group |";
  std::vector<std::string> order;  // the groups in execution order, first seen first
  for (const auto& [p, prof] : profiles.items())
    for (const auto& g : prof["groups"])
      if (std::find(order.begin(), order.end(), g["group"].get<std::string>()) == order.end()) order.push_back(g["group"]);
  // Profiles since session 18 also list each layer's kernels (CUDA): the
  // counts are then kernels per call, else steps.
  bool listed = !profiles.empty();
  for (const auto& [p, prof] : profiles.items())
    for (const auto& g : prof["groups"]) listed = listed && g.contains("kernels");
  const char* unit = listed ? "kernels" : "steps";
  for (const auto& [p, prof] : profiles.items()) md << " " << p << " ms (" << unit << ") |";
  md << "\n|---|";
  for (size_t i = 0; i < profiles.size(); ++i) md << "---|";
  md << "\n";
  for (const std::string& g : order) {
    md << "| " << g << " |";
    for (const auto& [p, prof] : profiles.items()) {
      double ms = 0;
      int count = 0;
      for (const auto& x : prof["groups"])
        if (x["group"] == g) ms += x["ms"].get<double>(), count += x[unit].get<int>();
      md << " " << fmt(ms) << " (" << count << ") |";
    }
    md << "\n";
  }
  for (const auto& [p, prof] : profiles.items())
    if (prof.contains("kernels_unavailable")) {  // the listing failed; the times above stand
      md << "\nKernel names unavailable (" << p << "): " << prof["kernels_unavailable"].get<std::string>() << "\n";
      break;
    }
  if (listed) {
    // What the counts are made of: launches per kernel, and the layers that
    // launch more than one (a two-kernel path, a quantize, a relayout).
    md << "\nLaunches per call by kernel, and the layers launching more than one kernel:\n\n";
    for (const auto& [p, prof] : profiles.items()) {
      md << "- " << p << ":";
      const auto census = kernel_census(prof);
      for (size_t i = 0; i < census.size(); ++i) md << (i ? ", " : " ") << census[i].second << "× `" << census[i].first << "`";
      std::vector<std::string> multi;
      for (const auto& l : prof["layers"])
        if (l.value("kernels", J::array()).size() > 1) {
          std::string ks;
          for (const auto& k : l["kernels"]) ks += (ks.empty() ? "" : " + ") + readable_kernel_name(k.get<std::string>());
          multi.push_back("`" + l["name"].get<std::string>() + "` (" + ks + ")");
        }
      if (!multi.empty()) {
        md << "; " << multi.size() << " layers launch more than one:";
        for (size_t i = 0; i < multi.size() && i < 12; ++i) md << (i ? ", " : " ") << multi[i];
        if (multi.size() > 12) md << ", …";
      }
      md << "\n";
    }
  }
  md << "\n## Recipe variants\n\n"
     << (std::any_of(r.at("speed").begin(), r.at("speed").end(),
                     [](const J& x) { return x.at("precision").get<std::string>().find(':') != std::string::npos; })
             ? "This run compared the recipes above (one variant each, labelled `<precision>:<recipe file stem>`, timed "
               "interleaved with the rest). "
             : "This run built one recipe (above) per 8-bit precision. ")
     << "More recipes: `--recipe A.json,B.json` (or `--recipe default,B.json`) with named parts (`all`, `no-stem`, "
        "`no-layer1`, per stage) or node-name globs (docs/quantization.md), in one run.\n"
     << "\n## What was not tried\n\n"
        "- Quantize fused into every producer: 8-bit layers write the next 8-bit layer's codes from their epilogue "
        "(cuDNN's fused FP8 graph, kiln's CUTLASS GEMM for 1x1 convs and linears), residual adds read the skip as "
        "codes (recipe `residuals`), and the max pool, the squeeze-excitation gate, channel slices, chain adds and "
        "concats write the codes their 8-bit reader takes; an average pool or a 16-bit conv (depthwise, stem) still "
        "writes 16 bits and a quantize kernel follows.\n"
        "- 8-bit values into Res2Net's chain adds and concat: an 8-bit layer whose output is sliced, added or "
        "concatenated writes 16 bits (those ops read wide values and write codes), so the chunks move in 16 bits "
        "once.\n"
        "- INT8 3x3 convs in one kernel: they run the raw int32 sum (cuDNN's i8 engines) and kiln's epilogue as two "
        "kernels; INT8 1x1 convs and linears also have kiln's CUTLASS i8 GEMM, FP8 layers cuDNN's fused graph and "
        "kiln's CUTLASS GEMM.\n"
        "- Calibration methods other than the one named above (`--calib-method percentile|entropy|mse`).\n"
     << "\n## When to revisit\n\n"
        "When the 8-bit engine's kernels per call come down to the 16-bit engine's (quantize in the producers' "
        "epilogues, 8-bit values through slices, adds and concat): the gain FP8 can give is halving the bytes between "
        "layers (on the H200 FP8 GEMMs with 8-bit input and output measured 1.29–1.66× fp16 on reducing 1×1 shapes at "
        "batch 32, FIELD-NOTES §4), and an extra kernel per layer costs about as much as the layer.\n";
  if (r.contains("failed_builds") && !r["failed_builds"].empty()) {
    md << "\n## Variants not built\n\n| variant | opt level | error |\n|---|---|---|\n";
    for (const auto& f : r["failed_builds"])
      md << "| " << f["precision"].get<std::string>() << " | " << f["opt_level"] << " | " << f["error"].get<std::string>() << " |\n";
  }
  md << "\n## Not in this report yet\n\n"
     << (detection ? "mAP per variant (run `kiln eval BUNDLE --coco FILE --images DIR` on the bundles in `" +
                         r.value("bundles_dir", std::string("bundles")) + "`); the RT-DETR v2 part table.\n"
                   : acc.is_object() ? "Nothing listed.\n" : "Accuracy against labels (`--accuracy DIR`).\n");
  return md.str();
}

void report_from(const std::string& path, const std::string& out_dir) {
  nlohmann::json r;
  try {
    const std::vector<uint8_t> bytes = read_file_bytes(path);
    r = nlohmann::json::parse(bytes.begin(), bytes.end());
  } catch (const nlohmann::json::exception& e) {
    fail_input(path, ": not a study.json (", e.what(), ")");
  }
  std::string md;
  try {
    md = render_report(r);
  } catch (const nlohmann::json::exception& e) {
    fail_input(path, ": not a study.json of kiln study quant (", e.what(), ")");
  }
  const fs::path dir = out_dir.empty() ? fs::path(path).parent_path() : fs::path(out_dir);
  if (!dir.empty()) fs::create_directories(dir);
  write_text(dir / "REPORT.md", md);
  std::cout << "wrote " << (dir / "REPORT.md").string() << "\n";
}

// Each recipe file's precision ("fp8", "int8"), read once before anything is
// built (a file the strict reader refuses stops the study there).
using RecipePrecisions = std::map<std::string, std::string>;

// Whether recipe r (a file names its precision) builds precision p's variant.
bool recipe_fits(const RecipePrecisions& rp, const std::string& p, const std::string& r) {
  return is_default_recipe(r) || rp.at(r) == p;
}

// The report's recipe line: the one recipe, or each variant label's file.
std::string recipe_text(const StudyOptions& o, const RecipePrecisions& rp) {
  const std::string def = "default (every conv/linear minus the default exclusions)";
  if (o.recipes.size() <= 1) return o.recipes.empty() || is_default_recipe(o.recipes[0]) ? def : o.recipes[0];
  std::string s;
  for (const std::string& p : o.precisions) {
    for (const std::string& r : o.recipes)
      if (recipe_fits(rp, p, r)) s += (s.empty() ? "" : "; ") + variant_label(o, p, r) + " = " + (is_default_recipe(r) ? def : r);
  }
  return s;
}

void run_study(const StudyOptions& o) {
  if (o.calib.empty()) fail_usage("study quant needs --calib DIR (calibration images)");
  if (o.batches.empty() || o.opt_levels.empty()) fail_usage("--batch and --opt-level need at least one value");
  for (const auto& p : o.precisions)
    if (p != "fp8" && p != "int8") fail_usage("--precisions: '", p, "' is not fp8 or int8");
  std::set<std::string> labels;
  RecipePrecisions recipe_precisions;
  for (const std::string& r : o.recipes) {
    if (!is_default_recipe(r) && !fs::is_regular_file(r)) fail_input(r, ": no such recipe file");
    if (!is_default_recipe(r)) recipe_precisions[r] = quant::precision_name(quant::read_recipe(r).precision);
    if (!labels.insert(variant_label(o, "fp8", r)).second)
      fail_usage("--recipe: two recipes share the label '", variant_label(o, "fp8", r), "' (give the files different names)");
  }
  for (const std::string& d : {o.calib, o.images, o.accuracy})  // before anything is built or written
    if (!d.empty() && !fs::is_directory(d)) fail_input(d, ": not a folder of images");
  const fs::path dir = o.out.empty() ? fs::path("study_quant_" + fs::path(o.model).filename().string()) : fs::path(o.out);
  fs::create_directories(dir);
  const fs::path work = dir / "bundles";
  fs::create_directories(work);
  std::ostream* log = o.quiet ? nullptr : &std::cerr;
  auto say = [&](const std::string& s) {
    if (log) *log << "study: " << s << "\n";
  };

  // 1. Variants.
  std::vector<Variant> variants;
  say("building fp32 (the quality reference)");
  const Variant ref = build_variant(o, "fp32", 1, work);
  for (int opt : o.opt_levels)
    for (const std::string& p : std::vector<std::string>{o.base}) {
      say("building " + p + " at opt level " + std::to_string(opt));
      variants.push_back(build_variant(o, p, opt, work));
    }
  const std::vector<std::string> recipes = o.recipes.empty() ? std::vector<std::string>{""} : o.recipes;
  nlohmann::json failed = nlohmann::json::array();  // 8-bit variants that could not be built
  for (int opt : o.opt_levels)
    for (const std::string& p : o.precisions) {
      for (const std::string& rf : recipes) {
        // A recipe names its precision: an fp8 recipe builds no int8 variant (and the reverse).
        if (!recipe_fits(recipe_precisions, p, rf)) {
          if (opt == o.opt_levels.front()) say(variant_label(o, p, rf) + " skipped: " + rf + " is a recipe of another precision");
          continue;
        }
        say("building " + variant_label(o, p, rf) + " at opt level " + std::to_string(opt));
        // An 8-bit variant that cannot be built (a layer no engine takes, say) is reported, and
        // the study goes on with the others: a study is a comparison, not one build.
        try {
          variants.push_back(build_variant(o, p, opt, work, rf));
        } catch (const Error& e) {
          say(variant_label(o, p, rf) + " at opt level " + std::to_string(opt) + " not built: " + e.what());
          failed.push_back({{"precision", variant_label(o, p, rf)}, {"opt_level", opt}, {"error", e.what()}});
        }
      }
    }

  // 2. Speed: per opt level and batch, every variant interleaved round by round.
  nlohmann::json speed = nlohmann::json::array();
  std::map<std::string, nlohmann::json> profiles;  // precision -> profile_json
  for (int opt : o.opt_levels)
    for (int batch : o.batches) {
      struct Run {
        const Variant* v;
        std::shared_ptr<const Engine> e;
        std::unique_ptr<ExecutionContext> ctx;
        std::vector<Tensor> in;
        std::vector<double> ms;
      };
      std::vector<Run> runs;
      for (const Variant& v : variants) {
        if (v.opt_level != opt) continue;
        Run r{&v, Engine::load(v.bundle.string(), LoadOptions{o.backend, nullptr}), nullptr, {}, {}};
        r.ctx = r.e->create_context();
        std::mt19937 rng(7);
        std::uniform_real_distribution<float> u(-2.f, 2.f);
        for (const auto& t : r.e->inputs()) {
          Shape s = t.shape;
          s[0] = batch;
          std::vector<float> d(static_cast<size_t>(shape_numel(s)));
          for (auto& x : d) x = u(rng);
          r.in.push_back({t.name, s, std::move(d)});
        }
        r.ctx->run(r.in);  // plans this batch (never timed)
        runs.push_back(std::move(r));
      }
      say("timing batch " + std::to_string(batch) + " at opt level " + std::to_string(opt));
      for (int round = 0; round < o.rounds; ++round)
        for (Run& r : runs) r.ms.push_back(timed_engine_call_ms(*r.ctx, r.in));
      // Where the time goes (the last opt level, the last batch: where 8-bit bytes pay): layers run one by one.
      if (opt == o.opt_levels.back() && batch == o.batches.back())
        for (Run& r : runs)
          profiles[r.v->precision] =
              profile_json(*r.ctx, r.in, std::max(3, o.rounds / 3), LayerGrouping::of_family(r.e->family()));
      double base_ms = 0;
      for (Run& r : runs)
        if (r.v->precision == o.base) base_ms = median(r.ms);
      for (Run& r : runs)
        speed.push_back({{"precision", r.v->precision},
                         {"opt_level", opt},
                         {"batch", batch},
                         {"median_ms", median(r.ms)},
                         {"min_ms", *std::min_element(r.ms.begin(), r.ms.end())},
                         {"speedup_over_" + o.base, base_ms > 0 ? base_ms / median(r.ms) : 0.0},
                         {"kernels_per_call", kernels_per_call(*r.ctx)},
                         {"plan_mib", double(r.v->bytes) / (1 << 20)}});
    }

  // 3. Quality against the fp32 engine on real images, 4. non-finite scan.
  const std::vector<std::string> files = image_files(o.images.empty() ? o.calib : o.images, o.quality_images);
  if (files.empty()) fail_input(o.images.empty() ? o.calib : o.images, ": no .jpg/.png images for the quality check");
  const auto ref_engine = Engine::load(ref.bundle.string(), LoadOptions{o.backend, nullptr});
  const bool detection = ref_engine->task() == "detection";
  if (detection && !o.accuracy.empty())
    fail_usage("--accuracy takes an ImageFolder of a classifier; for a detector run kiln eval --coco on each bundle in ",
               work.string());
  nlohmann::json quality = nlohmann::json::array();
  EvalSet labelled;
  double ref_accuracy = 0;
  if (detection) {
    Detector ref_det(ref_engine);
    std::vector<DetectionInput> in;
    for (const auto& f : files) in.push_back(ref_det.preprocess_file(f));
    const DetectionRun ref_run = detection_run(*ref_engine, ref_det, in);
    const auto stress = stress_inputs(in.at(0).pixels.size());
    for (const Variant& v : variants) {
      if (v.opt_level != o.opt_levels.back()) continue;  // numbers do not depend on timing; one opt level suffices
      nlohmann::json q = detection_quality(*Engine::load(v.bundle.string(), LoadOptions{o.backend, nullptr}), ref_run, in, stress);
      q["precision"] = v.precision;
      quality.push_back(std::move(q));
    }
  } else {
    Classifier ref_clf(ref_engine);
    std::vector<std::vector<float>> pixels;
    for (const auto& f : files) pixels.push_back(ref_clf.preprocess_file(f));
    const auto ref_logits = logits_of(ref_clf, pixels);
    const auto stress = stress_inputs(pixels.at(0).size());
    std::vector<std::unique_ptr<Classifier>> checked;  // the variants of the last opt level, in `quality` order
    for (const Variant& v : variants) {
      if (v.opt_level != o.opt_levels.back()) continue;  // numbers do not depend on timing; one opt level suffices
      checked.push_back(std::make_unique<Classifier>(Engine::load(v.bundle.string(), LoadOptions{o.backend, nullptr})));
      Classifier& clf = *checked.back();
      const Quality q = compare(ref_logits, logits_of(clf, pixels));
      nlohmann::json nonfinite = nlohmann::json::object();
      for (const auto& [name, px] : stress) {
        const auto lg = clf.classify_preprocessed(px, 1, 1).at(0).logits;
        nonfinite[name] = std::count_if(lg.begin(), lg.end(), [](float x) { return !std::isfinite(x); });
      }
      quality.push_back({{"precision", v.precision},
                         {"top1_agreement", q.top1_agree},
                         {"min_cosine", q.min_cosine},
                         {"max_diff_rel", q.max_diff_rel},
                         {"images", files.size()},
                         {"nonfinite_outputs", nonfinite}});
    }
    if (!o.accuracy.empty()) {
      labelled = read_image_folder(o.accuracy, ref_clf.engine().labels());
      std::vector<Classifier*> all{&ref_clf};
      for (auto& c : checked) all.push_back(c.get());
      const std::vector<double> acc = accuracies(all, labelled);
      ref_accuracy = acc[0];
      for (size_t k = 0; k < checked.size(); ++k) quality[k]["accuracy"] = acc[k + 1];
    }
  }
  nlohmann::json result = {{"model", o.model},
                           {"backend", o.backend},
                           {"base", o.base},
                           {"batches", o.batches},
                           {"opt_levels", o.opt_levels},
                           {"rounds", o.rounds},
                           {"calib", o.calib},
                           {"calib_images", o.calib_images},
                           {"recipe", recipe_text(o, recipe_precisions)},
                           {"quality_images", files.size()},
                           {"accuracy_set", o.accuracy.empty() ? nlohmann::json() : nlohmann::json{{"folder", o.accuracy},
                                                                                               {"images", labelled.items.size()},
                                                                                               {"fp32_accuracy", ref_accuracy}}},
                           {"speed", speed},
                           {"profiles", profiles},
                           {"profile_batch", o.batches.back()},
                           {"quality", quality},
                           {"command", o.command},
                           {"kiln_version", KILN_VERSION},
                           {"task", detection ? "detection" : "classification"},
                           {"quality_folder", o.images.empty() ? o.calib : o.images},
                           {"calib_method", o.calib_method},
                           {"bundles_dir", work.string()}};
  result["failed_builds"] = failed;
  for (const Variant& v : variants)
    result["builds"].push_back({{"precision", v.precision}, {"opt_level", v.opt_level}, {"bundle", v.bundle.string()},
                                {"bytes", v.bytes}, {"seconds", v.build_s}});

  // 5. The report.
  write_text(dir / "REPORT.md", render_report(result));
  write_text(dir / "study.json", result.dump(1) + "\n");
  if (o.json) std::cout << result.dump(2) << "\n";
  else std::cout << "wrote " << (dir / "REPORT.md").string() << " and " << (dir / "study.json").string() << "\n";
}

}  // namespace

void add_study(CLI::App& app) {
  auto* study = app.add_subcommand("study", "Reproducible studies");
  study->require_subcommand(1);
  auto o = std::make_shared<StudyOptions>();
  auto* sub = study->add_subcommand("quant", "FP8/INT8 against 16 bits: speed, plan size, quality, a Markdown report");
  sub->add_option("model", o->model, "Checkpoint directory (as kiln build takes it)");
  sub->add_option("--calib", o->calib, "Calibration images (.jpg/.png); also the quality images unless --images");
  sub->add_option("--report-from", o->report_from,
                  "Only re-render REPORT.md beside this study.json (nothing is built or timed; the numbers are that run's)");
  sub->add_option("--images", o->images, "Images for the quality check (default: --calib's)");
  sub->add_option("--accuracy", o->accuracy, "ImageFolder (class folders named by the bundle's labels): top-1 accuracy per variant");
  sub->add_option("--backend", o->backend, "cpu or cuda")->check(CLI::IsMember({"cpu", "cuda"}));
  sub->add_option("--batch", o->batches, "Batch sizes to time (comma-separated, default 1,32)")->delimiter(',');
  sub->add_option("--opt-level", o->opt_levels, "Opt levels to build and time (default 1,3)")->delimiter(',');
  sub->add_option("--precisions", o->precisions, "8-bit precisions (default fp8,int8)")->delimiter(',');
  sub->add_option("--base", o->base, "The 16-bit precision compared against")->check(CLI::IsMember({"fp16", "bf16"}));
  sub->add_option("--recipe", o->recipes,
                  "Recipe file (default: every conv/linear minus the default exclusions); repeat or comma-separate to compare "
                  "recipes in one run (\"default\" names the default recipe)")
      ->delimiter(',');
  sub->add_option("--calib-method", o->calib_method, "max | percentile | entropy | mse (default: the recipe's)");
  sub->add_option("--calib-images", o->calib_images, "Calibration images used (default 32)");
  sub->add_option("--quality-images", o->quality_images, "Images for the quality check (default 32)");
  sub->add_option("--rounds", o->rounds, "Timing rounds (default 30)");
  sub->add_option("-o,--out", o->out, "Output folder (default study_quant_<model>)");
  sub->add_flag("--json", o->json, "Print study.json");
  sub->add_flag("--quiet", o->quiet, "No progress lines");
  sub->callback([o] {
    if (!o->report_from.empty()) return report_from(o->report_from, o->out);
    if (o->model.empty()) fail_usage("study quant needs a MODEL directory (or --report-from study.json)");
    if (o->calib.empty()) fail_usage("study quant needs --calib DIR");
    auto join = [](const auto& v) {
      std::string s;
      for (const auto& x : v) {
        std::ostringstream one;
        one << x;
        s += (s.empty() ? "" : ",") + one.str();
      }
      return s;
    };
    o->command = "kiln study quant " + o->model + " --calib " + o->calib + (o->images.empty() ? "" : " --images " + o->images) +
                 (o->accuracy.empty() ? "" : " --accuracy " + o->accuracy) + " --backend " + o->backend + " --batch " + join(o->batches) + " --opt-level " + join(o->opt_levels) +
                 " --precisions " + join(o->precisions) + " --base " + o->base + " --rounds " + std::to_string(o->rounds) +
                 (o->recipes.empty() ? "" : " --recipe " + join(o->recipes)) +
                 (o->calib_method.empty() ? "" : " --calib-method " + o->calib_method) +
                 " --calib-images " + std::to_string(o->calib_images) + " --quality-images " + std::to_string(o->quality_images);
    run_study(*o);
  });
}

}  // namespace kiln::cli
