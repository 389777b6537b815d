// Detection post-processing, transformers' post_process_object_detection
// (RT-DETR, use_focal_loss=True) step for step in float32:
//   scores = sigmoid(logits)                       [Q, C]
//   top num_top of the Q*C scores, sorted          (ties as torch.topk on the CPU)
//   class = index % C, query = index / C
//   (cx, cy, w, h) -> (cx - 0.5 w, cy - 0.5 h, cx + 0.5 w, cy + 0.5 h) * (W, H, W, H)
//   kept when score > threshold (strict)
// Boxes are not clipped to the image.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "kiln/kiln.hpp"

namespace kiln {

struct DetectionShape {
  int queries = 0, classes = 0;
  int num_top = 0;  // the top-k size: transformers takes k = queries
};

// Indices of the k largest values, as torch.topk(values, k) on the CPU returns them
// (equal values included: see detector.cpp).
std::vector<int64_t> torch_topk_order(const std::vector<float>& values, size_t k);

// One image: `logits` Q*C values, `boxes` Q*4 values (cx, cy, w, h in [0, 1]).
Detections postprocess_detections(const float* logits, const float* boxes, const DetectionShape& shape,
                                  int image_width, int image_height, float score_threshold,
                                  const std::vector<std::string>& labels);

// Intersection over union of two boxes (0 when both are empty).
float iou(const Detection& a, const Detection& b);

// The rule for 16-bit engines (TRTMC's): the same number of
// detections, and each reference detection (in score order) matched to a
// distinct one of the same class with IoU >= 0.5 and |score diff| <= 0.05.
// `allowed_unmatched` reference detections may go unmatched (a looser bound,
// documented where a case uses it). "" when the rule holds, else why not.
std::string detection_mismatch(const Detections& want, const Detections& got, size_t allowed_unmatched = 0);

}  // namespace kiln
