// transformers' own golden values for the real RT-DETR v2 checkpoint (issue
// #12 §4, FIELD-NOTES §7): `PekingU/rtdetr_v2_r18vd` on COCO val image
// 000000039769 (the PNG transformers' tests read, 640 x 480), as its
// integration test (tests/models/rt_detr_v2/test_modeling_rt_detr_v2.py,
// test_inference_object_detection_head) states them: logits[0, :3, :3],
// pred_boxes[0, :3, :3], and the first four detections of
// post_process_object_detection at threshold 0 in original-image pixels.
//
// kiln never downloads, so the checks run where both are on local disk and
// skip elsewhere, saying what is missing and where they looked:
// - the checkpoint in the local Hugging Face cache (resolve_model: $HF_HUB_CACHE,
//   $HF_HOME/hub, $XDG_CACHE_HOME/huggingface/hub or ~/.cache/huggingface/hub),
//   e.g. after `huggingface-cli download PekingU/rtdetr_v2_r18vd`;
// - the image at $KILN_RTDETR_GOLDEN_IMAGE, in the cache's copy of the
//   dataset hf-internal-testing/fixtures_image_utils (any folder), or at
//   tests/fixtures/images/coco/000000039769.png.
// Used by test_rtdetr_hub_golden.cpp (the CPU engine) and
// tests/gpu/test_cuda_rtdetr.cpp (CUDA fp32 and fp16).
#pragma once
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <string>
#include <system_error>
#include <vector>

#include "bundle/builder.hpp"
#include "checkpoint/hf_cache.hpp"
#include "core/error.hpp"
#include "kiln/kiln.hpp"
#include "tasks/detection_post.hpp"

