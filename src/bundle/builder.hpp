// kiln build: checkpoint -> family graph -> passes -> .bundle. The builder and
// the runtime meet only at the bundle file.
#pragma once
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <ostream>
#include <string>

#include "core/dtype.hpp"

namespace kiln {

struct BuildOptions {
  std::string model;     // local directory or Hugging Face id in the local HF cache
  std::string revision;  // HF revision (branch, tag or commit); empty = refs/main
  DType precision = DType::F32;
  std::string backend = "cpu";
  int batch = 1;
  int opt_level = 3;
  bool allow_tf32 = false;  // CUDA f32 engines: TF32 tensor cores (changes numbers; off by default)
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
