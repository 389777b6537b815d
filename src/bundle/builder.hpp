// kiln build: checkpoint -> family graph -> passes -> .bundle. The builder and
// the runtime meet only at the bundle file.
#pragma once
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <ostream>
#include <string>
#include <vector>

#include "core/dtype.hpp"
#include "core/switches.hpp"

namespace kiln {

// $XDG_CACHE_HOME/kiln/tactics.json, else ~/.cache/kiln/tactics.json, else "" (none).
std::string default_tactic_cache();

struct BuildOptions {
  std::string model;     // local directory or Hugging Face id in the local HF cache
  std::string revision;  // HF revision (branch, tag or commit); empty = refs/main
  DType precision = DType::F32;
  std::string backend = "cpu";
  int batch = 1;  // the graph's batch (the first planned)
  // Further batch sizes planned and, at opt level >= 3, timed at build (CUDA);
  // their choices are recorded in the bundle and replayed at load. A batch not
  // built gets heuristic tactics at first use, with a notice.
  std::vector<int> batches;
  int opt_level = 3;
  bool allow_tf32 = false;  // CUDA f32 engines: TF32 tensor cores (changes numbers; off by default)
  // Largest batch the engine accepts at run time (recorded in the bundle;
  // larger inputs are refused naming it). At least `batch`.
  int max_batch = 4096;
  EngineSwitches switches;  // fusion/launch choices (core/switches.hpp), recorded in the bundle
  // Layer globs (node names or op names, ir/node_select.hpp) the CPU backend
  // runs with the plain reference instead of its optimized kernels, to find
  // where numbers go wrong; recorded in the bundle. CPU backend only.
  std::vector<std::string> reference;
  // CUDA tactic cache file used while building ("" = none); default_tactic_cache() by default.
  std::string tactic_cache = default_tactic_cache();
  // 8-bit quantization (issue 13; docs/quantization.md). quantize: "" (none),
  // "fp8" (e4m3) or "int8". The recipe file (default: every conv/linear minus
  // the default exclusions) says which layers; activation scales come from
  // `scales` (a scales file) or are calibrated on the images in `calib`
  // (the first calib_images, pre-processed as runtime.json says) by
  // calib_method ("" = the recipe's; percentile < 0 = the recipe's).
  // write_scales saves the scales used. CPU backend only so far.
  std::string quantize, recipe, calib, calib_method, scales, write_scales;
  double percentile = -1;
  int calib_images = 32;
  bool verify = false;          // IR verifier after every pass
  std::ostream* log = nullptr;  // progress lines
  // CUDA builds: called per graph node during tactic selection (done, total),
  // e.g. to draw a progress bar; not called by the CPU backend.
  std::function<void(int64_t done, int64_t total)> progress;
};

struct BuildSummary {
  std::string family;
  std::string model_dir;
  size_t nodes_before = 0, nodes_after = 0;
  std::map<std::string, int> op_counts;  // after passes
  uint64_t bundle_bytes = 0;
  double seconds = 0;
};

// Writes `out` atomically; on any error nothing is left at `out`.
BuildSummary build_bundle(const BuildOptions& options, const std::filesystem::path& out);

}  // namespace kiln