namespace kiln::testing::rtdetr_golden {

namespace fs = std::filesystem;

inline constexpr const char* kModel = "PekingU/rtdetr_v2_r18vd";
inline constexpr const char* kImageName = "000000039769.png";
inline constexpr const char* kImageEnv = "KILN_RTDETR_GOLDEN_IMAGE";
inline constexpr const char* kImageDataset = "datasets--hf-internal-testing--fixtures_image_utils";
inline constexpr int kImageWidth = 640, kImageHeight = 480;

// The values (transformers' CPU expectations).
inline constexpr float kLogits[3][3] = {{-3.7047f, -5.1914f, -6.1787f}, {-4.0108f, -9.3449f, -5.2047f}, {-4.1287f, -4.7461f, -5.8633f}};
inline constexpr float kBoxes[3][3] = {{0.2582f, 0.5497f, 0.4764f}, {0.1684f, 0.1985f, 0.2120f}, {0.7665f, 0.4146f, 0.4669f}};
inline constexpr float kScores[4] = {0.9652f, 0.9599f, 0.9462f, 0.8613f};
inline constexpr int kLabels[4] = {15, 15, 65, 57};
inline constexpr float kCorners[4][4] = {{341.14f, 25.111f, 639.98f, 372.89f},
                                         {12.780f, 56.346f, 317.67f, 471.34f},
                                         {39.959f, 73.117f, 175.65f, 117.44f},
                                         {-0.10521f, 2.9717f, 639.89f, 473.62f}};
// The test's tolerances (torch.testing.assert_close: |got - want| <= atol + rtol |want|).
inline constexpr float kRawAtol = 2e-4f, kRawRtol = 2e-4f;        // logits and pred_boxes
inline constexpr float kDetAtol = 1e-3f, kDetRtol = 2e-4f;        // scores and corner boxes

// Where the checks' inputs are, or why they cannot run.
struct Inputs {
  fs::path model_dir;  // the checkpoint's snapshot (config.json, model.safetensors)
  fs::path image;
  std::string missing;  // "" when both were found
};

// The image: $KILN_RTDETR_GOLDEN_IMAGE, then any file named kImageName in
// the hub cache's copy of the fixtures dataset (at most 6 folders down; cache
// snapshots hold links to blobs, followed), then the repository's fixture
// folder `repo_images` (tests/fixtures/images). Empty when none exists;
// `looked` lists the places.
inline fs::path find_image(const fs::path& repo_images, std::string& looked) {
  std::error_code ec;
  std::ostringstream where;
  if (const char* v = std::getenv(kImageEnv); v && *v) {
    where << "$" << kImageEnv << " (" << v << "), ";
    if (fs::is_regular_file(v, ec)) return v;
  } else {
    where << "$" << kImageEnv << " (unset), ";
  }
  fs::path hub;
  try {
    hub = hf_hub_cache_dir();
  } catch (const Error&) {
  }
  if (!hub.empty()) {
    const fs::path ds = hub / kImageDataset;
    where << ds.string() << ", ";
    if (fs::is_directory(ds, ec)) {
      fs::recursive_directory_iterator it(ds, fs::directory_options::skip_permission_denied, ec), end;
      for (; !ec && it != end; it.increment(ec)) {
        if (it.depth() >= 6) it.disable_recursion_pending();
        if (it->path().filename() == kImageName && fs::is_regular_file(it->path(), ec)) return it->path();
      }
    }
  }
  const fs::path local = repo_images / "coco" / kImageName;
  where << local.string();
  if (fs::is_regular_file(local, ec)) return local;
  looked = where.str();
  return {};
}

inline Inputs find_inputs(const fs::path& repo_images) {
  Inputs in;
  try {
    in.model_dir = resolve_model(kModel, "").dir;
  } catch (const Error& e) {
    in.missing = cat("the checkpoint is not in the local Hugging Face cache: ", e.what());
    return in;
  }
  std::string looked;
  in.image = find_image(repo_images, looked);
  if (in.image.empty()) in.missing = cat(kImageName, " (COCO val, the image transformers' test reads) not found; looked at ", looked);
  return in;
}

inline bool within(float got, float want, float atol, float rtol) {
  return std::fabs(got - want) <= atol + rtol * std::fabs(want);  // false for NaN
}

// fp32 engines, by transformers' own tolerances: [1, Q, C] logits and
// [1, Q, 4] boxes (the first 3 x 3 of each), and the detections at threshold
// 0 (first four: score, label, corners). "" when everything holds, else one
// line per entry out of tolerance, naming it.
inline std::string fp32_mismatch(const std::vector<float>& logits, int64_t classes, const std::vector<float>& boxes,
                                 const Detections& d) {
  std::ostringstream out;
  if (classes < 3 || logits.size() < static_cast<size_t>(3 * classes) || boxes.size() < 12)
    return cat("outputs too small: ", logits.size(), " logits of ", classes, " classes, ", boxes.size(), " box values");
  for (int q = 0; q < 3; ++q)
    for (int c = 0; c < 3; ++c) {
      const float gl = logits[static_cast<size_t>(q * classes + c)], gb = boxes[static_cast<size_t>(q * 4 + c)];
      if (!within(gl, kLogits[q][c], kRawAtol, kRawRtol)) out << "logits[0," << q << "," << c << "] " << gl << ", want " << kLogits[q][c] << "\n";
      if (!within(gb, kBoxes[q][c], kRawAtol, kRawRtol)) out << "pred_boxes[0," << q << "," << c << "] " << gb << ", want " << kBoxes[q][c] << "\n";
    }
  if (d.image_width != kImageWidth || d.image_height != kImageHeight)
    out << "image size " << d.image_width << "x" << d.image_height << ", want " << kImageWidth << "x" << kImageHeight << "\n";
  if (d.boxes.size() < 4) return out.str() + cat(d.boxes.size(), " detections at threshold 0, want at least 4\n");
  for (int i = 0; i < 4; ++i) {
    const Detection& g = d.boxes[static_cast<size_t>(i)];
    if (!within(g.score, kScores[i], kDetAtol, kDetRtol)) out << "detection " << i << " score " << g.score << ", want " << kScores[i] << "\n";
    if (g.class_id != kLabels[i]) out << "detection " << i << " label " << g.class_id << ", want " << kLabels[i] << "\n";
    const float got[4] = {g.x_min, g.y_min, g.x_max, g.y_max};
    for (int k = 0; k < 4; ++k)
      if (!within(got[k], kCorners[i][k], kDetAtol, kDetRtol))
        out << "detection " << i << " box[" << k << "] " << got[k] << ", want " << kCorners[i][k] << "\n";
  }
  return out.str();
}

// 16-bit engines, by the rule (detection_mismatch: each of the four
// golden detections matched by label with IoU >= 0.5 and |score diff| <=
// 0.05) against the engine's first four at threshold 0.
inline std::string fp16_mismatch(const Detections& d) {
  Detections want, got = d;
  want.image_width = kImageWidth, want.image_height = kImageHeight;
  for (int i = 0; i < 4; ++i)
    want.boxes.push_back({kCorners[i][0], kCorners[i][1], kCorners[i][2], kCorners[i][3], kScores[i], kLabels[i], ""});
  if (got.boxes.size() > 4) got.boxes.resize(4);
  return detection_mismatch(want, got);
}

// The checkpoint `in` found, built for `backend` at `precision` into `bundle` and loaded.
inline std::shared_ptr<const Engine> build_engine(const Inputs& in, const std::string& backend, DType precision,
                                                  const fs::path& bundle) {
  BuildOptions o;
  o.model = in.model_dir.string();
  o.backend = backend;
  o.precision = precision;
  build_bundle(o, bundle);
  return Engine::load(bundle.string());
}

// The golden image through `engine` (a detection bundle of kModel): the raw
// outputs of one call on the pre-processed image and the detections at
// threshold 0 (the Detector's pre- and post-processing).
struct Run {
  std::vector<float> logits, boxes;
  int64_t classes = 0;
  Detections detections;
};
inline Run run(const std::shared_ptr<const Engine>& engine, const fs::path& image) {
  Run r;
  Detector det(engine);
  DetectionInput in = det.preprocess_file(image.string());
  std::vector<int64_t> shape = engine->inputs().at(0).shape;
  shape.at(0) = 1;
  const auto out = engine->create_context()->run({{engine->inputs().at(0).name, shape, in.pixels}});
  for (const Tensor& t : out) {
    if (t.name == "logits") r.logits = t.data, r.classes = t.shape.at(2);
    if (t.name == "pred_boxes") r.boxes = t.data;
  }
  r.detections = det.detect_preprocessed({in}, 0.0f).at(0);
  std::printf("%s on %s: logits[0,0,:3] %.4f %.4f %.4f; first detection %.4f label %d\n", kModel, image.filename().c_str(),
              r.logits.size() > 2 ? r.logits[0] : NAN, r.logits.size() > 2 ? r.logits[1] : NAN,
              r.logits.size() > 2 ? r.logits[2] : NAN, r.detections.boxes.empty() ? NAN : r.detections.boxes[0].score,
              r.detections.boxes.empty() ? -1 : r.detections.boxes[0].class_id);
  return r;
}

}  // namespace kiln::testing::rtdetr_golden
