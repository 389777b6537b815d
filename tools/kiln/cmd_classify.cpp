// kiln classify BUNDLE --image PATH...: each image's top-k, or its error; an
// unreadable image does not stop the others. Exit code 2 at the end when any
// image failed (with a count), as for any input error.
#include <iomanip>
#include <iostream>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "core/error.hpp"
#include "kiln/kiln.hpp"

namespace kiln::cli {

void add_classify(CLI::App& app) {
  struct Opts {
    std::string backend;
    std::string bundle;
    std::vector<std::string> images;
    int top_k = 5;
    bool json = false;
  };
  auto o = std::make_shared<Opts>();
  auto* sub = app.add_subcommand("classify", "Classify images with a classification bundle");
  sub->add_option("bundle", o->bundle, "Bundle file")->required();
  add_load_backend_option(sub, o->backend);
  sub->add_option("--image", o->images, "Image file(s) (JPEG or PNG)")->required();
  sub->add_option("--top-k", o->top_k, "Number of classes to report")->check(CLI::Range(1, 100000));
  sub->add_flag("--json", o->json, "JSON output (an 'error' key instead of 'top_k' for an image that failed)");
  sub->callback([o] {
    Classifier clf(Engine::load(o->bundle, LoadOptions{o->backend, &std::cerr}));
    nlohmann::json all = nlohmann::json::array();
    size_t failed = 0;
    for (const auto& path : o->images) {
      // One image per engine call, so each result is printed as soon as it
      // exists; the outcome API keeps a bad file an entry, not an exception.
      ClassificationOutcome r = std::move(clf.try_classify_files({path}, o->top_k)[0]);
      if (!r.ok) {
        ++failed;
        if (o->json) all.push_back({{"image", path}, {"error", r.error}});
        else std::cerr << "kiln: error: " << r.error << "\n";
        continue;
      }
      if (o->json) {
        nlohmann::json top = nlohmann::json::array();
        for (const auto& p : r.result.top_k) top.push_back({{"class_id", p.class_id}, {"label", p.label}, {"score", p.score}});
        all.push_back({{"image", path}, {"top_k", top}});
      } else {
        std::cout << path << "\n";
        for (const auto& p : r.result.top_k)
          std::cout << "  " << std::setw(6) << p.class_id << "  " << std::fixed << std::setprecision(4) << p.score << "  "
                    << p.label << "\n";
      }
    }
    if (o->json) std::cout << all.dump(2) << "\n";
    std::cout << std::flush;
    if (failed) fail_input(failed, " of ", o->images.size(), " images could not be classified");
  });
}

}  // namespace kiln::cli
