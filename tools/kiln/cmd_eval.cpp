// kiln eval BUNDLE --dataset DIR: top-1 accuracy on an ImageFolder tree
// (one subfolder per class; class index = position of the folder name in
// sorted order, as torchvision's ImageFolder assigns it).
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "core/error.hpp"
#include "kiln/kiln.hpp"

namespace kiln::cli {

namespace fs = std::filesystem;

namespace {

bool is_image(const fs::path& p) {
  std::string e = p.extension().string();
  std::transform(e.begin(), e.end(), e.begin(), ::tolower);
  return e == ".png" || e == ".jpg" || e == ".jpeg";
}

}  // namespace

void add_eval(CLI::App& app) {
  struct Opts {
    std::string backend;
    std::string bundle, dataset;
    int batch = 16;
    bool json = false;
  };
  auto o = std::make_shared<Opts>();
  auto* sub = app.add_subcommand("eval", "Top-1 accuracy of a classification bundle on an ImageFolder dataset");
  sub->add_option("bundle", o->bundle, "Bundle file")->required();
  add_load_backend_option(sub, o->backend);
  sub->add_option("--dataset", o->dataset, "Directory with one subfolder per class")->required();
  sub->add_option("--batch", o->batch, "Images per engine call")->check(CLI::Range(1, 4096));
  sub->add_flag("--json", o->json, "JSON output (key top1)");
  sub->callback([o] {
    if (!fs::is_directory(o->dataset)) fail_input(o->dataset, ": not a directory");
    std::vector<std::string> classes;
    for (const auto& e : fs::directory_iterator(o->dataset))
      if (e.is_directory()) classes.push_back(e.path().filename().string());
    std::sort(classes.begin(), classes.end());
    if (classes.empty()) fail_input(o->dataset, ": no class subfolders (expected DIR/<class>/<image>)");
    Classifier clf(Engine::load(o->bundle, LoadOptions{o->backend, &std::cerr}));
    // Folder names that are the bundle's labels map to those class ids;
    // otherwise class id = sorted folder position (torchvision ImageFolder).
    std::vector<int> class_id(classes.size());
    const auto& labels = clf.engine().labels();
    bool by_label = !labels.empty();
    for (size_t c = 0; c < classes.size() && by_label; ++c) {
      auto it = std::find(labels.begin(), labels.end(), classes[c]);
      by_label = it != labels.end();
      if (by_label) class_id[c] = static_cast<int>(it - labels.begin());
    }
    for (size_t c = 0; c < classes.size() && !by_label; ++c) class_id[c] = static_cast<int>(c);
    std::vector<std::pair<std::string, int>> items;
    for (size_t c = 0; c < classes.size(); ++c) {
      std::vector<std::string> files;
      for (const auto& e : fs::directory_iterator(fs::path(o->dataset) / classes[c]))
        if (e.is_regular_file() && is_image(e.path())) files.push_back(e.path().string());
      std::sort(files.begin(), files.end());
      for (auto& f : files) items.push_back({f, class_id[c]});
    }
    if (items.empty()) fail_input(o->dataset, ": no .png/.jpg images found");
    const bool tty = isatty(2);
    size_t correct = 0;
    const auto t0 = std::chrono::steady_clock::now();
    for (size_t i = 0; i < items.size(); i += o->batch) {
      size_t end = std::min(items.size(), i + static_cast<size_t>(o->batch));
      std::vector<std::string> paths;
      for (size_t k = i; k < end; ++k) paths.push_back(items[k].first);
      auto results = clf.classify_files(paths, 1);
      for (size_t k = i; k < end; ++k) correct += results[k - i].top_k[0].class_id == items[k].second;
      if (tty) std::cerr << "\reval: " << end << "/" << items.size() << std::flush;
    }
    if (tty) std::cerr << "\n";
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double top1 = static_cast<double>(correct) / items.size();
    if (o->json) {
      std::cout << nlohmann::json{{"top1", top1},         {"correct", correct}, {"images", items.size()},
                                  {"classes", classes.size()}, {"batch", o->batch}, {"backend", clf.engine().backend()}, {"seconds", secs},   {"ms_per_image", 1e3 * secs / items.size()}}
                       .dump(2)
                << "\n";
    } else {
      std::cout << "top-1 " << std::fixed << std::setprecision(4) << top1 << " (" << correct << "/" << items.size()
                << "), " << std::setprecision(3) << 1e3 * secs / items.size() << " ms/image\n";
    }
  });
}

}  // namespace kiln::cli
