// timm's Hugging Face config.json: architecture, head size and the
// pre-processing recipe (pretrained_cfg). Reading is strict about what the
// pipeline relies on; errors name the file and the dotted key.
#pragma once
#include <array>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "image/interpolation.hpp"  // Interpolation, interpolation_name

namespace kiln {

struct TimmConfig {
  std::string architecture;
  int num_classes = 0;
  int num_features = 0;                          // 0 when absent
  int in_chans = 3, input_h = 224, input_w = 224;  // pretrained_cfg.input_size [C,H,W]
  std::array<float, 3> mean{}, std{};
  float crop_pct = 0.875f;
  Interpolation interpolation = Interpolation::Bicubic;
  std::string crop_mode = "center";              // "center", "squash" or "border"
  std::vector<std::string> label_names;          // top-level "label_names"; empty if absent
  nlohmann::json raw;                            // the whole config.json
};

// Parses an already-loaded config; `label` names the source in errors.
TimmConfig parse_timm_config(const nlohmann::json& j, const std::string& label);
// Errors are Error(Input), e.g. "config.json: missing key 'pretrained_cfg.mean'".
TimmConfig read_timm_config(const std::filesystem::path& config_json);
// The bytes of a config.json file (not valid JSON -> Error(Input) naming `label`).
TimmConfig parse_timm_config_bytes(const uint8_t* data, size_t size, const std::string& label);


}  // namespace kiln
