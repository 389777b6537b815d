// kiln eval BUNDLE --dataset DIR | --labels FILE [--images DIR]: top-1 and
// top-5 accuracy of a classification bundle; --coco FILE --images DIR: COCO
// box mAP of a detection bundle (cmd_eval_coco.cpp). DIR is an ImageFolder tree (class id = position of the
// folder name in sorted order, as torchvision assigns it, or the bundle's
// label of that name); FILE has one "path class_id" per line.
//
// Images are decoded and pre-processed on worker threads ahead of the engine
// (bounded window, strict input order: the same numbers as one thread). An
// unreadable image is counted, listed and left out of the accuracy; with
// --strict the first one is fatal.
#include <algorithm>
#include <chrono>
#include <iomanip>
#include <iostream>
#include <thread>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "core/error.hpp"
#include "core/progress.hpp"
#include "kiln/kiln.hpp"
#include "tasks/eval_set.hpp"
#include "tasks/preprocess_ahead.hpp"

namespace kiln::cli {

void add_eval(CLI::App& app) {
  struct Opts {
    std::string backend;
    std::string bundle, dataset, labels, images, coco, detections_out;
    float score_threshold = 0.f;
    int batch = 16, threads = 0;
    size_t limit = 0;
    bool json = false, strict = false, quiet = false;
  };
  auto o = std::make_shared<Opts>();
  auto* sub = app.add_subcommand("eval", "Top-1/top-5 accuracy of a classification bundle (ImageFolder tree or label file), "
                                "or COCO box mAP of a detection bundle (--coco)");
  sub->add_option("bundle", o->bundle, "Bundle file")->required();
  add_load_backend_option(sub, o->backend);
  auto* dataset = sub->add_option("--dataset", o->dataset, "Directory with one subfolder per class");
  auto* labels = sub->add_option("--labels", o->labels, "Label file: one 'path class_id' per line");
  auto* coco = sub->add_option("--coco", o->coco, "COCO instances file (detection bundles): mAP with pycocotools' rules");
  dataset->excludes(labels);
  coco->excludes(dataset)->excludes(labels);
  sub->add_option("--images", o->images,
                  "Folder the label file's or COCO file's image paths are relative to (default: that file's folder)");
  sub->add_option("--score-threshold", o->score_threshold, "--coco: keep detections scoring above this (default 0)")
      ->check(CLI::Range(0.0, 1.0));
  sub->add_option("--detections-out", o->detections_out, "--coco: also write the detections as a COCO results file");
  sub->add_option("--limit", o->limit, "Evaluate only the first N images")->check(CLI::PositiveNumber);
  sub->add_option("--batch", o->batch, "Images per engine call")->check(CLI::Range(1, 4096));
  sub->add_option("--threads", o->threads, "Decode threads (default: cores, at most 8)")->check(CLI::Range(1, 256));
  sub->add_flag("--strict", o->strict, "Stop at the first unreadable image (exit code 2)");
  sub->add_flag("--quiet", o->quiet, "No progress bar");
  sub->add_flag("--json", o->json, "JSON output (keys top1, top5, images, errors)");
  sub->callback([o] {
    if (!o->coco.empty()) {
      run_coco_eval({o->bundle, o->backend, o->coco, o->images, o->detections_out, o->batch, o->threads, o->limit,
                     o->score_threshold, o->json, o->strict, o->quiet});
      return;
    }
    if (!o->detections_out.empty()) fail_usage("--detections-out goes with --coco");
    if (!o->images.empty() && o->labels.empty()) fail_usage("--images goes with --labels or --coco");
    if (o->dataset.empty() && o->labels.empty()) fail_usage("eval needs --dataset DIR, --labels FILE or --coco FILE");
    Classifier clf(Engine::load(o->bundle, LoadOptions{o->backend, &std::cerr}));
    const auto& names = clf.engine().labels();
    EvalSet set = o->labels.empty() ? read_image_folder(o->dataset, names)
                                    : read_label_file(o->labels, o->images, static_cast<int>(names.size()));
    if (o->limit && o->limit < set.items.size()) set.items.resize(o->limit);
    const size_t n = set.items.size();
    const int threads = o->threads ? o->threads : std::clamp<int>(std::thread::hardware_concurrency(), 1, 8);
    const size_t batch = static_cast<size_t>(o->batch);
    // Workers decode (and on CPU engines pre-process) ahead; CUDA engines
    // pre-process each batch on the GPU (Classifier::classify_prepared).
    PreprocessAhead<std::shared_ptr<PreparedImage>> ahead(n, [&](size_t i) { return clf.prepare_file(set.items[i].path); },
                                                          threads, 2 * batch + threads);
    ProgressBar bar("eval", static_cast<int64_t>(n), stderr_is_tty() && !o->json && !o->quiet, std::cerr, "img");

    size_t correct1 = 0, correct5 = 0, evaluated = 0;
    nlohmann::json errors = nlohmann::json::array();
    // The first batch pays for planning its batch size (cuDNN plan builds,
    // graph capture): reported apart, so the steady rate is visible too.
    std::chrono::steady_clock::time_point first_batch_end{};
    size_t first_batch_images = 0;
    std::vector<std::shared_ptr<PreparedImage>> pending;
    std::vector<int> truth;
    const auto flush = [&] {
      if (truth.empty()) return;
      const auto results = clf.classify_prepared(pending, 5);
      for (size_t k = 0; k < results.size(); ++k) {
        const auto& top = results[k].top_k;
        correct1 += !top.empty() && top[0].class_id == truth[k];
        correct5 += std::any_of(top.begin(), top.end(), [&](const Prediction& p) { return p.class_id == truth[k]; });
      }
      evaluated += truth.size();
      if (first_batch_end == std::chrono::steady_clock::time_point{}) {
        first_batch_end = std::chrono::steady_clock::now();
        first_batch_images = truth.size();
      }
      pending.clear();
      truth.clear();
    };
    const auto t0 = std::chrono::steady_clock::now();
    for (size_t i = 0; i < n; ++i) {
      auto item = ahead.take(i);
      if (!item.error.empty()) {
        if (o->strict) fail_input(item.error, " (--strict)");
        errors.push_back({{"path", set.items[i].path}, {"error", item.error}});
      } else {
        pending.push_back(std::move(item.pixels));
        truth.push_back(set.items[i].class_id);
        if (truth.size() == batch) flush();
      }
      bar.update(static_cast<int64_t>(i + 1));
    }
    flush();
    bar.finish();
    const auto t_end = std::chrono::steady_clock::now();
    const double secs = std::chrono::duration<double>(t_end - t0).count();
    const double first_secs = std::chrono::duration<double>(first_batch_end - t0).count();
    const size_t after_first = evaluated - first_batch_images;
    // Milliseconds per image after the first batch (0 when there was only one batch).
    const double steady_ms = after_first ? 1e3 * std::chrono::duration<double>(t_end - first_batch_end).count() / after_first : 0.0;
    if (evaluated == 0)
      fail_input("none of the ", n, " images could be read; first: ", errors[0]["error"].get<std::string>());
    const double top1 = static_cast<double>(correct1) / evaluated, top5 = static_cast<double>(correct5) / evaluated;
    if (o->json) {
      std::cout << nlohmann::json{{"top1", top1},
                                  {"top5", top5},
                                  {"correct", correct1},
                                  {"correct_top5", correct5},
                                  {"images", evaluated},
                                  {"failed", errors.size()},
                                  {"errors", errors},
                                  {"classes", set.classes},
                                  {"batch", o->batch},
                                  {"threads", threads},
                                  {"preprocess", clf.preprocesses_on_device() ? "device" : "host"},
                                  {"backend", clf.engine().backend()},
                                  {"seconds", secs},
                                  {"ms_per_image", 1e3 * secs / evaluated},
                                  {"first_batch_seconds", first_secs},
                                  {"ms_per_image_after_first_batch", steady_ms}}
                       .dump(2)
                << "\n";
    } else {
      std::cout << "top-1 " << std::fixed << std::setprecision(4) << top1 << " (" << correct1 << "/" << evaluated
                << "), top-5 " << top5 << " (" << correct5 << "/" << evaluated << "), " << std::setprecision(3)
                << 1e3 * secs / evaluated << " ms/image\n";
      if (!errors.empty()) {
        std::cout << errors.size() << " of " << n << " images could not be read (left out of the accuracy):\n";
        for (const auto& e : errors) std::cout << "  " << e["error"].get<std::string>() << "\n";
      }
    }
  });
}

}  // namespace kiln::cli
