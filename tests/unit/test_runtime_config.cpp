// runtime.json is strict: every key present, no unknown keys, right types,
// values in range; errors name the key.
#include <gtest/gtest.h>

#include "core/error.hpp"
#include "tasks/runtime_config.hpp"

namespace kiln {
namespace {

nlohmann::json valid() {
  ClassificationRuntime r;
  r.num_classes = 10;
  r.preprocess.mean = {0.5f, 0.5f, 0.5f};
  r.preprocess.std = {0.25f, 0.25f, 0.25f};
  return to_json(r);
}

std::string error_of(const nlohmann::json& j) {
  try {
    validate_runtime_json(j.dump(), "m.bundle: runtime.json");
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Input);
    return e.what();
  }
  return "";
}

TEST(RuntimeConfig, RoundTrip) {
  ClassificationRuntime r = parse_classification_runtime(valid(), "x");
  EXPECT_EQ(r.num_classes, 10);
  EXPECT_EQ(r.preprocess.crop_mode, "center");
  EXPECT_EQ(to_json(r), valid());
}

TEST(RuntimeConfig, EveryTimmCropModeIsAccepted) {
  for (const char* mode : {"center", "squash", "border"}) {
    auto j = valid();
    j["preprocess"]["crop_mode"] = mode;
    EXPECT_EQ(error_of(j), "") << mode;
  }
  auto j = valid();
  j["preprocess"]["crop_mode"] = "random";
  EXPECT_NE(error_of(j).find("crop_mode"), std::string::npos);
}

TEST(RuntimeConfig, StrictKeysAndTypes) {
  auto unknown = valid();
  unknown["preprocess"]["sharpen"] = true;
  EXPECT_NE(error_of(unknown).find("'sharpen'"), std::string::npos);
  auto missing = valid();
  missing.erase("num_classes");
  EXPECT_NE(error_of(missing).find("'num_classes'"), std::string::npos);
  auto wrong = valid();
  wrong["preprocess"]["mean"] = "0.5";
  EXPECT_NE(error_of(wrong).find("'mean'"), std::string::npos);
  auto range = valid();
  range["preprocess"]["std"] = {0.5, 0.0, 0.5};
  EXPECT_NE(error_of(range).find("'std'"), std::string::npos);
  auto interp = valid();
  interp["preprocess"]["interpolation"] = "lanczos";
  EXPECT_NE(error_of(interp).find("lanczos"), std::string::npos);
  auto task = valid();
  task["task"] = "segmentation";
  EXPECT_NE(error_of(task).find("segmentation"), std::string::npos);
  EXPECT_NE(error_of(nlohmann::json::array()).find("runtime.json"), std::string::npos);
}

nlohmann::json valid_detection() {
  DetectionRuntime r;
  r.num_classes = 80;
  r.num_queries = 300;
  return to_json(r);
}

TEST(RuntimeConfig, DetectionRoundTripAndStrictness) {
  const DetectionRuntime r = parse_detection_runtime(valid_detection(), "x");
  EXPECT_EQ(r.num_queries, 300);
  EXPECT_EQ(r.preprocess.height, 640);
  EXPECT_EQ(r.preprocess.interpolation, Interpolation::Bilinear);
  EXPECT_FLOAT_EQ(r.preprocess.rescale, 1.f / 255.f);
  EXPECT_EQ(to_json(r), valid_detection());
  EXPECT_EQ(error_of(valid_detection()), "");
  auto missing = valid_detection();
  missing.erase("boxes");
  EXPECT_NE(error_of(missing).find("'boxes'"), std::string::npos);
  auto queries = valid_detection();
  queries["num_queries"] = 0;
  EXPECT_NE(error_of(queries).find("'num_queries'"), std::string::npos);
  auto rescale = valid_detection();
  rescale["preprocess"]["rescale"] = 255;
  EXPECT_NE(error_of(rescale).find("'rescale'"), std::string::npos);
  auto kind = valid_detection();
  kind["preprocess"]["kind"] = "timm_eval";
  EXPECT_NE(error_of(kind).find("'kind'"), std::string::npos);
  auto extra = valid_detection();
  extra["preprocess"]["mean"] = {0, 0, 0};
  EXPECT_NE(error_of(extra).find("'mean'"), std::string::npos);
}

}  // namespace
}  // namespace kiln
