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

// A CPU bundle around `g` with the given task, runtime.json and labels.json.
inline std::vector<uint8_t> cpu_task_bundle(const Graph& g, const std::string& checkpoint_id, const std::string& task,
                                            const nlohmann::json& runtime, const nlohmann::json& labels) {
  using nlohmann::json;
  const SerializedGraph s = serialize_graph(g);
  const json prov = {{"checkpoint", {{"id", checkpoint_id}, {"revision", ""}}},
                     {"build", {{"precision", "f32"}, {"backend", "cpu"}, {"batch", 3}, {"opt_level", 3}}}};
  BundleWriter w(BundleInfo{kBundleFormat, KILN_VERSION, "test", task, "cpu"});
  w.add_section("graph.json", s.graph_json);
  w.add_section("weights.bin", s.weights);
  w.add_section("runtime.json", runtime.dump());
  w.add_section("labels.json", labels.dump());
  w.add_section("provenance.json", prov.dump());
  return w.to_bytes();
}

// A classification-task CPU bundle around `g` (graph input "pixel_values";
// the runtime.json is a placeholder with 5 classes and 4x4 images).
inline std::vector<uint8_t> cpu_bundle(const Graph& g, const std::string& checkpoint_id) {
  ClassificationRuntime r;
  r.num_classes = 5;
  r.preprocess.height = r.preprocess.width = 4;
  r.preprocess.mean = {0.5f, 0.5f, 0.5f};
  r.preprocess.std = {0.25f, 0.25f, 0.25f};
  return cpu_task_bundle(g, checkpoint_id, "classification", to_json(r), nlohmann::json({"a", "b", "c", "d", "e"}));
}

// A detection-task CPU bundle around `g` (task "detection", runtime `r`).
inline std::vector<uint8_t> cpu_detection_bundle(const Graph& g, const DetectionRuntime& r,
                                                 const std::vector<std::string>& labels) {
  return cpu_task_bundle(g, "test/detector", "detection", to_json(r), nlohmann::json(labels));
}

}  // namespace kiln::testing
