// Helpers of the rt_detr_v2 tests (the family's CPU tests and the CUDA test
// tests/gpu/test_cuda_rtdetr.cpp): the fixtures, the fp32 rule against
// PyTorch, and the detection-matching rule for 16-bit engines.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "../../../tests/unit/family_test_util.hpp"
#include "bundle/builder.hpp"
#include "core/error.hpp"
#include "core/npy.hpp"
#include "kiln/kiln.hpp"
#include "tasks/detection_post.hpp"

namespace kiln::testing::rtdetr {

namespace fs = std::filesystem;
inline const fs::path kFixtures = fs::path(KILN_FIXTURES_DIR) / "rt_detr_v2";

inline float max_abs(const std::vector<float>& v) {
  float m = 0;
  for (float f : v) m = std::max(m, std::fabs(f));
  return m;
}
inline float max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  float m = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

// TRTMC's fp32 rule: max|diff| <= 1e-3 * max|ref|, for logits and boxes.
inline void expect_matches(const std::string& what, const std::vector<float>& logits, const std::vector<float>& boxes,
                           const fs::path& dir) {
  const std::vector<float> want_l = read_npy(dir / "logits.npy").to_f32();
  const std::vector<float> want_b = read_npy(dir / "pred_boxes.npy").to_f32();
  EXPECT_LE(max_diff(logits, want_l), 1e-3f * max_abs(want_l)) << what << " logits";
  EXPECT_LE(max_diff(boxes, want_b), 1e-3f * max_abs(want_b)) << what << " pred_boxes";
}

// Fixture `name` built for `backend` at `precision` and `opt_level` (batch =
// the input's, IR verifier on) and run on its input.npy: the engine's
// outputs (logits, pred_boxes).
inline std::vector<Tensor> run_fixture(const std::string& name, const std::string& backend, DType precision,
                                       int opt_level = 3) {
  const fs::path dir = kFixtures / name;
  const HostTensor x = read_npy(dir / "input.npy");
  const fs::path tmp = temp_dir(cat("rtdetr_", name, "_", backend, "_", dtype_name(precision), "_o", opt_level));
  BuildOptions o;
  o.model = dir.string();
  o.backend = backend;
  o.precision = precision;
  o.opt_level = opt_level;
  o.batch = static_cast<int>(x.shape.at(0));
  o.verify = true;
  build_bundle(o, tmp / "m.bundle");
  std::vector<Tensor> out = Engine::load((tmp / "m.bundle").string())->create_context()->run({{"pixel_values", x.shape, x.to_f32()}});
  fs::remove_all(tmp);
  EXPECT_EQ(out.size(), 2u) << name;
  if (out.size() == 2) {
    EXPECT_EQ(out[0].name, "logits");
    EXPECT_EQ(out[1].name, "pred_boxes");
    EXPECT_EQ(out[0].shape, read_npy(dir / "logits.npy").shape);
    EXPECT_EQ(out[1].shape, read_npy(dir / "pred_boxes.npy").shape);
  }
  return out;
}

inline float iou(const Detection& a, const Detection& b) {
  const float iw = std::max(0.f, std::min(a.x_max, b.x_max) - std::max(a.x_min, b.x_min));
  const float ih = std::max(0.f, std::min(a.y_max, b.y_max) - std::max(a.y_min, b.y_min));
  const float inter = iw * ih;
  const float uni = (a.x_max - a.x_min) * (a.y_max - a.y_min) + (b.x_max - b.x_min) * (b.y_max - b.y_min) - inter;
  return uni > 0 ? inter / uni : 0.f;
}

// Image `i` of [N, Q, C] logits and [N, Q, 4] boxes post-processed as the
// detection task does (sigmoid, top Q of Q*C, score > threshold), on a
// width x height image.
inline Detections detections_of(const std::vector<float>& logits, const std::vector<float>& boxes, const Shape& logits_shape,
                                size_t i, int width, int height, float threshold) {
  DetectionShape s;
  s.queries = static_cast<int>(logits_shape.at(1));
  s.classes = static_cast<int>(logits_shape.at(2));
  s.num_top = s.queries;
  const size_t qc = static_cast<size_t>(s.queries) * static_cast<size_t>(s.classes);
  return postprocess_detections(logits.data() + i * qc, boxes.data() + i * static_cast<size_t>(s.queries) * 4, s, width,
                                height, threshold, {});
}

// The rule for 16-bit engines (TRTMC's): the same number of
// detections, and each reference detection (in score order) matched to a
// distinct one of the same class with IoU >= 0.5 and |score diff| <= 0.05.
// `allowed_unmatched` reference detections may go unmatched (a looser bound,
// documented where a case uses it). "" when the rule holds, else why not.
inline std::string detection_mismatch(const Detections& want, const Detections& got, size_t allowed_unmatched = 0) {
  if (want.boxes.size() != got.boxes.size())
    return cat(got.boxes.size(), " detections, the reference has ", want.boxes.size());
  std::vector<char> used(got.boxes.size(), 0);
  std::string first;
  size_t unmatched = 0;
  for (size_t k = 0; k < want.boxes.size(); ++k) {
    const Detection& w = want.boxes[k];
    int best = -1;
    float best_iou = 0.5f;
    for (size_t j = 0; j < got.boxes.size(); ++j) {
      const Detection& g = got.boxes[j];
      if (used[j] || g.class_id != w.class_id || std::fabs(g.score - w.score) > 0.05f) continue;
      const float v = iou(w, g);
      if (v >= best_iou) best = static_cast<int>(j), best_iou = v;
    }
    if (best >= 0) {
      used[static_cast<size_t>(best)] = 1;
      continue;
    }
    if (unmatched++ == 0)
      first = cat("reference detection ", k, " (class ", w.class_id, ", score ", w.score, ", box [", w.x_min, ", ", w.y_min,
                  ", ", w.x_max, ", ", w.y_max, "]) has no match (same class, IoU >= 0.5, |score diff| <= 0.05)");
  }
  if (unmatched <= allowed_unmatched) return "";
  return cat(unmatched, " of ", want.boxes.size(), " reference detections unmatched (", allowed_unmatched, " allowed); first: ", first);
}

// Reference detections per image a 16-bit engine of a seeded fixture may
// miss: the fixtures' encoder top-k gaps (manifest.json min_selection_gap,
// 7e-5 .. 3e-4) are below fp16 rounding, so an anchor near the cut can be
// swapped for another and its detection replaced (measured on the fp16 CPU
// engine: 0, 0 and 1 of 20-30 per image). Raw outputs are not comparable by
// query index for the same reason (max|diff| / max|ref| 0.3 .. 0.9).
inline constexpr size_t kSeededFp16Unmatched = 2;

// The 16-bit rule on every image of a fixture (input shape [N, 3, H, W]),
// with the outputs' max|diff| / max|ref| printed for the record.
inline void expect_fp16_rule(const std::string& what, const std::vector<float>& logits, const std::vector<float>& boxes,
                             const Shape& input_shape, const fs::path& dir, size_t allowed_unmatched = kSeededFp16Unmatched) {
  const HostTensor want_l = read_npy(dir / "logits.npy"), want_b = read_npy(dir / "pred_boxes.npy");
  const std::vector<float> wl = want_l.to_f32(), wb = want_b.to_f32();
  ASSERT_EQ(logits.size(), wl.size()) << what;
  ASSERT_EQ(boxes.size(), wb.size()) << what;
  std::printf("%s %s: logits max|diff|/max|ref| %.3g, boxes %.3g\n", what.c_str(), dir.filename().string().c_str(),
              max_diff(logits, wl) / max_abs(wl), max_diff(boxes, wb) / max_abs(wb));
  const int h = static_cast<int>(input_shape.at(2)), w = static_cast<int>(input_shape.at(3));
  for (size_t i = 0; i < static_cast<size_t>(want_l.shape.at(0)); ++i) {
    const Detections want = detections_of(wl, wb, want_l.shape, i, w, h, 0.3f);
    const Detections got = detections_of(logits, boxes, want_l.shape, i, w, h, 0.3f);
    EXPECT_EQ(detection_mismatch(want, got, allowed_unmatched), "") << what << " " << dir.filename() << " image " << i << " ("
                                                            << want.boxes.size() << " reference detections)";
  }
}

}  // namespace kiln::testing::rtdetr
