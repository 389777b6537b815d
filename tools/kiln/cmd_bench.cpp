// kiln bench: engine time and task time of one or more bundles, interleaved
// round by round so drift hits every candidate alike (docs/benchmarking.md).
#include <algorithm>
#include <chrono>
#include <iomanip>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>

#include "commands.hpp"
#include "bench_json.hpp"
#include "profile_json.hpp"
#include "core/error.hpp"
#include "image/image.hpp"
#include "runtime/engine_impl.hpp"

namespace kiln::cli {

namespace {

double percentile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  if (v.empty()) return 0;
  double pos = q * (v.size() - 1);
  size_t lo = static_cast<size_t>(pos);
  size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (pos - lo);
}

// TRTMC's stability rule: medians of the first and last 5 samples within 5 %.
bool stable(const std::vector<double>& v) {
  if (v.size() < 10) return false;
  double a = percentile({v.begin(), v.begin() + 5}, 0.5), b = percentile({v.end() - 5, v.end()}, 0.5);
  return std::abs(a - b) <= 0.05 * std::max(a, b);
}

struct Candidate {
  std::string path;
  std::shared_ptr<const Engine> engine;
  std::unique_ptr<ExecutionContext> ctx;
  std::unique_ptr<Classifier> classifier;
  std::vector<Tensor> inputs;
  std::vector<double> engine_ms, task_ms;
  std::vector<double> task_decoded_ms;  // --image: the same call from its decoded pixels (decode excluded)
  double load_ms = 0, first_call_ms = 0;  // Engine::load + create_context; first run at this batch
  double create_context_ms = 0;
  std::vector<TaskTimings> task_stages;  // per timed task call
};

// The (at most) n entries of `items` with the largest `key`, largest first.
std::vector<nlohmann::json> largest(const nlohmann::json& items, const char* key, size_t n) {
  std::vector<nlohmann::json> top(items.begin(), items.end());
  std::sort(top.begin(), top.end(), [key](const nlohmann::json& a, const nlohmann::json& b) { return a[key].get<double>() > b[key].get<double>(); });
  if (top.size() > n) top.resize(n);
  return top;
}

void print_profile(const nlohmann::json& p) {
  std::cout << "  per-layer profile (" << p["rounds"].get<int>() << " rounds, layers run one by one: total "
            << p["total_ms"].get<double>() << " ms)\n";
  if (p.contains("kernels_unavailable"))
    std::cout << "    kernel names unavailable (the times stand): " << p["kernels_unavailable"].get<std::string>() << "\n";
  for (const auto& g : p["groups"]) {
    std::cout << "    " << std::left << std::setw(24) << g["group"].get<std::string>() << std::right << std::setw(10)
              << g["ms"].get<double>() << " ms";
    if (g.contains("kernels")) std::cout << ", " << g["kernels"].get<int>() << " kernels";
    std::cout << "\n";
  }
  const auto top = largest(p["layers"], "ms", 10);
  std::cout << "    slowest layers:\n";
  for (size_t i = 0; i < top.size(); ++i)
    std::cout << "      " << std::left << std::setw(32) << top[i]["name"].get<std::string>() << std::right << std::setw(10)
              << top[i]["ms"].get<double>() << " ms\n";
  const auto census = kernel_census(p);
  if (census.empty()) return;
  std::cout << "    launches per call by kernel:\n";
  for (const auto& [name, n] : census) std::cout << "      " << std::setw(4) << n << "  " << name << "\n";
}

void print_trace(const nlohmann::json& t) {
  if (t.contains("unavailable")) {
    std::cout << "  trace unavailable: " << t["unavailable"].get<std::string>() << "\n";
    return;
  }
  std::cout << std::setprecision(1) << "  in-graph trace (CUPTI, the last of " << t["replays"].get<int>()
            << " replays): " << t["launches"].get<size_t>() << " launches, " << t["span_us"].get<double>()
            << " us first start to last end, " << t["busy_us"].get<double>() << " us in launches, "
            << t["gaps_us"].get<double>() << " us of gaps\n";
  if (t.contains("note")) std::cout << "    " << t["note"].get<std::string>() << "\n";
  for (const auto& l : t.value("lanes", nlohmann::json::array()))
    std::cout << "    " << l["lane"].get<std::string>() << " lane: " << l["launches"].get<int>() << " launches, "
              << l["busy_us"].get<double>() << " us busy, " << l["alone_us"].get<double>()
              << " us with no launch of the other lane running\n";
  if (!t.value("side_alone", nlohmann::json::array()).empty()) {
    std::cout << "    side-lane launches running alone (the main lane waited):\n";
    for (const auto& a : t["side_alone"])
      std::cout << "      " << std::setw(8) << a["alone_us"].get<double>() << " us  " << a["step"].get<std::string>() << "\n";
  }
  for (const auto& g : t["groups"])
    std::cout << "    " << std::left << std::setw(28) << g["group"].get<std::string>() << std::right << std::setw(9)
              << g["us"].get<double>() << " us (" << g["busy_us"].get<double>() << " busy, " << g["launches"].get<int>()
              << " launches)\n";
  const auto top = largest(t["spans"], "us", 15);
  std::cout << "    longest launches:\n";
  for (size_t i = 0; i < top.size(); ++i)
    std::cout << "      " << std::setw(8) << top[i]["us"].get<double>() << " us  " << std::left << std::setw(40)
              << top[i]["step"].get<std::string>() << std::right << " " << top[i]["kernel"].get<std::string>()
              << (top[i].value("lane", "") == "side" ? "  (side lane)" : "") << "\n";
  std::cout << std::setprecision(3);
}

}  // namespace

