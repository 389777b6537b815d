// The real RT-DETR v2 checkpoint against transformers' own golden values
// (rtdetr_hub_golden.hpp): the fp32 CPU engine where the checkpoint and the
// image are on local disk (skipped, saying what is missing, elsewhere), and
// the pieces that decide it on every machine: the tolerance rules on
// hand-made outputs and the search for the inputs in a made-up cache.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "../../../tests/unit/family_test_util.hpp"
#include "../../../tests/unit/temp_dir.hpp"
#include "kiln/kiln.hpp"
#include "rtdetr_hub_golden.hpp"

namespace kiln {
namespace {

namespace fs = std::filesystem;
namespace golden = testing::rtdetr_golden;
using testing::EnvGuard;
using testing::TempDir;
using testing::write_file;

constexpr int64_t kQueries = 300, kClasses = 80;

// Outputs carrying exactly the golden values (everything else zero), and the
// golden detections followed by a weaker fifth one.
struct Outputs {
  std::vector<float> logits = std::vector<float>(kQueries * kClasses, 0.f), boxes = std::vector<float>(kQueries * 4, 0.f);
  Detections d;
  Outputs() {
    for (int q = 0; q < 3; ++q)
      for (int c = 0; c < 3; ++c) logits[q * kClasses + c] = golden::kLogits[q][c], boxes[q * 4 + c] = golden::kBoxes[q][c];
    d.image_width = golden::kImageWidth, d.image_height = golden::kImageHeight;
    for (int i = 0; i < 4; ++i) {
      const auto& b = golden::kCorners[i];
      d.boxes.push_back({b[0], b[1], b[2], b[3], golden::kScores[i], golden::kLabels[i], ""});
    }
    d.boxes.push_back({10, 10, 50, 50, 0.5f, 3, ""});
  }
  std::string fp32() const { return golden::fp32_mismatch(logits, kClasses, boxes, d); }
};

bool has(const std::string& s, const std::string& needle) { return s.find(needle) != std::string::npos; }

TEST(RtDetrHubGolden, Fp32RuleHoldsTransformersTolerances) {
  EXPECT_EQ(Outputs().fp32(), "");
  {  // logits[0, 1, 1] = -9.3449: atol 2e-4 + rtol 2e-4 * 9.3449 allows 2.07e-3
    Outputs o;
    o.logits[1 * kClasses + 1] += 1.5e-3f;
    EXPECT_EQ(o.fp32(), "");
    o.logits[1 * kClasses + 1] += 1.5e-3f;
    EXPECT_TRUE(has(o.fp32(), "logits[0,1,1]")) << o.fp32();
  }
  {  // pred_boxes[0, 2, 0] = 0.7665 allows 3.5e-4
    Outputs o;
    o.boxes[2 * 4 + 0] += 5e-4f;
    const std::string m = o.fp32();
    EXPECT_TRUE(has(m, "pred_boxes[0,2,0]")) << m;
    EXPECT_FALSE(has(m, "logits")) << m;
  }
  {  // only the first 3 x 3 are compared; NaN never passes
    Outputs o;
    o.logits[3] = 100.f, o.logits[3 * kClasses] = 100.f;
    EXPECT_EQ(o.fp32(), "");
    o.logits[2 * kClasses + 2] = NAN;
    EXPECT_TRUE(has(o.fp32(), "logits[0,2,2]"));
  }
  {  // detections: score (allows 1.19e-3 at 0.9652), label, corners (0.129 px at 639.98)
    Outputs o;
    o.d.boxes[0].x_max += 0.1f;
    EXPECT_EQ(o.fp32(), "");
    o.d.boxes[0].x_max += 0.1f;
    o.d.boxes[0].score += 1.5e-3f;
    o.d.boxes[3].class_id = 56;
    const std::string m = o.fp32();
    EXPECT_TRUE(has(m, "detection 0 box[2]")) << m;
    EXPECT_TRUE(has(m, "detection 0 score")) << m;
    EXPECT_TRUE(has(m, "detection 3 label 56, want 57")) << m;
    EXPECT_FALSE(has(m, "detection 1")) << m;
  }
  {
    Outputs o;
    o.d.boxes.resize(3);
    EXPECT_TRUE(has(o.fp32(), "3 detections at threshold 0, want at least 4"));
    o = Outputs();
    o.d.image_height = 640;
    EXPECT_TRUE(has(o.fp32(), "image size 640x640, want 640x480"));
    EXPECT_TRUE(has(golden::fp32_mismatch({1.f}, 80, o.boxes, o.d), "outputs too small"));
  }
}

TEST(RtDetrHubGolden, Fp16RuleMatchesByLabelIouAndScore) {
  Outputs o;
  EXPECT_EQ(golden::fp16_mismatch(o.d), "");
  for (auto& b : o.d.boxes) b.score -= 0.04f;  // within 0.05
  o.d.boxes[1].x_min += 10.f;                   // IoU still near 0.97
  EXPECT_EQ(golden::fp16_mismatch(o.d), "");
  Outputs s;
  s.d.boxes[2].score -= 0.06f;
  EXPECT_NE(golden::fp16_mismatch(s.d), "");
  Outputs l;
  l.d.boxes[3].class_id = 0;
  EXPECT_NE(golden::fp16_mismatch(l.d), "");
  Outputs m;  // the remote's box moved by its own width: IoU 0
  m.d.boxes[2].x_min += 140.f, m.d.boxes[2].x_max += 140.f;
  EXPECT_NE(golden::fp16_mismatch(m.d), "");
  Outputs f;
  f.d.boxes.resize(3);
  EXPECT_NE(golden::fp16_mismatch(f.d), "");
}

TEST(RtDetrHubGolden, FindsTheCheckpointAndImageOrSaysWhatIsMissing) {
  TempDir dir;
  EnvGuard env({"HF_HOME", "HF_HUB_CACHE", "XDG_CACHE_HOME", "HOME", golden::kImageEnv});
  const fs::path hub = dir / "hub", repo_images = dir / "images";
  env.set("HF_HUB_CACHE", hub.string());
  golden::Inputs in = golden::find_inputs(repo_images);
  EXPECT_TRUE(has(in.missing, "not in the local Hugging Face cache")) << in.missing;
  EXPECT_TRUE(has(in.missing, golden::kModel)) << in.missing;

  const std::string sha = "0123456789abcdef0123456789abcdef01234567";
  const fs::path snapshot = hub / "models--PekingU--rtdetr_v2_r18vd" / "snapshots" / sha;
  write_file(hub / "models--PekingU--rtdetr_v2_r18vd" / "refs" / "main", sha);
  write_file(snapshot / "config.json", "{}");
  in = golden::find_inputs(repo_images);
  EXPECT_EQ(in.model_dir, snapshot);
  for (const std::string& n : {std::string(golden::kImageName), std::string("$KILN_RTDETR_GOLDEN_IMAGE (unset)"),
                               (hub / golden::kImageDataset).string(), (repo_images / "coco").string()})
    EXPECT_TRUE(has(in.missing, n)) << n << " in: " << in.missing;

  // The dataset's copy, some folders down (a cache snapshot).
  const fs::path cached = hub / golden::kImageDataset / "snapshots" / sha / "tests_samples" / "COCO" / golden::kImageName;
  write_file(cached, "png");
  in = golden::find_inputs(repo_images);
  EXPECT_EQ(in.missing, "");
  EXPECT_EQ(in.image, cached);
  // The variable comes first, when it names a file.
  write_file(dir / "mine.png", "png");
  env.set(golden::kImageEnv, (dir / "mine.png").string());
  EXPECT_EQ(golden::find_inputs(repo_images).image, dir / "mine.png");
  env.set(golden::kImageEnv, (dir / "absent.png").string());
  EXPECT_EQ(golden::find_inputs(repo_images).image, cached);
  // Too deep in the dataset's folder: not searched; the repository's folder is.
  fs::remove_all(hub / golden::kImageDataset);
  write_file(hub / golden::kImageDataset / "a" / "b" / "c" / "d" / "e" / "f" / "g" / golden::kImageName, "png");
  in = golden::find_inputs(repo_images);
  EXPECT_TRUE(in.image.empty());
  EXPECT_TRUE(has(in.missing, "(" + (dir / "absent.png").string() + ")")) << in.missing;
  write_file(repo_images / "coco" / golden::kImageName, "png");
  EXPECT_EQ(golden::find_inputs(repo_images).image, repo_images / "coco" / golden::kImageName);
}

// The fp32 CPU engine of the real checkpoint by transformers' tolerances.
TEST(RtDetrHubGolden, Fp32CpuEngineMatchesTransformersTest) {
  const golden::Inputs in = golden::find_inputs(fs::path(KILN_FIXTURES_DIR) / "images");
  if (!in.missing.empty()) GTEST_SKIP() << in.missing;
  const fs::path tmp = testing::temp_dir("rtdetr_hub_golden_cpu");
  const golden::Run r = golden::run(golden::build_engine(in, "cpu", DType::F32, tmp / "m.bundle"), in.image);
  fs::remove_all(tmp);
  const std::string m = golden::fp32_mismatch(r.logits, r.classes, r.boxes, r.detections);
  EXPECT_TRUE(m.empty()) << "cpu fp32, out of transformers' tolerances:\n" << m;
}

}  // namespace
}  // namespace kiln
