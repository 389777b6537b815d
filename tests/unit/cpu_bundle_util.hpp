// A CPU bundle around a graph built in code, for tests that load it through
// Engine::load_from_memory (the runtime's whole path: plan per batch, views,
// CpuProgram).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bundle/bundle.hpp"
#include "ir/graph.hpp"
#include "ir/serialize.hpp"
#include "tasks/runtime_config.hpp"

namespace kiln::testing {

// A classification-task CPU bundle around `g` (graph input "pixel_values";
// the runtime.json is a placeholder with 5 classes and 4x4 images).
inline std::vector<uint8_t> cpu_bundle(const Graph& g, const std::string& checkpoint_id) {
  using nlohmann::json;
  const SerializedGraph s = serialize_graph(g);
  ClassificationRuntime r;
  r.num_classes = 5;
  r.preprocess.height = r.preprocess.width = 4;
  r.preprocess.mean = {0.5f, 0.5f, 0.5f};
  r.preprocess.std = {0.25f, 0.25f, 0.25f};
  const json prov = {{"checkpoint", {{"id", checkpoint_id}, {"revision", ""}}},
                     {"build", {{"precision", "f32"}, {"backend", "cpu"}, {"batch", 3}, {"opt_level", 3}}}};
  BundleWriter w(BundleInfo{kBundleFormat, KILN_VERSION, "test", "classification", "cpu"});
  w.add_section("graph.json", s.graph_json);
  w.add_section("weights.bin", s.weights);
  w.add_section("runtime.json", to_json(r).dump());
  w.add_section("labels.json", json({"a", "b", "c", "d", "e"}).dump());
  w.add_section("provenance.json", prov.dump());
  return w.to_bytes();
}

}  // namespace kiln::testing
