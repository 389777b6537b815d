// Builds for the tests that steer a CUDA build through its tactic cache (the
// build's second source of tactics after the bundle): kiln's own convs named
// in the cache file for every signature they take.
#pragma once
#include <filesystem>

#include "bundle/builder.hpp"
#include "core/switches.hpp"

namespace kiln::testing {

// The f16 CUDA bundle of the fixture at `model`, batch 2, opt level 3,
// with tactic cache file `cache` and engine switch `on` on, written to `out`.
inline void build_f16_with_tactic_cache(const std::filesystem::path& model, const std::filesystem::path& cache, Switch on,
                                        const std::filesystem::path& out) {
  BuildOptions o;
  o.model = model.string();
  o.backend = "cuda";
  o.precision = DType::F16;
  o.opt_level = 3;
  o.batch = 2;
  o.tactic_cache = cache.string();
  o.switches.set(on, true);
  build_bundle(o, out);
}

}  // namespace kiln::testing
