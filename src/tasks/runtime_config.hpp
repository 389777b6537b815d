// runtime.json: every pre- and post-processing constant a task needs, so the
// runtime never consults the checkpoint. Parsing is strict: a missing key, an
// unknown key or a wrong type is an Error(Input) naming the key.
#pragma once
#include <array>
#include <string>

#include <nlohmann/json.hpp>

#include "image/image.hpp"
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

// Object detection (RT-DETR v2): the image is resized to height x width (no crop, aspect not
// kept), scaled by `rescale` (1/255), no mean/std; the engine gives `logits` [N, Q, C] (before
// the sigmoid) and `boxes` [N, Q, 4] as (cx, cy, w, h) in [0, 1] of the engine input. Post-
// processing (transformers' post_process_object_detection): scores = sigmoid(logits), top-k
// `num_queries` over Q x C, label = index % C, box = boxes[index / C] scaled to the original
// image size (no clipping), kept when score > threshold.
struct DetectionPreprocess {
  int height = 640, width = 640;
  Interpolation interpolation = Interpolation::Bilinear;
  float rescale = 1.f / 255.f;
};

struct DetectionRuntime {
  std::string input = "pixel_values";
  std::string logits = "logits";
  std::string boxes = "pred_boxes";
  int num_classes = 0;
  int num_queries = 0;
  DetectionPreprocess preprocess;
};

// The image pre-processing runtime.json's constants describe (what kiln classify,
// kiln eval and calibration apply).
TimmPreprocess timm_preprocess_of(const TimmEvalPreprocess& p);
ResizeRescale resize_rescale_of(const DetectionPreprocess& p);

nlohmann::json to_json(const ClassificationRuntime& r);
nlohmann::json to_json(const DetectionRuntime& r);
// `source` names the file for messages, e.g. "model.bundle: runtime.json".
ClassificationRuntime parse_classification_runtime(const nlohmann::json& j, const std::string& source);
DetectionRuntime parse_detection_runtime(const nlohmann::json& j, const std::string& source);
// Validates runtime.json for any task (dispatch on "task").
void validate_runtime_json(const std::string& text, const std::string& source);

}  // namespace kiln
