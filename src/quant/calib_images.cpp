#include "quant/calib_images.hpp"

#include <algorithm>
#include <cctype>

#include "core/error.hpp"
#include "image/image.hpp"
#include "tasks/runtime_config.hpp"

namespace kiln::quant {

std::vector<std::filesystem::path> calibration_images(const std::filesystem::path& dir, int64_t limit) {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) fail_input("--calib ", dir.string(), ": not a folder");
  std::vector<std::filesystem::path> files;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    if (!e.is_regular_file()) continue;
    std::string ext = e.path().extension().string();
    std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    if (ext == ".jpg" || ext == ".jpeg" || ext == ".png") files.push_back(e.path());
  }
  if (ec) fail_input("--calib ", dir.string(), ": ", ec.message());
  if (files.empty()) fail_input("--calib ", dir.string(), ": no .jpg, .jpeg or .png images in the folder");
  std::sort(files.begin(), files.end());
  if (limit > 0 && static_cast<int64_t>(files.size()) > limit) files.resize(static_cast<size_t>(limit));
  return files;
}

namespace {

// One batch per file: the decoded image through `pre` (the task's pre-processing).
template <class Pre>
CalibrationData one_image_per_batch(std::vector<std::filesystem::path> files, Pre pre) {
  CalibrationData d;
  d.batches = static_cast<int64_t>(files.size());
  d.batch = [files = std::move(files), pre](int64_t i) {
    return std::vector<std::vector<float>>{pre(decode_image(files.at(static_cast<size_t>(i))))};
  };
  return d;
}

}  // namespace

CalibrationData image_calibration_data(std::vector<std::filesystem::path> files, const nlohmann::json& runtime,
                                       const std::string& task) {
  if (task == "detection") {  // as kiln detect applies it: resize to the engine's size, x rescale
    const ResizeRescale pre = resize_rescale_of(parse_detection_runtime(runtime, "runtime.json").preprocess);
    return one_image_per_batch(std::move(files), [pre](const ImageU8& img) { return resize_rescale(img, pre); });
  }
  if (task != "classification")
    fail_usage("--calib: calibration images are pre-processed for classification and detection models only (this model's "
               "task is '", task, "'); pass --scales FILE instead");
  const ClassificationRuntime rt = parse_classification_runtime(runtime, "runtime.json");
  const TimmPreprocess pre = timm_preprocess_of(rt.preprocess);  // as kiln classify applies it
  return one_image_per_batch(std::move(files), [pre](const ImageU8& img) { return timm_preprocess(img, pre); });
}

}  // namespace kiln::quant
