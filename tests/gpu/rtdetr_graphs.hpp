// The RT-DETR v2 fixture graphs the CUDA plan tests read (test_cuda_plans.cpp,
// test_side_lane.cpp): no GPU needed.
#pragma once
#include <filesystem>
#include <string>

#include "../unit/family_test_util.hpp"

namespace kiln::cuda {

// Calls f(name, dt, graph) for every RT-DETR v2 fixture in f32 and f16, the
// graph shaped as CUDA builds shape it.
template <typename F>
void for_each_rtdetr_graph(F&& f) {
  const std::filesystem::path root = std::filesystem::path(KILN_FIXTURES_DIR) / "rt_detr_v2";
  for (const std::string name : {"basic_1l", "bottleneck_2l", "discrete_1l"})
    for (DType dt : {DType::F32, DType::F16}) {
      Graph g = testing::fixture_graph(root / name, dt, dt == DType::F16 ? 8 : 4, "rt_detr_v2");
      f(name, dt, g);
    }
}

}  // namespace kiln::cuda
