// A family turns the checkpoints it recognises into a Graph. Families live in
// families/<name>/family.cpp and are found by directory (CMake generates the
// registration list); exactly one family must claim a checkpoint.
#pragma once
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/safetensors.hpp"
#include "ir/graph.hpp"

namespace kiln {

struct ModelSource {
  std::filesystem::path dir;
  std::filesystem::path config_path;
  nlohmann::json config;  // config.json as read
  const Checkpoint* checkpoint = nullptr;
};

struct BuildRequest {
  const ModelSource* source = nullptr;
  int batch = 1;
};

struct FamilyBuild {
  Graph graph;                      // f32, un-optimized, names from the checkpoint
  std::string task;                 // "classification"
  nlohmann::json runtime;           // runtime.json contents
  std::vector<std::string> labels;  // may be empty
  // Named layer groups an 8-bit recipe's "parts" may name beside the built-in
  // ones (docs/quantization.md): part -> node-name globs. RT-DETR v2's linear
  // groups, for instance; empty for most families.
  std::map<std::string, std::vector<std::string>> quant_parts;
};

// A named group of layers for per-group time tables (kiln bench --profile and
// --trace, kiln study): a node belongs to the first group with a prefix its
// name starts with.
struct LayerGroup {
  std::string name;
  std::vector<std::string> prefixes;
};

class Family {
 public:
  virtual ~Family() = default;
  virtual std::string name() const = 0;
  // Claims the checkpoint or not; must not throw for checkpoints of other families.
  virtual bool describe(const ModelSource& source) const = 0;
  virtual FamilyBuild build(const BuildRequest& request) const = 0;
  // The family's own layer groups, in the order they run (RT-DETR v2: backbone,
  // AIFI, encoder, query selection, decoder); empty: group by name prefix.
  virtual std::vector<LayerGroup> layer_groups() const { return {}; }
};

class FamilyRegistry {
 public:
  void add(std::unique_ptr<Family> family);
  const std::vector<std::unique_ptr<Family>>& all() const { return families_; }
  // Exactly one family must claim; zero or several is an Error(Input) naming
  // the model and the candidates.
  const Family& select(const ModelSource& source) const;
  // The family of that name (a bundle's "family"), or nullptr.
  const Family* find(const std::string& name) const;

 private:
  std::vector<std::unique_ptr<Family>> families_;
};

// All families found under families/ at build time.
const FamilyRegistry& family_registry();

}  // namespace kiln
