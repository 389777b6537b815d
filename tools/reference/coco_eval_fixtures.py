#!/usr/bin/env python3
"""Writes tests/fixtures/coco/: synthetic COCO ground truth + detection sets and the stats
pycocotools' own COCOeval (iouType bbox) gives for them, so kiln's C++ evaluation
(src/tasks/coco_eval.cpp) is checked against the library itself.

Cases: crowd boxes (matched by intersection over detection area, never counted as misses),
images without GT, images without detections, a category without GT (-1, left out of the means),
a category in the file but in no annotation or detection, more than 100 detections on one image
(maxDets), every area range, equal scores across images (stable sorts), ids that are not
contiguous, and an image subset (imgIds, what `kiln eval --limit` evaluates).

Usage: /work/venv-ref/bin/python tools/reference/coco_eval_fixtures.py --out tests/fixtures/coco
Needs: numpy, pycocotools.
"""
import argparse
import contextlib
import io
import json
import os

import numpy as np
from importlib.metadata import version
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval


def jitter(rng, box, amount):
    x, y, w, h = box
    return [round(float(x + rng.normal(0, amount * w)), 2), round(float(y + rng.normal(0, amount * h)), 2),
            round(float(max(1.0, w * (1 + rng.normal(0, amount)))), 2),
            round(float(max(1.0, h * (1 + rng.normal(0, amount)))), 2)]


def random_box(rng, W, H, size):
    w = float(rng.uniform(0.6, 1.4) * size)
    h = float(rng.uniform(0.6, 1.4) * size)
    return [round(float(rng.uniform(0, max(1, W - w))), 2), round(float(rng.uniform(0, max(1, H - h))), 2),
            round(w, 2), round(h, 2)]


def make_case(rng, n_images, cat_ids, gt_cats, crowd_frac, many_dets_image, empty_images, nodet_images):
    images, anns, dets = [], [], []
    ann_id = 7  # not contiguous, not starting at 1
    for i in range(n_images):
        img_id = 1000 + 3 * i
        W, H = int(rng.integers(200, 700)), int(rng.integers(200, 700))
        images.append({"id": img_id, "file_name": f"img{i:03d}.jpg", "width": W, "height": H})
        if i in empty_images:
            n_gt = 0
        else:
            n_gt = int(rng.integers(1, 8))
        for _ in range(n_gt):
            cat = int(rng.choice(gt_cats))
            size = float(rng.choice([12, 28, 45, 80, 130, 220]))  # small, medium, large areas
            box = random_box(rng, W, H, size)
            crowd = int(rng.random() < crowd_frac)
            if crowd:  # a crowd region is large and holds several detections
                box = random_box(rng, W, H, 160)
            # COCO's `area` is the segmentation area, a little below w * h.
            area = round(box[2] * box[3] * float(rng.uniform(0.6, 1.0)), 2)
            anns.append({"id": ann_id, "image_id": img_id, "category_id": cat, "bbox": box, "area": area,
                         "iscrowd": crowd})
            ann_id += int(rng.integers(1, 4))
            if i in nodet_images:
                continue
            for _ in range(int(rng.integers(0, 3)) + (2 if crowd else 0)):  # duplicates, inside crowds
                dets.append({"image_id": img_id, "category_id": cat if rng.random() < 0.85 else int(rng.choice(cat_ids)),
                             "bbox": jitter(rng, box, 0.08 if not crowd else 0.3),
                             "score": round(float(rng.uniform(0.05, 1.0)), 3)})
        if i in nodet_images:
            continue
        n_fp = 120 if i == many_dets_image else int(rng.integers(0, 6))
        for _ in range(n_fp):  # false positives, of every category (also those without GT)
            dets.append({"image_id": img_id, "category_id": int(rng.choice(cat_ids)),
                         "bbox": random_box(rng, W, H, float(rng.choice([10, 40, 120]))),
                         "score": round(float(rng.uniform(0.0, 0.9)), 2)})  # 2 decimals: many ties
    return images, anns, dets


