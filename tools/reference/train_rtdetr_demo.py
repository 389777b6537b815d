#!/usr/bin/env python3
"""Train kiln's RT-DETR v2 demo detector on a synthetic shapes set (issue #12 section 4).

Data (deterministic from --seed): RGB images of --size x --size (default 320) with a textured
background (low-frequency colour noise, stripes and fine grain) and 1..6 filled shapes of four
classes - ellipse, rectangle, triangle, cross - in random colours, sizes and aspect ratios. The
image is cut into a 3x3 grid and each object lies inside its own cell, so objects never overlap
and every box is tight: [cx - rx, cy - ry, 2 rx, 2 ry] (the triangle's apex is on the top edge,
its base on the bottom edge). The train split (--train-images, seed --seed) is drawn once and kept in
memory on the training device, batches sampled from it with random horizontal flips; the held-out
split (seed --seed + 1, --heldout images) is drawn the same way and written as JPEG.

Model: RTDetrV2ForObjectDetection from an offline config: an r18vd-structured ResNet-vd backbone
(basic blocks, depths 2,2,2,2, three-conv stem) at reduced widths, hybrid encoder and a 3-layer
decoder at d_model 128, 100 queries, 4 labels. Trained with transformers' own loss (labels as
[{"class_labels", "boxes"}] with normalized cx, cy, w, h; denoising on) with AdamW and AMP
(bf16 autocast on CUDA) until --minutes of wall clock have passed. The backbone's BatchNorms are
trained as ordinary BatchNorm2d (freeze_backbone_batch_norms false: frozen identity norms do not
train from scratch) and saved as the FrozenBatchNorm buffers of the shipped config.

Writes (--out, default models/rtdetr_demo):
    config.json, model.safetensors   save_pretrained, tensors in F16 (kiln widens them to f32)
    preprocessor_config.json         RTDetrImageProcessor's fields: 320x320, /255, no normalize
    heldout/images/NNNNNN.jpg        the held-out images; heldout/annotations.json (COCO format)
    samples/*.jpg                    a few held-out images for `kiln detect`
    reference.json                   PyTorch fp32 mAP50-95 / mAP50 of the shipped model (its F16
                                     weights widened to f32) on the held-out JPEGs read back from
                                     disk; evaluator, versions, training time, steps
    reference_detections.json        PyTorch's detections (COCO results format)

Pre-/post-processing follow kiln's detection contract (families/rt_detr_v2/README.md): pixels =
RGB resized to the input size (PIL bilinear; a no-op here, the images are written at the input
size) / 255; sigmoid, top num_queries over Q x C, label = index % C, corners x image size, keep
score > 0. mAP with pycocotools when it imports, else with the re-implementation of its bbox rules
below (reference.json's "evaluator" says which).

Usage (the GPU machine; the whole run, data and evaluation included, fits one 600 s call):
    python3 tools/reference/train_rtdetr_demo.py --out models/rtdetr_demo --minutes 6
CPU dry run (proves the pipeline, does not learn much):
    python3 tools/reference/train_rtdetr_demo.py --out /tmp/rtdemo --device cpu --minutes 1 \
        --size 160 --heldout 24 --train-images 64 --batch-size 4
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import common  # noqa: E402

SEED = 20261204
CLASSES = ["ellipse", "rectangle", "triangle", "cross"]
GRID = 3
MAX_OBJECTS = 6


# --------------------------------------------------------------------------- data

def draw_batch(n: int, size: int, gen: torch.Generator, device) -> tuple[torch.Tensor, list]:
    """n synthetic images as uint8 [n, size, size, 3] (on device) and their targets.

    Targets: per image a dict with "class_labels" (long [k]) and "boxes" (float [k, 4], cx, cy, w, h
    normalized to the image size); all random numbers come from `gen` (a CPU generator), so the
    images depend on the seed only, not on the device.
    """
    def rnd(*shape):
        return torch.rand(shape, generator=gen, dtype=torch.float32)

    # Background: a coarse colour grid upsampled bilinearly, plus stripes, plus fine grain.
    coarse = 40.0 + 175.0 * rnd(n, 3, 6, 6)
    bg = torch.nn.functional.interpolate(coarse, size=(size, size), mode="bilinear", align_corners=False)
    ys = torch.arange(size, dtype=torch.float32).view(1, 1, size, 1)
    xs = torch.arange(size, dtype=torch.float32).view(1, 1, 1, size)
    ang = rnd(n, 1, 1, 1) * math.pi
    freq = 0.05 + 0.15 * rnd(n, 1, 1, 1)
    stripes = torch.sin((xs * torch.cos(ang) + ys * torch.sin(ang)) * freq) * (25.0 * rnd(n, 1, 1, 1))
    grain = (rnd(n, 1, size, size) - 0.5) * 12.0
    img = bg + stripes + grain  # [n, 3, H, W]

    cell = size / GRID
    counts = 1 + (rnd(n) * MAX_OBJECTS).long().clamp(max=MAX_OBJECTS - 1)
    targets = []
    for i in range(n):
        k = int(counts[i])
        cells = torch.randperm(GRID * GRID, generator=gen)[:k]
        cls = (rnd(k) * len(CLASSES)).long().clamp(max=len(CLASSES) - 1)
        boxes = []
        for j in range(k):
            r0, c0 = divmod(int(cells[j]), GRID)
            ry = float(size * (0.04 + 0.11 * rnd(1)))  # half height: 4 %..15 % of the image
            rx = float(ry * (0.7 + 0.6 * rnd(1)))
            rx, ry = min(rx, cell / 2 - 1), min(ry, cell / 2 - 1)
            cx = c0 * cell + rx + float(rnd(1)) * (cell - 2 * rx)
            cy = r0 * cell + ry + float(rnd(1)) * (cell - 2 * ry)
            x0, x1 = max(int(math.floor(cx - rx)), 0), min(int(math.ceil(cx + rx)) + 1, size)
            y0, y1 = max(int(math.floor(cy - ry)), 0), min(int(math.ceil(cy + ry)) + 1, size)
            # pixel centres relative to the shape's centre, in units of its half extents
            dx = ((torch.arange(x0, x1, dtype=torch.float32) + 0.5 - cx) / rx).view(1, -1)
            dy = ((torch.arange(y0, y1, dtype=torch.float32) + 0.5 - cy) / ry).view(-1, 1)
            c = int(cls[j])
            if c == 0:
                mask = dx * dx + dy * dy <= 1.0
            elif c == 1:
                mask = (dx.abs() <= 1.0) & (dy.abs() <= 1.0)
            elif c == 2:
                mask = (dy.abs() <= 1.0) & (dx.abs() <= (dy + 1.0) * 0.5)
            else:
                t = 0.34
                mask = ((dx.abs() <= 1.0) & (dy.abs() <= t)) | ((dx.abs() <= t) & (dy.abs() <= 1.0))
            region = img[i, :, y0:y1, x0:x1]
            bg_mean = region.mean(dim=(1, 2))
            colour = 255.0 * rnd(3)
            if float((colour - bg_mean).abs().mean()) < 70.0:
                colour = torch.where(bg_mean > 127.0, bg_mean - 110.0 - 30.0 * rnd(3), bg_mean + 110.0 + 30.0 * rnd(3))
            shade = colour.view(3, 1, 1) + (rnd(1, y1 - y0, x1 - x0) - 0.5) * 12.0
            img[i, :, y0:y1, x0:x1] = torch.where(mask.unsqueeze(0), shade, region)
            boxes.append([cx / size, cy / size, 2 * rx / size, 2 * ry / size])
        targets.append({"class_labels": cls.to(device), "boxes": torch.tensor(boxes, dtype=torch.float32).to(device)})
    u8 = img.clamp(0, 255).round().to(torch.uint8).permute(0, 2, 3, 1).contiguous().to(device)
    return u8, targets


def to_pixels(u8: torch.Tensor) -> torch.Tensor:
    """uint8 [n, H, W, 3] -> float32 pixel_values [n, 3, H, W] / 255 (RTDetrImageProcessor: rescale only)."""
    return u8.permute(0, 3, 1, 2).float().div(255.0)


# --------------------------------------------------------------------------- model

def make_config(num_queries: int, backbone_bn_frozen: bool):
    from transformers import RTDetrResNetConfig, RTDetrV2Config

    # r18vd structure (basic blocks, depths 2,2,2,2, ResNet-vd stem and avg-pool shortcuts) at half width.
    bb = RTDetrResNetConfig(num_channels=3, embedding_size=32, hidden_sizes=[32, 64, 128, 256], depths=[2, 2, 2, 2],
                            layer_type="basic", hidden_act="relu", downsample_in_first_stage=False,
                            out_features=["stage2", "stage3", "stage4"], out_indices=[2, 3, 4])
    d = 128
    return RTDetrV2Config(
        backbone_config=bb, freeze_backbone_batch_norms=backbone_bn_frozen,
        encoder_in_channels=[64, 128, 256], encoder_hidden_dim=d, encoder_ffn_dim=256, encoder_attention_heads=8,
        hidden_expansion=0.5, d_model=d, decoder_in_channels=[d, d, d], decoder_ffn_dim=256,
        decoder_attention_heads=8, decoder_layers=3, num_queries=num_queries, num_labels=len(CLASSES),
        id2label={i: c for i, c in enumerate(CLASSES)}, label2id={c: i for i, c in enumerate(CLASSES)},
        num_denoising=100, tie_word_embeddings=False)


def linear_sum_assignment_np(cost):
    """scipy.optimize.linear_sum_assignment (minimum cost, rectangular) for when scipy is missing:
    the shortest-augmenting-path Hungarian method with potentials over the shorter side."""
    a = np.asarray(cost, dtype=np.float64)
    transposed = a.shape[0] > a.shape[1]
    if transposed:
        a = a.T
    n, m = a.shape
    u, v = np.zeros(n + 1), np.zeros(m + 1)
    p, way = np.zeros(m + 1, dtype=np.int64), np.zeros(m + 1, dtype=np.int64)
    for i in range(1, n + 1):
        p[0], j0 = i, 0
        minv = np.full(m + 1, np.inf)
        used = np.zeros(m + 1, dtype=bool)
        while True:
            used[j0] = True
            i0 = p[j0]
            cur = a[i0 - 1] - u[i0] - v[1:]
            free = ~used[1:]
            better = free & (cur < minv[1:])
            minv[1:][better] = cur[better]
            way[1:][better] = j0
            cand = np.where(free, minv[1:], np.inf)
            j1 = int(np.argmin(cand)) + 1
            delta = cand[j1 - 1]
            u[p[used]] += delta
            v[used] -= delta
            minv[~used] -= delta
            j0 = j1
            if p[j0] == 0:
                break
        while j0:
            j1 = way[j0]
            p[j0] = p[j1]
            j0 = j1
    rows = np.array([p[j] - 1 for j in range(1, m + 1) if p[j]], dtype=np.int64)
    cols = np.array([j - 1 for j in range(1, m + 1) if p[j]], dtype=np.int64)
    if transposed:
        rows, cols = cols, rows
    order = np.argsort(rows)
    return rows[order], cols[order]


def ensure_matcher(choice: str) -> str:
    """transformers' RT-DETR matcher needs scipy; without it (or with --matcher numpy), give its loss
    module the NumPy version above."""
    try:
        if choice == "numpy":
            raise ImportError
        import scipy.optimize  # noqa: F401
        return "scipy"
    except ImportError:
        import transformers.loss.loss_rt_detr as L
        L.linear_sum_assignment = linear_sum_assignment_np
        L.requires_backends = lambda *a, **k: None
        return "numpy (this script)"


# --------------------------------------------------------------------------- evaluation

@torch.no_grad()
def detect(model, pixels: torch.Tensor, sizes: list) -> list:
    """kiln's detection post-processing: sigmoid, top Q over Q x C, label = idx % C, corners x size."""
    out = model(pixel_values=pixels)
    logits, boxes = out.logits.float(), out.pred_boxes.float()
    n, q, c = logits.shape
    scores = torch.sigmoid(logits).reshape(n, q * c)
    top, idx = torch.topk(scores, q, dim=1)
    res = []
    for b in range(n):
        w, h = sizes[b]
        bx = boxes[b, idx[b] // c]
        cx, cy, bw, bh = bx.unbind(-1)
        x0, y0, x1, y1 = (cx - bw / 2) * w, (cy - bh / 2) * h, (cx + bw / 2) * w, (cy + bh / 2) * h
        keep = top[b] > 0.0
        res.append([dict(label=int(idx[b, k] % c), score=float(top[b, k]),
                         box=[float(x0[k]), float(y0[k]), float(x1[k]), float(y1[k])])
                    for k in range(q) if bool(keep[k])])
    return res


def coco_map_python(gt: dict, dets: list) -> list:
    """pycocotools' COCOeval (bbox, all areas, maxDets 100) stats[0] and stats[1], re-implemented.

    Per image and category: detections sorted by score (stable), the first 100 kept; for each IoU
    threshold 0.50:0.05:0.95 greedy matching in score order to the unmatched ground truth of best IoU
    (>= threshold; crowd boxes would be ignored, there are none); per category all images' detections
    merged by score (mergesort), precision made monotone from the right, sampled at 101 recall points
    (searchsorted left); categories without ground truth are left out of the mean.
    """
    iou_thrs = np.linspace(0.5, 0.95, 10)
    rec_thrs = np.linspace(0.0, 1.0, 101)
    cats = sorted(c["id"] for c in gt["categories"])
    img_ids = sorted(im["id"] for im in gt["images"])
    gts, dts = {}, {}
    for a in gt["annotations"]:
        gts.setdefault((a["image_id"], a["category_id"]), []).append(a["bbox"])
    for d in dets:
        dts.setdefault((d["image_id"], d["category_id"]), []).append(d)

    def iou(d, g):
        d, g = np.asarray(d, dtype=np.float64).reshape(-1, 4), np.asarray(g, dtype=np.float64).reshape(-1, 4)
        dx0, dy0, dx1, dy1 = d[:, 0:1], d[:, 1:2], d[:, 0:1] + d[:, 2:3], d[:, 1:2] + d[:, 3:4]
        gx0, gy0, gx1, gy1 = g[:, 0], g[:, 1], g[:, 0] + g[:, 2], g[:, 1] + g[:, 3]
        iw = np.clip(np.minimum(dx1, gx1) - np.maximum(dx0, gx0), 0, None)
        ih = np.clip(np.minimum(dy1, gy1) - np.maximum(dy0, gy0), 0, None)
        inter = iw * ih
        union = d[:, 2:3] * d[:, 3:4] + g[:, 2] * g[:, 3] - inter
        return inter / union

    ap = np.full((len(iou_thrs), len(cats)), -1.0)
    for ci, cat in enumerate(cats):
        scores, matched, n_gt = [], [], 0
        for im in img_ids:
            g = gts.get((im, cat), [])
            d = sorted(dts.get((im, cat), []), key=lambda x: -x["score"])[:100]
            n_gt += len(g)
            if not d:
                continue
            m = np.zeros((len(iou_thrs), len(d)), dtype=bool)
            if g:
                ious = iou([x["bbox"] for x in d], g)
                for ti, t in enumerate(iou_thrs):
                    used = np.zeros(len(g), dtype=bool)
                    for di in range(len(d)):
                        best, bj = min(t, 1 - 1e-10), -1
                        for gj in range(len(g)):
                            if used[gj] or ious[di, gj] < best:
                                continue
                            best, bj = ious[di, gj], gj
                        if bj >= 0:
                            used[bj] = True
                            m[ti, di] = True
            scores.extend(x["score"] for x in d)
            matched.append(m)
        if n_gt == 0:
            continue
        if not scores:
            ap[:, ci] = 0.0
            continue
        order = np.argsort(-np.asarray(scores), kind="mergesort")
        tp_all = np.concatenate(matched, axis=1)[:, order]
        for ti in range(len(iou_thrs)):
            tp = np.cumsum(tp_all[ti]).astype(np.float64)
            fp = np.cumsum(~tp_all[ti]).astype(np.float64)
            rc = tp / n_gt
            pr = tp / (fp + tp + np.spacing(1))
            for k in range(len(pr) - 1, 0, -1):
                pr[k - 1] = max(pr[k - 1], pr[k])
            idx = np.searchsorted(rc, rec_thrs, side="left")
            q = np.zeros(len(rec_thrs))
            valid = idx < len(pr)
            q[valid] = pr[idx[valid]]
            ap[ti, ci] = q.mean()
    valid = ap[:, (ap[0] > -1)]
    if valid.size == 0:
        return [-1.0, -1.0]
    return [float(valid.mean()), float(valid[0].mean())]


def coco_map(gt: dict, dets: list, tmp: Path):
    try:
        from pycocotools.coco import COCO
        from pycocotools.cocoeval import COCOeval
        from importlib.metadata import version
    except ImportError:
        return coco_map_python(gt, dets), "python re-implementation of pycocotools' bbox rules (this script)"
    gpath = tmp / "gt.json"
    gpath.write_text(json.dumps(gt))
    cg = COCO(str(gpath))
    if not dets:
        return [0.0, 0.0], f"pycocotools {version('pycocotools')}"
    cd = cg.loadRes(dets)
    e = COCOeval(cg, cd, "bbox")
    e.evaluate()
    e.accumulate()
    e.summarize()
    gpath.unlink()
    return [float(e.stats[0]), float(e.stats[1])], f"pycocotools {version('pycocotools')}"


# --------------------------------------------------------------------------- main

def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="models/rtdetr_demo")
    ap.add_argument("--seed", type=int, default=SEED)
    ap.add_argument("--minutes", type=float, default=6.0, help="training wall-clock budget")
    ap.add_argument("--size", type=int, default=320)
    ap.add_argument("--heldout", type=int, default=200)
    ap.add_argument("--train-images", type=int, default=4096, help="size of the in-memory train split")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--lr", type=float, default=4e-4)
    ap.add_argument("--num-queries", type=int, default=100)
    ap.add_argument("--jpeg-quality", type=int, default=75)
    ap.add_argument("--matcher", choices=["auto", "numpy"], default="auto",
                    help="Hungarian matching: scipy when it imports (auto), else or with 'numpy' this script's")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--eval-device", default="cpu", help="where the fp32 reference runs (default cpu)")
    args = ap.parse_args()
    t_start = time.time()

    from PIL import Image
    from transformers import RTDetrV2ForObjectDetection

    common.seed_everything(args.seed)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    import PIL
    import transformers
    vers = dict(torch=torch.__version__, transformers=transformers.__version__, numpy=np.__version__,
                pillow=PIL.__version__)
    dev = torch.device(args.device)
    print(f"torch {vers['torch']}  transformers {vers['transformers']}  device {dev}", flush=True)

    # ---------------------------------------------------------------- held-out split (written first)
    hgen = torch.Generator().manual_seed(args.seed + 1)
    himg_dir = out / "heldout" / "images"
    himg_dir.mkdir(parents=True, exist_ok=True)
    gt = dict(info=dict(description="kiln rtdetr_demo held-out split (synthetic shapes)",
                        generator="tools/reference/train_rtdetr_demo.py", seed=args.seed + 1),
              images=[], annotations=[],
              categories=[dict(id=i + 1, name=c, supercategory="shape") for i, c in enumerate(CLASSES)])
    ann_id = 1
    for start in range(0, args.heldout, 50):
        n = min(50, args.heldout - start)
        u8, tg = draw_batch(n, args.size, hgen, "cpu")
        for k in range(n):
            iid = start + k + 1
            name = f"{iid:06d}.jpg"
            Image.fromarray(u8[k].numpy()).save(himg_dir / name, quality=args.jpeg_quality)
            gt["images"].append(dict(id=iid, file_name=name, width=args.size, height=args.size))
            for c, b in zip(tg[k]["class_labels"].tolist(), tg[k]["boxes"].tolist()):
                w, h = b[2] * args.size, b[3] * args.size
                x, y = b[0] * args.size - w / 2, b[1] * args.size - h / 2
                gt["annotations"].append(dict(id=ann_id, image_id=iid, category_id=c + 1,
                                              bbox=[round(x, 3), round(y, 3), round(w, 3), round(h, 3)],
                                              area=round(w * h, 3), iscrowd=0))
                ann_id += 1
    (out / "heldout" / "annotations.json").write_text(json.dumps(gt, indent=1))
    samples = out / "samples"
    samples.mkdir(parents=True, exist_ok=True)
    sample_files = []
    for im in gt["images"][:4]:
        (samples / im["file_name"]).write_bytes((himg_dir / im["file_name"]).read_bytes())
        sample_files.append(f"samples/{im['file_name']}")
    print(f"held-out: {len(gt['images'])} images, {len(gt['annotations'])} boxes "
          f"({time.time() - t_start:.1f} s)", flush=True)

    # ---------------------------------------------------------------- train
    matcher = ensure_matcher(args.matcher)
    torch.manual_seed(args.seed)
    model = RTDetrV2ForObjectDetection(make_config(args.num_queries, backbone_bn_frozen=False)).to(dev).train()
    n_params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=1e-4)
    budget = args.minutes * 60.0
    warmup = 200
    use_amp = dev.type == "cuda"
    tgen = torch.Generator().manual_seed(args.seed)
    t_pool = time.time()
    chunks, pool_targets = [], []
    for start in range(0, args.train_images, 64):
        u8, tg = draw_batch(min(64, args.train_images - start), args.size, tgen, dev)
        chunks.append(u8)
        pool_targets.extend(tg)
    pool_u8 = torch.cat(chunks)
    del chunks
    print(f"train split: {len(pool_targets)} images in memory ({time.time() - t_pool:.1f} s)", flush=True)
    t0 = time.time()
    step, loss_ema = 0, None
    while time.time() - t0 < budget:
        pick = torch.randint(0, len(pool_targets), (args.batch_size,), generator=tgen)
        x = to_pixels(pool_u8[pick.to(dev)])
        targets = [pool_targets[int(i)] for i in pick]
        # random horizontal flip of half the batch (every class is mirror-symmetric)
        flip = torch.rand(args.batch_size, generator=tgen) < 0.5
        if bool(flip.any()):
            x[flip.to(dev)] = x[flip.to(dev)].flip(-1)
            targets = [dict(class_labels=t["class_labels"],
                            boxes=t["boxes"] * torch.tensor([-1.0, 1, 1, 1], device=dev)
                            + torch.tensor([1.0, 0, 0, 0], device=dev)) if f else t
                       for t, f in zip(targets, flip.tolist())]
        # learning rate: linear warm-up, then cosine over the time budget
        frac = min((time.time() - t0) / budget, 1.0)
        lr = args.lr * min(1.0, (step + 1) / warmup) * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * frac)))
        for g in opt.param_groups:
            g["lr"] = lr
        with torch.autocast(device_type=dev.type, dtype=torch.bfloat16, enabled=use_amp):
            outp = model(pixel_values=x, labels=targets)
        loss = outp.loss.float()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1)
        opt.step()
        step += 1
        lv = float(loss.detach())
        loss_ema = lv if loss_ema is None else 0.98 * loss_ema + 0.02 * lv
        if step % 50 == 0 or step == 1:
            print(f"step {step}  loss {lv:.3f}  ema {loss_ema:.3f}  lr {lr:.2e}  {time.time() - t0:.0f} s", flush=True)
    train_seconds = time.time() - t0
    print(f"trained {step} steps in {train_seconds:.1f} s", flush=True)

    # ---------------------------------------------------------------- save (F16, frozen-BN config)
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    shipped = RTDetrV2ForObjectDetection(make_config(args.num_queries, backbone_bn_frozen=True))
    sd = shipped.state_dict()
    dropped = [k for k in state if k not in sd]
    bad = [k for k in dropped if not k.endswith("num_batches_tracked")]
    if bad or [k for k in sd if k not in state]:
        raise RuntimeError(f"state_dict mismatch: extra {bad[:5]}, missing {[k for k in sd if k not in state][:5]}")
    shipped.load_state_dict({k: v for k, v in state.items() if k in sd}, strict=True)
    shipped = shipped.to(torch.float16).eval()
    shipped.save_pretrained(str(out))
    (out / "preprocessor_config.json").write_text(json.dumps(dict(
        image_processor_type="RTDetrImageProcessor", do_resize=True, size=dict(height=args.size, width=args.size),
        resample=2, do_rescale=True, rescale_factor=1 / 255, do_normalize=False, do_pad=False,
        do_convert_annotations=True, format="coco_detection"), indent=2) + "\n")

    # ---------------------------------------------------------------- PyTorch fp32 reference
    common.strict_fp32()
    edev = torch.device(args.eval_device)
    # The shipped model itself, its F16 weights widened to f32 (what kiln reads from the file). Not
    # from_pretrained: transformers 5.17 reloads this checkpoint with class_embed re-initialized (the
    # file keeps the tied heads as model.decoder.class_embed.N only, and with tie_word_embeddings
    # false the loader reports class_embed.N missing and ties the fresh ones back).
    ref = shipped.to(torch.float32).to(edev).eval()
    dets = []
    for start in range(0, len(gt["images"]), 16):
        ims = gt["images"][start:start + 16]
        pix, sizes = [], []
        for im in ims:
            pil = Image.open(himg_dir / im["file_name"]).convert("RGB")
            sizes.append(pil.size)
            pil = pil.resize((args.size, args.size), Image.BILINEAR)
            pix.append(torch.from_numpy(np.asarray(pil).copy()))
        res = detect(ref, to_pixels(torch.stack(pix)).to(edev), sizes)
        for im, r in zip(ims, res):
            for d in r:
                x0, y0, x1, y1 = d["box"]
                # rounded (0.01 px, 1e-6 in score) before the evaluation, to keep the file small
                dets.append(dict(image_id=im["id"], category_id=d["label"] + 1,
                                 bbox=[round(x0, 2), round(y0, 2), round(x1 - x0, 2), round(y1 - y0, 2)],
                                 score=round(d["score"], 6)))
    (out / "reference_detections.json").write_text(json.dumps(dets, separators=(",", ":")))
    (m, m50), evaluator = coco_map(gt, dets, out)
    size_mb = (out / "model.safetensors").stat().st_size / 1e6
    reference = dict(
        pytorch_map=m, pytorch_map50=m50, evaluator=evaluator, eval_device=str(edev), eval_dtype="float32",
        weights_dtype="float16 (widened to float32 for the reference)", num_heldout=len(gt["images"]),
        num_boxes=len(gt["annotations"]), score_threshold=0.0, input_size=[args.size, args.size],
        classes=CLASSES, seed=args.seed, heldout_seed=args.seed + 1, train_device=str(dev),
        train_amp="bfloat16 autocast" if use_amp else "none (fp32)", train_seconds=round(train_seconds, 1),
        train_steps=step, train_images=len(pool_targets), matcher=matcher, batch_size=args.batch_size, lr=args.lr, final_loss_ema=loss_ema,
        parameters=n_params, model_safetensors_mb=round(size_mb, 2), samples=sample_files,
        total_seconds=round(time.time() - t_start, 1), **vers)
    (out / "reference.json").write_text(json.dumps(reference, indent=2) + "\n")
    print(f"PyTorch fp32 mAP50-95 {m:.4f}  mAP50 {m50:.4f}  ({evaluator}); model.safetensors {size_mb:.2f} MB; "
          f"total {time.time() - t_start:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
