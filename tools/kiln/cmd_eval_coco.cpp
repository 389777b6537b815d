// kiln eval BUNDLE --coco ANNOTATIONS.json --images DIR: COCO box mAP of a
// detection bundle with pycocotools' rules (src/tasks/coco_eval.hpp).
// Images are the annotation file's, sorted by id (--limit: the first N, and
// only those are evaluated); decoded and pre-processed on worker threads
// ahead of the engine. Detector classes map to COCO categories by name (the
// bundle's labels against the categories' names) or, when no label names a
// category, class id = category id.
#include <algorithm>
#include <chrono>
#include <iomanip>
#include <iostream>
#include <map>
#include <set>
#include <thread>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "core/error.hpp"
#include "core/file.hpp"
#include "core/progress.hpp"
#include "kiln/kiln.hpp"
#include "tasks/coco_eval.hpp"
#include "tasks/preprocess_ahead.hpp"

namespace kiln::cli {

void run_coco_eval(const CocoEvalOptions& o) {
  namespace fs = std::filesystem;
  Detector det(Engine::load(o.bundle, LoadOptions{o.backend, &std::cerr}));
  const CocoDataset gt = read_coco_dataset(o.coco);
  const fs::path dir = o.images.empty() ? fs::path(o.coco).parent_path() : fs::path(o.images);

  // class id -> category id (-1: not evaluated).
  const auto& labels = det.engine().labels();
  std::map<std::string, int64_t> by_name;
  std::set<int64_t> cat_ids;
  for (const auto& c : gt.categories) by_name.emplace(c.name, c.id), cat_ids.insert(c.id);
  std::vector<int64_t> cat_of(static_cast<size_t>(det.num_classes()), -1);
  size_t named = 0;
  for (size_t k = 0; k < cat_of.size() && k < labels.size(); ++k) {
    auto it = by_name.find(labels[k]);
    if (it != by_name.end()) cat_of[k] = it->second, ++named;
  }
  const std::string mapping = named ? "name" : "id";
  if (!named)
    for (size_t k = 0; k < cat_of.size(); ++k) cat_of[k] = cat_ids.count(static_cast<int64_t>(k)) ? static_cast<int64_t>(k) : -1;
  if (std::none_of(cat_of.begin(), cat_of.end(), [](int64_t c) { return c >= 0; }))
    fail_input(o.coco, ": no class of the bundle maps to a category (by label name or by id)");

  std::vector<const CocoImage*> images;
  for (const auto& im : gt.images) images.push_back(&im);
  std::sort(images.begin(), images.end(), [](const CocoImage* a, const CocoImage* b) { return a->id < b->id; });
  if (o.limit && o.limit < images.size()) images.resize(o.limit);
  if (images.empty()) fail_input(o.coco, ": no images to evaluate");
  const size_t n = images.size();

  // Each worker writes the size of its own image before handing it over;
  // take(i) orders that write before the read here.
  std::vector<std::pair<int, int>> sizes(n);
  const int threads = o.threads ? o.threads : std::clamp<int>(std::thread::hardware_concurrency(), 1, 8);
  const size_t batch = static_cast<size_t>(o.batch);
  PreprocessAhead ahead(
      n,
      [&](size_t i) {
        DetectionInput in = det.preprocess_file((dir / images[i]->file_name).string());
        sizes[i] = {in.image_width, in.image_height};
        return std::move(in.pixels);
      },
      threads, 2 * batch + threads);
  ProgressBar bar("eval", static_cast<int64_t>(n), stderr_is_tty() && !o.json && !o.quiet, std::cerr, "img");

  std::vector<CocoDetection> dets;
  std::vector<int64_t> evaluated_ids;
  nlohmann::json errors = nlohmann::json::array();
  std::vector<DetectionInput> pending;
  std::vector<int64_t> pending_ids;
  const auto flush = [&] {
    if (pending.empty()) return;
    const auto results = det.detect_preprocessed(pending, o.score_threshold);
    for (size_t k = 0; k < results.size(); ++k)
      for (const auto& d : results[k].boxes) {
        const int64_t cat = cat_of[static_cast<size_t>(d.class_id)];
        if (cat < 0) continue;
        dets.push_back({pending_ids[k], cat,
                        {d.x_min, d.y_min, static_cast<double>(d.x_max) - d.x_min, static_cast<double>(d.y_max) - d.y_min},
                        d.score});
      }
    pending.clear();
    pending_ids.clear();
  };
  const auto t0 = std::chrono::steady_clock::now();
  for (size_t i = 0; i < n; ++i) {
    auto item = ahead.take(i);
    const CocoImage& im = *images[i];
    if (item.error.empty() && im.width && (sizes[i].first != im.width || sizes[i].second != im.height))
      item.error = (dir / im.file_name).string() + ": image is " + std::to_string(sizes[i].first) + "x" +
                   std::to_string(sizes[i].second) + ", the annotation file says " + std::to_string(im.width) + "x" +
                   std::to_string(im.height);
    if (!item.error.empty()) {
      if (o.strict) fail_input(item.error, " (--strict)");
      errors.push_back({{"path", (dir / im.file_name).string()}, {"error", item.error}});
    } else {
      pending.push_back({std::move(item.pixels), sizes[i].first, sizes[i].second});
      pending_ids.push_back(im.id);
      evaluated_ids.push_back(im.id);
      if (pending.size() == batch) flush();
    }
    bar.update(static_cast<int64_t>(i + 1));
  }
  flush();
  bar.finish();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (evaluated_ids.empty())
    fail_input("none of the ", n, " images could be read; first: ", errors[0]["error"].get<std::string>());
  // Unreadable images are left out of the evaluation (their GT too), as
  // classification eval leaves them out of the accuracy.
  const CocoEvalResult r = coco_evaluate(gt, dets, evaluated_ids);
  if (!o.detections_out.empty()) {
    nlohmann::json res = nlohmann::json::array();
    for (const auto& d : dets)
      res.push_back({{"image_id", d.image_id}, {"category_id", d.category_id},
                     {"bbox", {d.bbox.x, d.bbox.y, d.bbox.w, d.bbox.h}}, {"score", d.score}});
    const std::string text = res.dump();
    write_file_atomic(o.detections_out, [&](std::FILE* f) { write_all(f, text.data(), text.size()); });
  }
  const auto& s = r.stats;
  if (o.json) {
    nlohmann::json per = nlohmann::json::object();
    for (const auto& [cat, ap] : r.ap_per_category) per[std::to_string(cat)] = ap;
    std::cout << nlohmann::json{{"map", s[0]},          {"map50", s[1]},          {"map75", s[2]},
                                {"map_small", s[3]},    {"map_medium", s[4]},     {"map_large", s[5]},
                                {"ar1", s[6]},          {"ar10", s[7]},           {"ar100", s[8]},
                                {"ar_small", s[9]},     {"ar_medium", s[10]},     {"ar_large", s[11]},
                                {"stats", s},           {"ap_per_category", per}, {"images", evaluated_ids.size()},
                                {"failed", errors.size()}, {"errors", errors},    {"detections", r.detections},
                                {"ground_truth", r.ground_truth}, {"category_mapping", mapping},
                                {"score_threshold", o.score_threshold}, {"batch", o.batch},
                                {"backend", det.engine().backend()}, {"seconds", secs},
                                {"ms_per_image", 1e3 * secs / evaluated_ids.size()}}
                     .dump(2)
              << "\n";
  } else {
    std::cout << std::fixed << std::setprecision(4) << "mAP50-95 " << s[0] << "  mAP50 " << s[1] << "  mAP75 " << s[2]
              << "  (small " << s[3] << ", medium " << s[4] << ", large " << s[5] << ")\n"
              << "AR1 " << s[6] << "  AR10 " << s[7] << "  AR100 " << s[8] << "  (small " << s[9] << ", medium "
              << s[10] << ", large " << s[11] << ")\n"
              << evaluated_ids.size() << " images, " << r.ground_truth << " ground-truth boxes, " << r.detections
              << " detections (classes to categories by " << mapping << "), " << std::setprecision(3)
              << 1e3 * secs / evaluated_ids.size() << " ms/image; -1: no ground truth in that range\n";
    if (!errors.empty()) {
      std::cout << errors.size() << " of " << n << " images could not be read (left out of the evaluation):\n";
      for (const auto& e : errors) std::cout << "  " << e["error"].get<std::string>() << "\n";
    }
  }
}

}  // namespace kiln::cli
