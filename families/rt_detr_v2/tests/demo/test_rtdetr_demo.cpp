// The trained RT-DETR v2 demo detector (models/rtdetr_demo, trained by
// tools/reference/train_rtdetr_demo.py): kiln's fp32 CPU engine against the
// PyTorch fp32 reference the script wrote (reference.json,
// reference_detections.json).
//
// Compiled into kiln_tests only when models/rtdetr_demo/config.json exists at
// configure time (CMakeLists.txt), so the branch builds before the model is
// committed; once it is, a missing or broken model folder fails these tests.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <unistd.h>

#include "../../../../tests/unit/cli_test_util.hpp"

namespace {

namespace fs = std::filesystem;
const fs::path kModel = fs::path(KILN_FIXTURES_DIR).parent_path().parent_path() / "models" / "rtdetr_demo";

nlohmann::json read_json(const fs::path& p) {
  std::ifstream f(p);
  if (!f) throw std::runtime_error(p.string() + ": cannot open");
  return nlohmann::json::parse(f);
}

double iou(const std::vector<double>& a, const std::vector<double>& b) {  // corners
  const double iw = std::max(0.0, std::min(a[2], b[2]) - std::max(a[0], b[0]));
  const double ih = std::max(0.0, std::min(a[3], b[3]) - std::max(a[1], b[1]));
  const double inter = iw * ih;
  return inter / ((a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter);
}

class RtDetrDemo : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = fs::temp_directory_path() / ("kiln_rtdemo_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    const auto r = kiln::testing::run_kiln("build " + kModel.string() + " -o " + bundle().string());
    ASSERT_EQ(r.code, 0) << r.all();
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }
  static fs::path bundle() { return dir_ / "rtdetr_demo.bundle"; }
  static fs::path dir_;
};
fs::path RtDetrDemo::dir_;

// mAP50-95 of the fp32 CPU engine on the held-out split within 0.005 of
// PyTorch fp32's (issue #12 section 4).
TEST_F(RtDetrDemo, HeldOutMapMatchesPyTorch) {
  ASSERT_TRUE(fs::exists(bundle()));
  const auto ref = read_json(kModel / "reference.json");
  const auto r = kiln::testing::run_kiln("eval " + bundle().string() + " --coco " +
                                         (kModel / "heldout" / "annotations.json").string() + " --images " +
                                         (kModel / "heldout" / "images").string() + " --json --quiet");
  ASSERT_EQ(r.code, 0) << r.all();
  const auto k = nlohmann::json::parse(r.out);
  EXPECT_EQ(k["images"].get<int>(), ref["num_heldout"].get<int>());
  EXPECT_EQ(k["ground_truth"].get<int>(), ref["num_boxes"].get<int>());
  EXPECT_EQ(k["category_mapping"].get<std::string>(), "name");
  EXPECT_NEAR(k["map"].get<double>(), ref["pytorch_map"].get<double>(), 0.005)
      << "kiln mAP50-95 " << k["map"] << ", PyTorch " << ref["pytorch_map"] << " (" << ref["evaluator"] << ")";
  EXPECT_NEAR(k["map50"].get<double>(), ref["pytorch_map50"].get<double>(), 0.005);
}

// `kiln detect` on the sample images finds boxes, and each one is a detection
// PyTorch made on that image (same class, IoU >= 0.9, score within 0.01).
TEST_F(RtDetrDemo, DetectSamplesFindsPyTorchBoxes) {
  const auto ref = read_json(kModel / "reference.json");
  const auto gt = read_json(kModel / "heldout" / "annotations.json");
  const auto pt = read_json(kModel / "reference_detections.json");
  const double thr = 0.5;
  ASSERT_FALSE(ref["samples"].empty());
  size_t found = 0;
  for (const auto& s : ref["samples"]) {
    const fs::path img = kModel / s.get<std::string>();
    const std::string name = img.filename().string();
    int64_t image_id = -1;
    for (const auto& im : gt["images"])
      if (im["file_name"].get<std::string>() == name) image_id = im["id"].get<int64_t>();
    ASSERT_GE(image_id, 0) << name << " is not a held-out image";
    const auto r = kiln::testing::run_kiln("detect " + bundle().string() + " --json --score-threshold 0.5 --image " +
                                           img.string());
    ASSERT_EQ(r.code, 0) << r.all();
    const auto j = nlohmann::json::parse(r.out);
    ASSERT_EQ(j.size(), 1u);
    size_t pt_above = 0, pt_near = 0;
    for (const auto& d : pt)
      if (d["image_id"].get<int64_t>() == image_id) {
        const double sc = d["score"].get<double>();
        pt_above += sc > thr;
        pt_near += std::abs(sc - thr) < 0.01;
      }
    const auto& dets = j[0]["detections"];
    found += dets.size();
    EXPECT_LE(std::abs(static_cast<double>(dets.size()) - static_cast<double>(pt_above)), static_cast<double>(pt_near))
        << name << ": kiln " << dets.size() << " boxes above " << thr << ", PyTorch " << pt_above;
    for (const auto& d : dets) {
      const auto b = d["box"].get<std::vector<double>>();
      bool matched = false;
      for (const auto& p : pt) {
        if (p["image_id"].get<int64_t>() != image_id || p["category_id"].get<int64_t>() != d["class_id"].get<int64_t>() + 1)
          continue;
        const auto pb = p["bbox"].get<std::vector<double>>();
        if (iou(b, {pb[0], pb[1], pb[0] + pb[2], pb[1] + pb[3]}) >= 0.9 &&
            std::abs(p["score"].get<double>() - d["score"].get<double>()) < 0.01)
          matched = true;
      }
      EXPECT_TRUE(matched) << name << ": kiln box " << d.dump() << " is not among PyTorch's detections";
    }
  }
  EXPECT_GT(found, 0u) << "no sample image has a box scoring above " << thr;
}

// `kiln bench --profile` on an RT-DETR v2 bundle sums its layers into the
// family's groups (issue #12 section 5's table): backbone, AIFI, encoder,
// query selection and decoder, rows in that order (the input projections run
// before AIFI but are the encoder's), every layer in one of them.
TEST_F(RtDetrDemo, BenchProfileUsesTheFamilysGroups) {
  const auto r = kiln::testing::run_kiln("bench " + bundle().string() + " --iterations 10 --warmup 1 --no-task --profile 1 --json");
  ASSERT_EQ(r.code, 0) << r.all();
  const auto p = nlohmann::json::parse(r.out.substr(r.out.find('{')))["results"][0]["profile"];
  std::vector<std::string> names;
  size_t steps = 0;
  for (const auto& g : p["groups"]) names.push_back(g["group"].get<std::string>()), steps += g["steps"].get<size_t>();
  EXPECT_EQ(steps, p["layers"].size());
  std::vector<std::string> core;
  for (const auto& n : names) {
    EXPECT_TRUE(n == "input" || n == "backbone" || n == "AIFI" || n == "encoder" || n == "query selection" ||
                n == "decoder" || n == "output")
        << "a layer outside the family's groups: " << n;
    if (n != "input" && n != "output") core.push_back(n);
  }
  EXPECT_EQ(core, (std::vector<std::string>{"backbone", "AIFI", "encoder", "query selection", "decoder"}));
}

}  // namespace
