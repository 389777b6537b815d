#!/usr/bin/env python3
"""Write small seeded timm Res2Net checkpoints + reference logits for kiln's tests.

Same layout as tools/reference/make_fixtures.py (read its docstring): each case is
<out>/<case>/{config.json, model.safetensors, input.npy, logits.npy, logits_fp64.npy}, plus
<out>/manifest.json. Every parameter and BatchNorm statistic is randomized (common.randomize_).

timm builds Res2Net as its ResNet class with block=Bottle2neck; the entrypoints
(res2net50_26w_4s, res2net50d, res2next50, ...) take the same kwargs as ResNet, and
`block_args=dict(scale=S)` sets the number of chunks. Cases override `layers`, `channels`
and `base_width` to stay narrow (the whole set < 2 MB), so the config.json stays loadable
by timm.create_model(architecture, **model_args).

The cases cover: scale 4, 6, 8 and 2; base widths 26, 48, 14; layer1.0 both without a
downsample (a chained, non-first block at stride 1) and with one (a "first" block whose last
chunk goes through AvgPool2d(3, 1, 1)); the deep stem + avg-down shortcut (res2net50d);
the grouped 3x3 (res2next50); odd feature maps (56x56 input: 7x7 into layer3) so the stride-2 pass-through
pool with padding and count_include_pad=True sees partial windows.

Usage (where torch + timm exist):
    python3 tools/reference/make_fixtures_res2net.py --out tests/fixtures/res2net
    python3 tools/reference/make_fixtures_res2net.py --full-size /tmp/r2n_full   # 224x224, batch 1
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import common  # noqa: E402

SEED = 20240917

CASES = [
    dict(
        name="s4_26w",
        architecture="res2net50_26w_4s",
        model_args=dict(layers=[1, 2, 1, 1], channels=[16, 16, 24, 24], base_width=26,
                        block_args=dict(scale=4)),
        num_classes=10, hw=48,
        note="scale 4, base width 26 (widths 6, 6, 9, 9); layer1.0 has no downsample "
             "(64 == 16*4) so it is a chained block, not a 'first' one",
    ),
    dict(
        name="s6_26w_odd",
        architecture="res2net50_26w_6s",
        model_args=dict(layers=[2, 1, 1, 1], channels=[12, 16, 16, 20], base_width=26,
                        block_args=dict(scale=6)),
        num_classes=7, hw=56,
        note="scale 6 (5 convs); layer1.0 has a stride-1 downsample, so its last chunk goes "
             "through AvgPool2d(3, 1, 1); 56x56 gives an odd 7x7 map for the stride-2 pool of layer3",
    ),
    dict(
        name="s8_14w",
        architecture="res2net50_14w_8s",
        model_args=dict(layers=[1, 1, 1, 1], channels=[16, 16, 20, 24], base_width=14,
                        block_args=dict(scale=8)),
        num_classes=10, hw=48,
        note="scale 8 (7 convs, concat of 8), base width 14 (widths 3, 3, 4, 5)",
    ),
    dict(
        name="s2_48w",
        architecture="res2net50_48w_2s",
        model_args=dict(layers=[2, 1, 1, 1], channels=[8, 12, 16, 24], base_width=48,
                        block_args=dict(scale=2)),
        num_classes=10, hw=48,
        drop_num_batches_tracked=True,
        note="scale 2 (one conv + pass-through chunk), base width 48 (widths 6, 9, 12, 18); "
             "no num_batches_tracked tensors",
    ),
    dict(
        name="res2net_d",
        architecture="res2net50d",
        model_args=dict(layers=[1, 2, 1, 1], channels=[8, 16, 24, 32], base_width=26,
                        stem_type="deep", stem_width=8, avg_down=True, block_args=dict(scale=4)),
        num_classes=10, hw=48,
        first_conv="conv1.0",
        note="deep stem (8, 8, 16) + avg-pool shortcuts (layer1: Identity pool, stride 1), scale 4",
    ),
    dict(
        name="res2next",
        architecture="res2next50",
        model_args=dict(layers=[1, 1, 1, 1], channels=[16, 16, 20, 24], base_width=8, cardinality=4,
                        block_args=dict(scale=4)),
        num_classes=10, hw=56,
        note="Res2NeXt: grouped 3x3 convs (4 groups; widths 8, 8, 8, 12 = 2..3 channels per group), "
             "scale 4, 56x56 input (odd 7x7 map into layer3)",
    ),
]

FULL_SIZE = ["res2net50_26w_4s", "res2net50d", "res2next50"]


def run_model(model, x):
    with torch.no_grad():
        return model(x)


def describe(model) -> dict:
    """Structure read off the model itself, for the manifest."""
    import torch.nn as nn

    stem = "7x7" if isinstance(model.conv1, nn.Conv2d) else "deep"
    stages = []
    for i in range(1, 5):
        layer = getattr(model, f"layer{i}")
        b0 = layer[0]
        stages.append(dict(
            stage=f"layer{i}", blocks=len(layer), scale=b0.scale, width=b0.width,
            groups=b0.convs[0].groups, first_block_is_first=bool(b0.is_first),
            downsample="none" if b0.downsample is None else type(b0.downsample[0]).__name__))
    return dict(stem=stem, stages=stages)


def make_case(out: Path, case: dict, seed: int) -> dict:
    import timm

    name, arch, n, hw = case["name"], case["architecture"], case["num_classes"], case["hw"]
    model_args = dict(case["model_args"])
    model = timm.create_model(arch, pretrained=False, num_classes=n, **model_args)
    counts = common.randomize_(model, seed)
    model.eval()

    gen = torch.Generator().manual_seed(seed + 1)
    x = torch.randn((2, 3, hw, hw), generator=gen, dtype=torch.float32)
    logits = run_model(model, x)
    logits64 = run_model(model.double(), x.double())
    model.float()

    pcfg = common.pretrained_cfg(
        [3, hw, hw], n, interpolation="bilinear", crop_pct=0.875, crop_mode="center",
        first_conv=case.get("first_conv", "conv1"), classifier="fc",
        pool_size=[-(-hw // 32)] * 2, tag="kiln_fixture")
    cfg = common.hf_config(arch, n, model.num_features, pcfg, model_args=model_args)
    d = out / name
    tensors = common.write_hf_dir(d, model, cfg, case.get("drop_num_batches_tracked", False))
    common.save_npy(d / "input.npy", x.numpy().astype(np.float32))
    common.save_npy(d / "logits.npy", logits.numpy().astype(np.float32))
    common.save_npy(d / "logits_fp64.npy", logits64.numpy().astype(np.float64))

    # Reload what was written through timm: the files alone must reproduce the logits.
    model2 = timm.create_model(arch, pretrained=False, num_classes=n, **cfg["model_args"])
    common.load_safetensors_into(model2, d / "model.safetensors")
    model2.eval()
    reload_diff = float((run_model(model2, x) - logits).abs().max())
    assert reload_diff == 0.0, f"{name}: reload changed logits by {reload_diff}"

    top2 = torch.topk(logits64, 2, dim=1).values
    return dict(
        name=name, architecture=arch, note=case.get("note", ""), model_args=model_args,
        num_classes=n, num_features=model.num_features,
        input_shape=list(x.shape), logits_shape=list(logits.shape),
        has_num_batches_tracked=any(k.endswith("num_batches_tracked") for k in tensors),
        num_tensors=len(tensors),
        num_params=int(sum(v.numel() for v in tensors.values() if v.is_floating_point())),
        randomized=counts,
        top1=[int(i) for i in logits.argmax(1)],
        min_top1_margin=float((top2[:, 0] - top2[:, 1]).min()),
        logits_abs_max=float(logits.abs().max()),
        fp32_vs_fp64_max_abs=float((logits.double() - logits64).abs().max()),
        structure=describe(model),
        seed=seed,
    )


def make_full_size(out: Path, seed: int) -> list:
    import timm

    infos = []
    for i, name in enumerate(FULL_SIZE):
        model = timm.create_model(name, pretrained=False)
        counts = common.randomize_(model, seed + 100 * i)
        model.eval()
        dc = model.pretrained_cfg
        gen = torch.Generator().manual_seed(seed + 100 * i + 1)
        x = torch.randn((1, 3, 224, 224), generator=gen, dtype=torch.float32)
        logits = run_model(model, x)
        pcfg = common.pretrained_cfg(
            [3, 224, 224], model.num_classes, interpolation=dc.get("interpolation", "bilinear"),
            crop_pct=dc.get("crop_pct", 0.875), crop_mode=dc.get("crop_mode", "center"),
            mean=dc.get("mean", common.IMAGENET_DEFAULT_MEAN), std=dc.get("std", common.IMAGENET_DEFAULT_STD),
            first_conv=dc.get("first_conv", "conv1"), classifier=dc.get("classifier", "fc"),
            pool_size=dc.get("pool_size"), tag="kiln_fullsize")
        cfg = common.hf_config(name, model.num_classes, model.num_features, pcfg)
        d = out / name
        tensors = common.write_hf_dir(d, model, cfg)
        common.save_npy(d / "input.npy", x.numpy())
        common.save_npy(d / "logits.npy", logits.numpy())
        top2 = torch.topk(logits, 2, dim=1).values
        infos.append(dict(name=name, architecture=name, num_classes=model.num_classes,
                          num_features=model.num_features, input_shape=list(x.shape),
                          num_tensors=len(tensors), randomized=counts,
                          top1=[int(j) for j in logits.argmax(1)],
                          logits_abs_max=float(logits.abs().max()),
                          min_top1_margin=float((top2[:, 0] - top2[:, 1]).min()),
                          seed=seed + 100 * i))
        print(f"[full-size] {name}: top1={infos[-1]['top1']} |logits|max={infos[-1]['logits_abs_max']:.3f}")
    return infos


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="tests/fixtures/res2net", help="fixture root (default: %(default)s)")
    ap.add_argument("--seed", type=int, default=SEED)
    ap.add_argument("--cases", nargs="*", help="only these case names")
    ap.add_argument("--full-size", metavar="OUTDIR",
                    help="instead write full-size seeded " + "/".join(FULL_SIZE) + " (224x224, batch 1)")
    args = ap.parse_args()

    common.strict_fp32()
    torch.set_num_threads(max(1, min(8, os.cpu_count() or 1)))
    vers = common.versions()
    print(f"torch {vers['torch']}  timm {vers['timm']}  numpy {vers['numpy']}")

    if args.full_size:
        out = Path(args.full_size)
        out.mkdir(parents=True, exist_ok=True)
        infos = make_full_size(out, args.seed)
        with open(out / "manifest.json", "w") as f:
            json.dump(dict(versions=vers, seed=args.seed, cases=infos), f, indent=2)
            f.write("\n")
        return 0

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cases = [c for c in CASES if not args.cases or c["name"] in args.cases]
    infos = []
    for i, case in enumerate(cases):
        info = make_case(out, case, args.seed + 1000 * i)
        infos.append(info)
        size = sum(p.stat().st_size for p in (out / case["name"]).iterdir())
        print(f"{case['name']:>12}: {case['architecture']:<18} params={info['num_params']:>7} "
              f"bytes={size:>7} top1={info['top1']} margin={info['min_top1_margin']:.4f} "
              f"|logits|max={info['logits_abs_max']:.3f} fp32-fp64={info['fp32_vs_fp64_max_abs']:.2e}")

    manifest = dict(
        description="Seeded timm Res2Net fixtures for kiln (tools/reference/make_fixtures_res2net.py). "
                    "input.npy is already normalized (fed to the network as is); logits.npy is "
                    "PyTorch fp32 on CPU in eval mode, logits_fp64.npy the same in float64.",
        versions=vers, seed=args.seed,
        files=["config.json", "model.safetensors", "input.npy", "logits.npy", "logits_fp64.npy"],
        cases=infos,
    )
    with open(out / "manifest.json", "w") as f:
        json.dump(manifest, f, indent=2)
        f.write("\n")
    print(f"wrote {len(infos)} cases to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
