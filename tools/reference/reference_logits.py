#!/usr/bin/env python3
"""PyTorch fp32 reference for a timm checkpoint directory on real photos.

Pre-processes the given images with timm's own eval transform (from the
checkpoint's pretrained_cfg), runs the model in fp32 with TF32 off, and
writes images_input.npy [N,3,H,W] and images_logits.npy [N,classes] so kiln
can be compared on exactly the same tensors (`kiln run`).
"""
import argparse
import json
import os
import sys

import numpy as np
import torch
import timm
from PIL import Image
from safetensors.torch import load_file


def load_model(model_dir):
    cfg = json.load(open(os.path.join(model_dir, "config.json")))
    model = timm.create_model(cfg["architecture"], pretrained=False, num_classes=cfg["num_classes"],
                              **cfg.get("model_args", {}))
    model.load_state_dict(load_file(os.path.join(model_dir, "model.safetensors")))
    return model.eval(), cfg


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--images", nargs="+", required=True)
    ap.add_argument("--out-dir", required=True)
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model, cfg = load_model(a.model_dir)
    data_cfg = timm.data.resolve_data_config({}, model=model, pretrained_cfg=cfg["pretrained_cfg"])
    tf = timm.data.create_transform(**data_cfg)
    x = torch.stack([tf(Image.open(p).convert("RGB")) for p in a.images])
    with torch.no_grad():
        y = model(x)
    os.makedirs(a.out_dir, exist_ok=True)
    np.save(os.path.join(a.out_dir, "images_input.npy"), x.numpy().astype(np.float32))
    np.save(os.path.join(a.out_dir, "images_logits.npy"), y.numpy().astype(np.float32))
    print(f"{a.model_dir}: {len(a.images)} images, top-1 {y.argmax(1).tolist()}", file=sys.stderr)


if __name__ == "__main__":
    main()