def evaluate(gt, dets, img_ids=None):
    with contextlib.redirect_stdout(io.StringIO()):
        coco = COCO()
        coco.dataset = json.loads(json.dumps(gt))
        coco.createIndex()
        res = coco.loadRes(json.loads(json.dumps(dets)))
        e = COCOeval(coco, res, "bbox")
        if img_ids is not None:
            e.params.imgIds = img_ids
        e.evaluate()
        e.accumulate()
        e.summarize()
    per_cat = {}
    prec = e.eval["precision"]  # T R K A M
    for k, c in enumerate(e.params.catIds):
        s = prec[:, :, k, 0, 2]
        per_cat[str(c)] = float(np.mean(s[s > -1])) if (s > -1).any() else -1.0
    return [float(v) for v in e.stats], per_cat


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/fixtures/coco")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    specs = [
        # name, seed, images, categories, categories with GT, crowd fraction, many-dets image, empty, no-dets
        ("mixed", 1, 12, [1, 2, 5, 9], [1, 2, 5], 0.15, 3, {4}, {7}),
        ("crowds", 2, 6, [3, 4], [3, 4], 0.5, -1, set(), set()),
        ("many_dets", 3, 4, [1, 2, 3], [1, 2, 3], 0.0, 0, {2}, set()),
        ("one_class", 4, 8, [1], [1], 0.1, -1, {0}, {5}),
    ]
    expected = {"generator": f"pycocotools {version('pycocotools')}", "cases": []}
    for name, seed, n, cats, gt_cats, crowd, many, empty, nodet in specs:
        rng = np.random.default_rng(seed)
        images, anns, dets = make_case(rng, n, cats, gt_cats, crowd, many, empty, nodet)
        gt = {"images": images, "annotations": anns,
              "categories": [{"id": c, "name": f"class{c}"} for c in cats] + [{"id": 42, "name": "unused"}],
              "info": {"description": f"kiln synthetic case {name}"}}
        gt_file, det_file = f"{name}_gt.json", f"{name}_dets.json"
        with open(os.path.join(args.out, gt_file), "w") as f:
            json.dump(gt, f)
        with open(os.path.join(args.out, det_file), "w") as f:
            json.dump(dets, f)
        stats, per_cat = evaluate(gt, dets)
        expected["cases"].append({"name": name, "gt": gt_file, "dets": det_file, "stats": stats,
                                  "ap_per_category": per_cat, "detections": len(dets), "annotations": len(anns)})
        subset = sorted(im["id"] for im in images)[: max(1, n // 2)]
        stats, per_cat = evaluate(gt, dets, subset)
        expected["cases"].append({"name": name + "_subset", "gt": gt_file, "dets": det_file, "image_ids": subset,
                                  "stats": stats, "ap_per_category": per_cat})
    # Perfect detections: every stat that has GT is 1.
    rng = np.random.default_rng(5)
    images, anns, _ = make_case(rng, 3, [1, 2], [1, 2], 0.0, -1, set(), set())
    dets = [{"image_id": a["image_id"], "category_id": a["category_id"], "bbox": a["bbox"], "score": 0.9}
            for a in anns]
    gt = {"images": images, "annotations": anns, "categories": [{"id": 1, "name": "a"}, {"id": 2, "name": "b"}]}
    with open(os.path.join(args.out, "perfect_gt.json"), "w") as f:
        json.dump(gt, f)
    with open(os.path.join(args.out, "perfect_dets.json"), "w") as f:
        json.dump(dets, f)
    stats, per_cat = evaluate(gt, dets)
    expected["cases"].append({"name": "perfect", "gt": "perfect_gt.json", "dets": "perfect_dets.json",
                              "stats": stats, "ap_per_category": per_cat})
    with open(os.path.join(args.out, "expected.json"), "w") as f:
        json.dump(expected, f, indent=1)
    for c in expected["cases"]:
        print(c["name"], " ".join(f"{v:.4f}" for v in c["stats"]))


if __name__ == "__main__":
    main()
