// Each subcommand lives in its own file and registers itself on the app.
#pragma once
#include <CLI/CLI.hpp>

namespace kiln::cli {

// --backend on commands that load a bundle: run it on another backend than
// the one it was built for (cpu runs a CUDA bundle where no GPU is present).
inline void add_load_backend_option(CLI::App* sub, std::string& backend) {
  sub->add_option("--backend", backend, "Run on this backend instead of the bundle's (cpu runs a CUDA bundle on the CPU)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
}

// kiln eval --coco (cmd_eval_coco.cpp), reached from add_eval.
struct CocoEvalOptions {
  std::string bundle, backend, coco, images, detections_out;
  int batch = 16, threads = 0;
  size_t limit = 0;
  float score_threshold = 0.f;
  bool json = false, strict = false, quiet = false;
};
void run_coco_eval(const CocoEvalOptions& o);

void add_build(CLI::App& app);
void add_classify(CLI::App& app);
void add_detect(CLI::App& app);
void add_run(CLI::App& app);
void add_eval(CLI::App& app);
void add_inspect(CLI::App& app);
void add_version(CLI::App& app);
void add_bench(CLI::App& app);
void add_study(CLI::App& app);

}  // namespace kiln::cli