void add_bench(CLI::App& app) {
  struct Opts {
    std::vector<std::string> bundles;
    std::string backend, image;
    int batch = 1, iterations = 200, warmup = 20;
    bool json = false, task = true;
    int profile = 0;
    int trace = 0;
  };
  auto o = std::make_shared<Opts>();
  auto* sub = app.add_subcommand("bench", "Time bundles side by side (engine time and task time)");
  sub->add_option("bundles", o->bundles, "Bundle files")->required();
  add_load_backend_option(sub, o->backend);
  sub->add_option("--batch", o->batch, "Batch size")->check(CLI::Range(1, 4096));
  sub->add_option("--iterations", o->iterations, "Timed rounds")->check(CLI::Range(10, 1000000));
  sub->add_option("--warmup", o->warmup, "Untimed rounds first")->check(CLI::Range(0, 100000));
  sub->add_flag("!--no-task", o->task, "Skip the task-time measurement");
  sub->add_option("--image", o->image, "Time the task on this file, decode included (default: a synthetic 640x480 image, no decode)");
  sub->add_flag("--json", o->json, "JSON output");
  sub->add_option("--profile", o->profile, "Also time every layer on its own over N rounds, summed per layer group (the family's, else by name prefix)")
      ->check(CLI::Range(0, 100000));
  sub->add_option("--trace", o->trace,
                  "Also trace N graph replays with CUPTI and show the last one's launches as the GPU ran them "
                  "(start, duration, gaps; CUDA)")
      ->check(CLI::Range(0, 1000));
  sub->callback([o] {
    std::vector<Candidate> cands;
    std::mt19937 rng(0);
    std::normal_distribution<float> nd;
    for (const auto& path : o->bundles) {
      Candidate c;
      c.path = path;
      const auto t0 = std::chrono::steady_clock::now();
      c.engine = Engine::load(path, LoadOptions{o->backend, &std::cerr});
      const auto tc = std::chrono::steady_clock::now();
      c.ctx = c.engine->create_context();
      c.load_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      c.create_context_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - tc).count();
      for (const auto& in : c.engine->inputs()) {
        Tensor t{in.name, in.shape, {}};
        t.shape[0] = o->batch;
        t.data.resize(static_cast<size_t>(shape_numel(t.shape)));
        for (auto& v : t.data) v = nd(rng);
        c.inputs.push_back(std::move(t));
      }
      if (o->task && c.engine->task() == "classification") c.classifier = std::make_unique<Classifier>(c.engine);
      // The first call at this batch plans it (and on the GPU captures its graph): timed apart.
      const auto t1 = std::chrono::steady_clock::now();
      c.ctx->run(c.inputs);
      c.first_call_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t1).count();
      cands.push_back(std::move(c));
    }
    // A synthetic 640x480 photo-sized image for the task path (decode excluded); with --image, that
    // file's pixels, decoded once here, so the same call is also timed without its decode.
    int rgb_w = 640, rgb_h = 480;
    std::vector<uint8_t> rgb(static_cast<size_t>(rgb_w) * rgb_h * 3);
    for (auto& v : rgb) v = static_cast<uint8_t>(rng() & 0xff);
    if (!o->image.empty()) {
      ImageU8 img = decode_image(o->image);
      rgb_w = img.width;
      rgb_h = img.height;
      rgb = std::move(img.rgb);
    }
    for (int r = 0; r < o->warmup + o->iterations; ++r) {
      for (auto& c : cands) {
        double ms = timed_engine_call_ms(*c.ctx, c.inputs);
        if (r >= o->warmup) c.engine_ms.push_back(ms);
        if (c.classifier && o->batch == 1) {
          auto t0 = std::chrono::steady_clock::now();
          if (o->image.empty()) c.classifier->classify_rgb(rgb_w, rgb_h, rgb.data(), 5);
          else c.classifier->classify_file(o->image, 5);
          double t = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
          if (r >= o->warmup) {
            c.task_ms.push_back(t);
            c.task_stages.push_back(c.classifier->last_timings());
          }
          if (!o->image.empty()) {
            t0 = std::chrono::steady_clock::now();
            c.classifier->classify_rgb(rgb_w, rgb_h, rgb.data(), 5);
            t = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
            if (r >= o->warmup) c.task_decoded_ms.push_back(t);
          }
        }
      }
    }
    nlohmann::json results = nlohmann::json::array();
    for (auto& c : cands) {
      nlohmann::json task = nullptr;
      nlohmann::json stages = nullptr;
      if (!c.task_ms.empty()) {
        task = {{"p50", percentile(c.task_ms, 0.5)}, {"p95", percentile(c.task_ms, 0.95)}};
        // Medians per stage (they need not add up to the task median exactly).
        const auto median_of = [&](double TaskTimings::*field) {
          std::vector<double> v;
          for (const auto& s : c.task_stages) v.push_back(s.*field);
          return percentile(v, 0.5);
        };
        stages = {{"decode", median_of(&TaskTimings::decode_ms)},
                  {"preprocess", median_of(&TaskTimings::preprocess_ms)},
                  {"copies", median_of(&TaskTimings::copy_ms)},
                  {"engine", median_of(&TaskTimings::engine_ms)},
                  {"postprocess", median_of(&TaskTimings::postprocess_ms)},
                  {"input", o->image.empty() ? "synthetic 640x480 RGB (no decode)" : o->image}};
      }
      nlohmann::json task_decoded = nullptr;
      if (!c.task_decoded_ms.empty())
        task_decoded = {{"p50", percentile(c.task_decoded_ms, 0.5)}, {"p95", percentile(c.task_decoded_ms, 0.95)},
                        {"input", o->image + " (" + std::to_string(rgb_w) + "x" + std::to_string(rgb_h) +
                                      ", decoded once before timing)"}};
      results.push_back({{"bundle", c.path},
                         {"backend", c.engine->backend()},
                         {"precision", c.engine->precision()},
                         {"batch", o->batch},
                         {"engine_ms",
                          {{"median", percentile(c.engine_ms, 0.5)},
                           {"p10", percentile(c.engine_ms, 0.1)},
                           {"p90", percentile(c.engine_ms, 0.9)}}},
                         {"task_ms", task},
                         {"task_breakdown_ms", stages},
                         {"task_decode_excluded_ms", task_decoded},
                         {"kernels_per_call", kernels_per_call(*c.ctx)},
                         {"load_ms", c.load_ms},
                         {"load_breakdown_ms", breakdown_json(c.engine->impl().load_phases, c.create_context_ms)},
                         {"first_call_ms", c.first_call_ms},
                         {"first_call_breakdown_ms", breakdown_json(first_call_phases(*c.ctx), -1)},
                         {"stable", stable(c.engine_ms)}});
      const LayerGrouping grouping = LayerGrouping::of_family(c.engine->family());
      if (o->profile > 0) results.back()["profile"] = profile_json(*c.ctx, c.inputs, o->profile, grouping);
      if (o->trace > 0) results.back()["trace"] = trace_json(trace_call(*c.ctx, c.inputs, o->trace), grouping);
    }
    if (o->json) {
      std::cout << nlohmann::json{{"device", cands[0].engine->backend() == "cpu" ? "cpu" : "gpu"}, {"iterations", o->iterations},
                                  {"warmup", o->warmup}, {"results", results}}
                       .dump(2)
                << "\n";
      return;
    }
    std::cout << std::fixed << std::setprecision(3);
    for (const auto& r : results) {
      std::cout << r["bundle"].get<std::string>() << " (" << r["backend"].get<std::string>() << ", "
                << r["precision"].get<std::string>() << ", batch " << o->batch << "): engine median "
                << r["engine_ms"]["median"].get<double>() << " ms (p10 " << r["engine_ms"]["p10"].get<double>() << ", p90 "
                << r["engine_ms"]["p90"].get<double>() << "), " << r["kernels_per_call"].get<size_t>() << " kernels/call";
      if (!r["task_ms"].is_null())
        std::cout << "; task p50 " << r["task_ms"]["p50"].get<double>() << " ms, p95 " << r["task_ms"]["p95"].get<double>()
                  << " (decode " << r["task_breakdown_ms"]["decode"].get<double>() << ", pre-process "
                  << r["task_breakdown_ms"]["preprocess"].get<double>() << ", copies "
                  << r["task_breakdown_ms"]["copies"].get<double>() << ", engine "
                  << r["task_breakdown_ms"]["engine"].get<double>() << ", post-process "
                  << r["task_breakdown_ms"]["postprocess"].get<double>() << ")";
      if (!r["task_decode_excluded_ms"].is_null())
        std::cout << "; decode excluded p50 " << r["task_decode_excluded_ms"]["p50"].get<double>() << " ms, p95 "
                  << r["task_decode_excluded_ms"]["p95"].get<double>();
      std::cout << (r["stable"].get<bool>() ? "" : "  [unstable]") << "\n";
      if (r.contains("profile")) print_profile(r["profile"]);
      if (r.contains("trace")) print_trace(r["trace"]);
    }
  });
}

}  // namespace kiln::cli
