#!/usr/bin/env python3
"""Train kiln's bundled demo model: a tiny timm ResNet on scikit-learn's digits.

Data: sklearn.datasets.load_digits (1797 8x8 gray images, values 0..16). Each image becomes an
8-bit RGB 32x32 image: value * 255 / 16 rounded, PIL BILINEAR resize 8 -> 32, gray -> RGB.
Stratified split with a fixed seed: 80 % train, 20 % held out.

Writes (default --out models/digits_resnet):
    config.json          timm HF layout (architecture resnet18 + model_args, label_names,
                         pretrained_cfg: input 3x32x32, crop_pct 1.0, bilinear, mean/std 0.5)
    model.safetensors    fp32 state_dict
    heldout/<class>/<index>.png   the held-out images (ImageFolder layout; index = dataset index)
    samples/<name>.png   a few held-out images for demos
    reference.json       PyTorch fp32 top-1 on the held-out PNGs read back from disk through
                         timm's own eval transform, versions, seed
    reference_predictions.json    per held-out PNG: label, PyTorch top-1 and its logits

With crop_pct 1.0 and input 32x32, timm's eval transform is Resize(32) (a no-op on a 32x32
image) -> CenterCrop(32) -> ToTensor -> Normalize; training uses the same uint8 pixels and the
same normalization.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import common  # noqa: E402

SEED = 1234
ARCH = "resnet18"
MODEL_ARGS = dict(layers=[1, 1, 1, 1], channels=[16, 32, 64, 128])
NUM_CLASSES = 10
SIZE = 32
MEAN = [0.5, 0.5, 0.5]
STD = [0.5, 0.5, 0.5]
INTERPOLATION = "bilinear"
CROP_PCT = 1.0
SAMPLE_CLASSES = [0, 2, 3, 7, 9]


def make_images():
    """All 1797 digits as uint8 RGB [N, 32, 32, 3] and their labels."""
    from PIL import Image
    from sklearn.datasets import load_digits

    d = load_digits()
    imgs8 = np.clip(np.rint(d.images * (255.0 / 16.0)), 0, 255).astype(np.uint8)
    out = np.empty((len(imgs8), SIZE, SIZE, 3), dtype=np.uint8)
    for i, im in enumerate(imgs8):
        pil = Image.fromarray(im).resize((SIZE, SIZE), Image.BILINEAR).convert("RGB")
        out[i] = np.asarray(pil)
    return out, d.target.astype(np.int64)


def to_tensor(u8: np.ndarray, device) -> torch.Tensor:
    """uint8 [N,H,W,3] -> normalized float32 [N,3,H,W] exactly like ToTensor + Normalize."""
    x = torch.from_numpy(u8).to(device).permute(0, 3, 1, 2).float().div_(255.0)
    mean = torch.tensor(MEAN, device=device).view(1, 3, 1, 1)
    std = torch.tensor(STD, device=device).view(1, 3, 1, 1)
    return (x - mean) / std


def random_shift(x: torch.Tensor, max_shift: int, gen: torch.Generator) -> torch.Tensor:
    """Per-sample integer translation by up to +-max_shift px, filling with the background value."""
    n, c, h, w = x.shape
    bg = (0.0 - MEAN[0]) / STD[0]  # background (0 in uint8) after normalization
    p = F.pad(x, (max_shift,) * 4, value=bg)
    oy = torch.randint(0, 2 * max_shift + 1, (n,), generator=gen).to(x.device)
    ox = torch.randint(0, 2 * max_shift + 1, (n,), generator=gen).to(x.device)
    rows = (oy[:, None] + torch.arange(h, device=x.device)[None, :])  # [n, h]
    cols = (ox[:, None] + torch.arange(w, device=x.device)[None, :])  # [n, w]
    idx_n = torch.arange(n, device=x.device)[:, None, None]
    out = p.permute(0, 2, 3, 1)[idx_n, rows[:, :, None], cols[:, None, :]]  # [n, h, w, c]
    return out.permute(0, 3, 1, 2).contiguous()


def build_model():
    import timm

    return timm.create_model(ARCH, pretrained=False, num_classes=NUM_CLASSES, **MODEL_ARGS)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="models/digits_resnet")
    ap.add_argument("--seed", type=int, default=SEED)
    ap.add_argument("--epochs", type=int, default=30)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()

    import timm
    from PIL import Image
    from sklearn.model_selection import train_test_split

    common.seed_everything(args.seed)
    common.strict_fp32()
    try:
        torch.use_deterministic_algorithms(True, warn_only=True)
    except Exception:
        pass
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    vers = common.versions()
    print(f"torch {vers['torch']}  timm {vers['timm']}  device {args.device}")

    # ---------------------------------------------------------------- data
    images, labels = make_images()
    idx = np.arange(len(labels))
    tr_idx, te_idx = train_test_split(idx, test_size=0.2, stratify=labels, random_state=args.seed)
    tr_idx = np.sort(tr_idx)
    te_idx = np.sort(te_idx)
    print(f"train {len(tr_idx)}  held-out {len(te_idx)}")

    held = out / "heldout"
    for i in te_idx:
        p = held / str(labels[i]) / f"{i:04d}.png"
        p.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(images[i]).save(p, optimize=True)
    samples = out / "samples"
    samples.mkdir(parents=True, exist_ok=True)
    sample_list = []
    for c in SAMPLE_CLASSES:
        i = int(next(j for j in te_idx if labels[j] == c))
        name = f"digit{c}_{i:04d}.png"
        Image.fromarray(images[i]).save(samples / name, optimize=True)
        sample_list.append(dict(file=f"samples/{name}", label=int(c), index=i))

    # ---------------------------------------------------------------- train
    dev = torch.device(args.device)
    xtr = to_tensor(images[tr_idx], dev)
    ytr = torch.from_numpy(labels[tr_idx]).to(dev)
    xte = to_tensor(images[te_idx], dev)
    yte = torch.from_numpy(labels[te_idx]).to(dev)

    model = build_model().to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr, weight_decay=1e-4)
    steps_per_epoch = (len(tr_idx) + args.batch_size - 1) // args.batch_size
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=args.lr, total_steps=args.epochs * steps_per_epoch)
    gen = torch.Generator().manual_seed(args.seed + 7)
    t0 = time.time()
    for epoch in range(args.epochs):
        model.train()
        perm = torch.randperm(len(tr_idx), generator=gen).to(dev)
        tot = 0.0
        for s in range(steps_per_epoch):
            b = perm[s * args.batch_size:(s + 1) * args.batch_size]
            xb = random_shift(xtr[b], 2, gen)
            loss = F.cross_entropy(model(xb), ytr[b], label_smoothing=0.05)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            tot += float(loss) * len(b)
        if epoch % 5 == 4 or epoch == args.epochs - 1:
            model.eval()
            with torch.no_grad():
                acc = float((model(xte).argmax(1) == yte).float().mean())
            print(f"epoch {epoch + 1:3d}  loss {tot / len(tr_idx):.4f}  held-out acc (in memory) {acc:.4f}")
    train_s = time.time() - t0

    # ---------------------------------------------------------------- save
    model = model.cpu().eval()
    pcfg = common.pretrained_cfg(
        [3, SIZE, SIZE], NUM_CLASSES, interpolation=INTERPOLATION, crop_pct=CROP_PCT, crop_mode="center",
        mean=MEAN, std=STD, first_conv="conv1", classifier="fc", pool_size=[1, 1], tag="kiln_digits")
    cfg = common.hf_config(ARCH, NUM_CLASSES, model.num_features, pcfg, model_args=MODEL_ARGS,
                           label_names=[str(i) for i in range(NUM_CLASSES)])
    common.write_hf_dir(out, model, cfg)

    # ---------------------------------------------------------------- evaluate from disk
    # A fresh model from the written files, the PNGs read back, timm's own eval transform.
    from torchvision.datasets import ImageFolder

    with open(out / "config.json") as f:
        rcfg = json.load(f)
    model2 = timm.create_model(rcfg["architecture"], pretrained=False, num_classes=rcfg["num_classes"],
                               **rcfg["model_args"])
    common.load_safetensors_into(model2, out / "model.safetensors")
    model2.eval()
    pc = rcfg["pretrained_cfg"]
    tf = timm.data.create_transform(
        input_size=tuple(pc["input_size"]), is_training=False, interpolation=pc["interpolation"],
        mean=tuple(pc["mean"]), std=tuple(pc["std"]), crop_pct=pc["crop_pct"], crop_mode=pc["crop_mode"])
    print(f"eval transform: {tf}")
    ds = ImageFolder(str(held), transform=tf)
    assert ds.classes == [str(i) for i in range(NUM_CLASSES)], ds.classes
    xs = torch.stack([ds[i][0] for i in range(len(ds))])
    ys = torch.tensor([t for _, t in ds.samples])
    # the transform must reproduce the training pixels exactly (identity resize)
    order = [int(Path(p).stem) for p, _ in ds.samples]
    tf_vs_train = float((xs - to_tensor(images[order], "cpu")).abs().max())
    with torch.no_grad():
        logits = model2(xs)
    pred = logits.argmax(1)
    correct = int((pred == ys).sum())
    acc = correct / len(ys)
    print(f"PyTorch fp32 top-1 on {len(ys)} held-out PNGs (timm eval transform): {acc:.4f} "
          f"({correct}/{len(ys)}); transform vs training pixels max |diff| {tf_vs_train:.3g}")

    # does timm itself resolve the same transform from the written config? (informational)
    resolved = None
    try:
        m3 = timm.create_model(f"local-dir:{out}", pretrained=True)
        resolved = {k: (list(v) if isinstance(v, tuple) else v)
                    for k, v in timm.data.resolve_model_data_config(m3).items()}
    except Exception as e:
        resolved = f"{type(e).__name__}: {str(e)[:200]}"
    print(f"timm local-dir data config: {resolved}")

    top2 = torch.topk(logits, 2, dim=1).values
    ref = dict(
        pytorch_top1=acc, num_heldout=len(ys), num_correct=correct,
        torch=vers["torch"], timm=vers["timm"], seed=args.seed,
        num_train=int(len(tr_idx)), epochs=args.epochs, train_seconds=round(train_s, 2),
        train_device=str(dev), eval_device="cpu", eval_dtype="float32",
        transform_vs_training_pixels_max_abs=tf_vs_train,
        min_top1_margin=float((top2[:, 0] - top2[:, 1]).min()),
        timm_resolved_data_config=resolved,
        samples=sample_list,
    )
    with open(out / "reference.json", "w") as f:
        json.dump(ref, f, indent=2)
        f.write("\n")
    preds = [dict(file=str(Path(p).relative_to(out)), label=int(t), top1=int(pred[k]),
                  logits=[round(float(v), 6) for v in logits[k]])
             for k, (p, t) in enumerate(ds.samples)]
    with open(out / "reference_predictions.json", "w") as f:
        json.dump(preds, f, indent=1)
        f.write("\n")
    if acc < 0.95:
        print(f"WARNING: held-out accuracy {acc:.4f} < 0.95")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
