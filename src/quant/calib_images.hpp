// Calibration inputs from a folder of images (kiln build --calib DIR): each
// image decoded and pre-processed with the model's own runtime.json
// constants, as `kiln classify` does, one image per calibration batch.
#pragma once
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "quant/calibrate.hpp"

namespace kiln::quant {

// The .jpg/.jpeg/.png files directly in `dir`, sorted by name, the first
// `limit` (all when limit <= 0). Error(Input) naming the folder when it is
// missing, not a folder or holds no image.
std::vector<std::filesystem::path> calibration_images(const std::filesystem::path& dir, int64_t limit);

// One batch per file: the image as the engine's input [1, 3, H, W] after the
// task's pre-processing (`runtime`: the family's runtime.json; classification
// only so far: Error(Usage) naming the task otherwise).
CalibrationData image_calibration_data(std::vector<std::filesystem::path> files, const nlohmann::json& runtime,
                                       const std::string& task);

}  // namespace kiln::quant
