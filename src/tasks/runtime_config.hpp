// runtime.json: every pre- and post-processing constant a task needs, so the
// runtime never consults the checkpoint. Parsing is strict: a missing key, an
// unknown key or a wrong type is an Error(Input) naming the key.
#pragma once
#include <array>
#include <string>

#include <nlohmann/json.hpp>

#include "image/interpolation.hpp"

namespace kiln {

struct TimmEvalPreprocess {
  int height = 224, width = 224;
  float crop_pct = 0.875f;
  std::string crop_mode = "center";
  Interpolation interpolation = Interpolation::Bicubic;
  std::array<float, 3> mean{}, std{};
};

struct ClassificationRuntime {
  std::string input = "pixel_values";
  std::string output = "logits";
  int num_classes = 0;
  TimmEvalPreprocess preprocess;
};

nlohmann::json to_json(const ClassificationRuntime& r);
// `source` names the file for messages, e.g. "model.bundle: runtime.json".
ClassificationRuntime parse_classification_runtime(const nlohmann::json& j, const std::string& source);
// Validates runtime.json for any task (dispatch on "task").
void validate_runtime_json(const std::string& text, const std::string& source);

}  // namespace kiln
