#!/usr/bin/env python3
"""Write small seeded timm EfficientNet checkpoints + reference logits for kiln's tests.

Same layout as tools/reference/make_fixtures.py (one directory per case):

    <out>/<case>/config.json        timm HF layout: architecture, num_classes, num_features,
                                    model_args, pretrained_cfg
    <out>/<case>/model.safetensors  model.state_dict(), float32 (+ int64 num_batches_tracked)
    <out>/<case>/input.npy          float32 [2, 3, H, W], seeded N(0, 1), already normalized
    <out>/<case>/logits.npy         float32 [2, num_classes], PyTorch fp32 on CPU, eval mode
    <out>/<case>/logits_fp64.npy    float64 [2, num_classes], the same model in float64
    <out>/manifest.json             the cases, their structure and features

Every parameter and BatchNorm statistic is randomized (tools/reference/common.py).

The cases are narrow: timm's entrypoints (efficientnet_b0(), ...) fix channel_multiplier and
depth_multiplier and reject them as kwargs, so each case calls the entrypoint's generator
(timm.models.efficientnet._gen_efficientnet, _gen_efficientnet_lite, _gen_efficientnetv2_s) with
the entrypoint's own arguments (tf_ variants: bn_eps=1e-3, pad_type='same'; rw=True for
efficientnetv2_rw_s) plus smaller multipliers. config.json "model_args" holds exactly those
generator kwargs, so `_gen_*(architecture, **model_args)` rebuilds the model (checked below);
kiln itself reads the structure from the tensors and only the architecture name from the config.

Usage (where torch + timm exist):
    python3 tools/reference/make_fixtures_efficientnet.py --out tests/fixtures/efficientnet
    python3 tools/reference/make_fixtures_efficientnet.py --full-size /tmp/fullsize_effnet
        # efficientnet_b0 and tf_efficientnet_b0, 224x224, batch 1 (--models to pick)
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

SEED = 20261201
TF_ARGS = dict(bn_eps=1e-3, pad_type="same")  # what timm's tf_* entrypoints set

CASES = [
    dict(name="b0_narrow", gen="_gen_efficientnet", architecture="efficientnet_b0",
         model_args=dict(channel_multiplier=0.1, depth_multiplier=0.5), num_classes=10, hw=64,
         note="B0 arch def at width 0.1 (stem 8 == stage-0 out 8: the DS block gets a skip), "
              "depth 0.5 (stages 3-5 keep 2 blocks: stride-1 skips), SiLU, SE, symmetric padding"),
    dict(name="tf_b0_65x62", gen="_gen_efficientnet", architecture="tf_efficientnet_b0",
         model_args=dict(channel_multiplier=0.1, depth_multiplier=0.5, **TF_ARGS), num_classes=7, hw=(65, 62),
         note="tf_ B0, BN eps 1e-3, TF 'same' padding at 65x62: an odd size pads a stride-2 conv symmetrically "
              "(H: 65 -> 33 -> 17 -> 9 -> 5 -> 3), an even one asymmetrically, extra pixel bottom/right "
              "(W: 62 -> 31 -> 16 -> 8 -> 4 -> 2)"),
    dict(name="lite0_narrow", gen="_gen_efficientnet_lite", architecture="efficientnet_lite0",
         model_args=dict(channel_multiplier=0.1, depth_multiplier=0.5), num_classes=4, hw=64,
         note="Lite: ReLU6, no SE, fixed stem (32) and head (1280; 4 classes keep the file small)"),
    dict(name="tf_lite0_odd", gen="_gen_efficientnet_lite", architecture="tf_efficientnet_lite0",
         model_args=dict(channel_multiplier=0.1, depth_multiplier=0.5, **TF_ARGS), num_classes=4, hw=59,
         note="tf_ Lite: ReLU6, TF 'same' padding at 59x59, BN eps 1e-3"),
    dict(name="v2_rw_s_narrow", gen="_gen_efficientnetv2_s", architecture="efficientnetv2_rw_s",
         model_args=dict(rw=True, channel_multiplier=0.1, depth_multiplier=0.2), num_classes=10, hw=64,
         note="EfficientNetV2 (rw): edge-residual (conv_exp) stages incl. an e1 stage with skip, IR+SE later"),
    dict(name="tf_v2_s_odd", gen="_gen_efficientnetv2_s", architecture="tf_efficientnetv2_s",
         model_args=dict(channel_multiplier=0.1, depth_multiplier=0.2, **TF_ARGS), num_classes=10, hw=61,
         note="tf_ EfficientNetV2-S: ConvBnAct stage 0 with skip, edge residual, TF 'same' padding, eps 1e-3"),
]

FULL_SIZE = ["efficientnet_b0", "tf_efficientnet_b0"]


def gen_model(case: dict):
    from timm.models import efficientnet as eff

    fn = getattr(eff, case["gen"])
    return fn(case["architecture"], pretrained=False, num_classes=case["num_classes"], **case["model_args"])


def block_kind(blk) -> str:
    return type(blk).__name__


def describe(model, x) -> dict:
    """Structure read off the model itself, for the manifest."""
    shapes = {}
    hooks = [s.register_forward_hook(lambda m, i, o, k=k: shapes.__setitem__(k, list(o.shape[1:])))
             for k, s in enumerate(model.blocks)]
    with torch.no_grad():
        model(x)
    for h in hooks:
        h.remove()
    stages = []
    for k, stage in enumerate(model.blocks):
        b0 = stage[0]
        conv = getattr(b0, "conv_dw", None) or getattr(b0, "conv_exp", None) or getattr(b0, "conv")
        stages.append(dict(stage=k, blocks=len(stage), kind=block_kind(b0), stride=conv.stride[0],
                           kernel=conv.kernel_size[0], se=not isinstance(getattr(b0, "se", None), torch.nn.Identity)
                           and getattr(b0, "se", None) is not None,
                           skips=[bool(b.has_skip) for b in stage], out_chw=shapes[k]))
    return dict(stem_channels=model.conv_stem.out_channels, act=type(model.bn1.act).__name__,
                bn_eps=model.bn1.eps, stages=stages)


def run_model(model, x):
    with torch.no_grad():
        return model(x)


def make_case(out: Path, case: dict, seed: int) -> dict:
    name, n = case["name"], case["num_classes"]
    h, w = case["hw"] if isinstance(case["hw"], tuple) else (case["hw"], case["hw"])
    model = gen_model(case)
    counts = common.randomize_(model, seed)
    model.eval()
    gen = torch.Generator().manual_seed(seed + 1)
    x = torch.randn((2, 3, h, w), generator=gen, dtype=torch.float32)
    logits = run_model(model, x)
    logits64 = run_model(model.double(), x.double())
    model.float()

    pcfg = common.pretrained_cfg(
        [3, h, w], n, interpolation="bicubic", crop_pct=0.875, crop_mode="center",
        first_conv="conv_stem", classifier="classifier", pool_size=[-(-h // 32), -(-w // 32)], tag="kiln_fixture")
    cfg = common.hf_config(case["architecture"], n, model.num_features, pcfg, model_args=case["model_args"])
    d = out / name
    tensors = common.write_hf_dir(d, model, cfg)
    common.save_npy(d / "input.npy", x.numpy().astype(np.float32))
    common.save_npy(d / "logits.npy", logits.numpy().astype(np.float32))
    common.save_npy(d / "logits_fp64.npy", logits64.numpy().astype(np.float64))

    # Reload from what was written, through the same generator, and compare.
    model2 = gen_model(dict(case, model_args=cfg["model_args"]))
    common.load_safetensors_into(model2, d / "model.safetensors")
    model2.eval()
    reload_diff = float((run_model(model2, x) - logits).abs().max())
    assert reload_diff == 0.0, f"{name}: reload changed logits by {reload_diff}"

    top2 = torch.topk(logits64, 2, dim=1).values
    return dict(
        name=name, architecture=case["architecture"], generator=case["gen"], note=case["note"],
        model_args=case["model_args"], num_classes=n, num_features=model.num_features,
        input_shape=list(x.shape), logits_shape=list(logits.shape),
        num_tensors=len(tensors),
        num_params=int(sum(v.numel() for v in tensors.values() if v.is_floating_point())),
        randomized=counts, top1=[int(i) for i in logits.argmax(1)],
        min_top1_margin=float((top2[:, 0] - top2[:, 1]).min()),
        logits_abs_max=float(logits.abs().max()),
        fp32_vs_fp64_max_abs=float((logits.double() - logits64).abs().max()),
        structure=describe(model, x), seed=seed)


def make_full_size(out: Path, seed: int, names) -> list:
    import timm

    infos = []
    for i, name in enumerate(names):
        model = timm.create_model(name, pretrained=False)
        counts = common.randomize_(model, seed + 100 * i)
        model.eval()
        dc = model.pretrained_cfg
        gen = torch.Generator().manual_seed(seed + 100 * i + 1)
        x = torch.randn((1, 3, 224, 224), generator=gen, dtype=torch.float32)
        logits = run_model(model, x)
        pcfg = common.pretrained_cfg(
            [3, 224, 224], model.num_classes, interpolation=dc.get("interpolation", "bicubic"),
            crop_pct=dc.get("crop_pct", 0.875), crop_mode=dc.get("crop_mode", "center"),
            mean=dc.get("mean", common.IMAGENET_DEFAULT_MEAN), std=dc.get("std", common.IMAGENET_DEFAULT_STD),
            first_conv="conv_stem", classifier="classifier", pool_size=[7, 7], tag="kiln_fullsize")
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
                          min_top1_margin=float((top2[:, 0] - top2[:, 1]).min()), seed=seed + 100 * i))
        print(f"[full-size] {name}: top1={infos[-1]['top1']} margin={infos[-1]['min_top1_margin']:.4f}")
    return infos


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="tests/fixtures/efficientnet", help="fixture root (default: %(default)s)")
    ap.add_argument("--seed", type=int, default=SEED)
    ap.add_argument("--cases", nargs="*", help="only these case names")
    ap.add_argument("--full-size", metavar="OUTDIR", help="instead write full-size seeded models (224x224)")
    ap.add_argument("--models", nargs="*", default=FULL_SIZE, help="with --full-size: which (default: %(default)s)")
    args = ap.parse_args()

    common.strict_fp32()
    torch.set_num_threads(max(1, min(8, os.cpu_count() or 1)))
    vers = common.versions()
    print(f"torch {vers['torch']}  timm {vers['timm']}  numpy {vers['numpy']}")

    if args.full_size:
        out = Path(args.full_size)
        out.mkdir(parents=True, exist_ok=True)
        infos = make_full_size(out, args.seed, args.models)
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
        print(f"{case['name']:>16}: {case['architecture']:<22} params={info['num_params']:>7} bytes={size:>7} "
              f"top1={info['top1']} margin={info['min_top1_margin']:.4f} |logits|max={info['logits_abs_max']:.3f} "
              f"fp32-fp64={info['fp32_vs_fp64_max_abs']:.2e}")

    manifest = dict(
        description="Seeded timm EfficientNet fixtures for kiln (tools/reference/make_fixtures_efficientnet.py). "
                    "input.npy is already normalized; logits.npy is PyTorch fp32 on CPU in eval mode, "
                    "logits_fp64.npy the same in float64.",
        versions=vers, seed=args.seed,
        files=["config.json", "model.safetensors", "input.npy", "logits.npy", "logits_fp64.npy"],
        cases=infos)
    with open(out / "manifest.json", "w") as f:
        json.dump(manifest, f, indent=2)
        f.write("\n")
    print(f"wrote {len(infos)} cases to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
