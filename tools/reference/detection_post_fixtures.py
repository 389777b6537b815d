#!/usr/bin/env python3
"""Writes tests/fixtures/detection/post_process.json: small logits/boxes sets run through
transformers' own RTDetrImageProcessor.post_process_object_detection, so kiln's detection
post-processing (src/tasks/detection_post.hpp) is checked against the library, not against a
re-implementation. Cases cover ties (equal logits, sigmoid saturated at 1.0: torch.topk's order of
equal scores is that of its std::nth_element / std::partial_sort, not by index), a threshold equal
to a score (kept only when strictly above), boxes leaving the image (no clipping), a batch of
images of different sizes, and more queries x classes than the top-k keeps.

Usage: /work/venv-ref/bin/python tools/reference/detection_post_fixtures.py --out tests/fixtures/detection
Needs: torch, transformers.
"""
import argparse
import json
import os

import numpy as np
import torch
import transformers
from transformers.models.rt_detr.image_processing_rt_detr import RTDetrImageProcessor


class Out:
    def __init__(self, logits, boxes):
        self.logits, self.pred_boxes = logits, boxes


def case(name, logits, boxes, sizes, threshold):
    logits = torch.tensor(np.asarray(logits, dtype=np.float32))
    boxes = torch.tensor(np.asarray(boxes, dtype=np.float32))
    res = RTDetrImageProcessor().post_process_object_detection(Out(logits, boxes), threshold=threshold,
                                                               target_sizes=[tuple(s) for s in sizes])
    return {"name": name, "threshold": threshold, "sizes_hw": sizes,
            "logits": logits.tolist(), "boxes": boxes.tolist(),
            "expected": [{"scores": r["scores"].tolist(), "labels": r["labels"].tolist(),
                          "boxes": r["boxes"].tolist()} for r in res]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/fixtures/detection")
    args = ap.parse_args()
    rng = np.random.default_rng(12)
    cases = []
    # Random logits, 2 images of different sizes, threshold 0.3.
    q, c = 7, 4
    lg = rng.normal(0, 2, (2, q, c))
    bx = rng.uniform(0.05, 0.95, (2, q, 4))
    cases.append(case("random_batch", lg, bx, [[480, 640], [333, 250]], 0.3))
    # Ties: equal logits in several places, saturated scores (sigmoid(30) == 1.0 in float32).
    lg = rng.normal(0, 1, (1, 6, 3))
    lg[0, 1, 2] = lg[0, 4, 0] = lg[0, 0, 1] = 1.25
    lg[0, 2, :] = 30.0
    lg[0, 5, 1] = 40.0
    bx = rng.uniform(0.1, 0.9, (1, 6, 4))
    cases.append(case("ties_and_saturation", lg, bx, [[100, 200]], 0.0))
    # Threshold equal to a score: float32 sigmoid(0) = 0.5 exactly, kept only when > 0.5.
    lg = np.array([[[0.0, 1.0], [-1.0, 0.0], [0.5, 0.0]]])
    bx = np.array([[[0.5, 0.5, 0.2, 0.2], [0.1, 0.9, 0.4, 0.5], [0.95, 0.02, 0.3, 0.1]]])  # leave the image
    cases.append(case("strict_threshold_no_clip", lg, bx, [[64, 48]], 0.5))
    # Many queries, few kept: top-k is over all Q*C but only Q are kept.
    lg = rng.normal(-1, 3, (1, 20, 9))
    bx = rng.uniform(0, 1, (1, 20, 4))
    cases.append(case("topk_over_queries_times_classes", lg, bx, [[640, 427]], 0.1))
    # k * 64 <= Q * C: torch.topk takes its partial_sort path (the cases above its nth_element
    # path); ties again, as the order of equal scores differs between the two paths.
    lg = rng.normal(-2, 1, (1, 5, 70))
    lg[0, :, 3] = 20.0
    lg[0, 1, 60] = lg[0, 3, 7] = 20.0
    bx = rng.uniform(0, 1, (1, 5, 4))
    cases.append(case("partial_sort_path_ties", lg, bx, [[10, 20]], 0.2))
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "post_process.json")
    with open(path, "w") as f:
        json.dump({"generator": f"transformers {transformers.__version__}, torch {torch.__version__}",
                   "cases": cases}, f)
    print("wrote", path)


if __name__ == "__main__":
    main()
