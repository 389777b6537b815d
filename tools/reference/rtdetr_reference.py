#!/usr/bin/env python3
"""PyTorch fp32 reference of an RT-DETR v2 checkpoint directory on photos, and stress inputs.

For MODEL_DIR (config.json + model.safetensors + preprocessor_config.json, e.g. from
make_fixtures_rtdetr.py --full-size) writes into --out-dir:
    images_input.npy       float32 [N, 3, H, W]: the photos through the checkpoint's own
                           RTDetrImageProcessor (bilinear resize, 8-bit rounding, /255)
    images_logits.npy      float32 [N, Q, C]    RTDetrV2ForObjectDetection, fp32, TF32 off, eval
    images_pred_boxes.npy  float32 [N, Q, 4]
    stress_zeros.npy, stress_ones.npy, stress_noise.npy   float32 [1, 3, H, W] inputs for the
                           non-finite scan: zeros, constant 1 (the largest pixel value), and seeded
                           uniform noise at 10x the pixel range ([-4.5, 5.5])
so kiln can be compared on exactly the same tensors (`kiln run`, tools/gpu/compare_rtdetr.py).
Runs on the CPU (deterministic); needs torch, transformers, PIL.
"""
import argparse
import os
import sys

import numpy as np
import torch
from PIL import Image

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--images", nargs="+", required=True)
    ap.add_argument("--out-dir", required=True)
    a = ap.parse_args()
    from transformers import RTDetrImageProcessor, RTDetrV2ForObjectDetection

    common.strict_fp32()
    model = RTDetrV2ForObjectDetection.from_pretrained(a.model_dir).eval()
    proc = RTDetrImageProcessor.from_pretrained(a.model_dir)
    x = proc(images=[Image.open(p).convert("RGB") for p in a.images], return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        out = model(pixel_values=x)
    os.makedirs(a.out_dir, exist_ok=True)
    save = lambda name, t: np.save(os.path.join(a.out_dir, name), np.asarray(t, dtype=np.float32))
    save("images_input.npy", x.numpy())
    save("images_logits.npy", out.logits.numpy())
    save("images_pred_boxes.npy", out.pred_boxes.numpy())
    shape = (1,) + tuple(x.shape[1:])
    save("stress_zeros.npy", np.zeros(shape))
    save("stress_ones.npy", np.ones(shape))
    save("stress_noise.npy", np.random.default_rng(20261202).uniform(-4.5, 5.5, size=shape))
    scores = out.logits.sigmoid().flatten(1).max(1).values
    print(f"{a.model_dir}: {len(a.images)} images {tuple(x.shape)}, best score per image {scores.tolist()}",
          file=sys.stderr)


if __name__ == "__main__":
    main()
