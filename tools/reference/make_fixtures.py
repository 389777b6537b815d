#!/usr/bin/env python3
"""Write small seeded timm ResNet checkpoints + reference logits for kiln's tests.

Each case is a directory laid out like a timm checkpoint on the Hugging Face Hub:

    <out>/<case>/config.json        timm HF layout: architecture, num_classes, num_features,
                                    model_args (the create_model kwargs), pretrained_cfg
    <out>/<case>/model.safetensors  model.state_dict(), float32 (+ int64 num_batches_tracked,
                                    as timm's save_for_hf keeps them; one case drops them)
    <out>/<case>/input.npy          float32 [2, 3, H, W], seeded N(0, 1), already normalized
    <out>/<case>/logits.npy         float32 [2, num_classes], PyTorch fp32 on CPU, eval mode
    <out>/<case>/logits_fp64.npy    float64 [2, num_classes], the same model in float64
                                    (shows how far fp32 itself is from exact)
    <out>/manifest.json             the cases, their structural kind and features

Every parameter and BatchNorm running statistic is randomized (tools/reference/common.py), so
a wrongly wired block cannot hide behind timm's zero-initialized last BN.

Each case is built with timm.create_model(architecture, **model_args), so the config.json is
also loadable by timm itself (model_args are passed to the architecture's entrypoint).

Usage (where torch + timm exist):
    python3 tools/reference/make_fixtures.py --out tests/fixtures/resnet
    python3 tools/reference/make_fixtures.py --full-size /tmp/fullsize   # resnet50, resnet50d,
                                                                          # resnext50_32x4d, 224x224
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import common  # noqa: E402

SEED = 20240611

# name, structural kind, closest timm architecture, create_model kwargs, input H=W, extras
CASES = [
    dict(
        name="basic",
        kind="basic",
        architecture="resnet18",
        model_args=dict(layers=[1, 1, 1, 1], channels=[8, 16, 24, 32]),
        num_classes=10, hw=64,
        note="BasicBlock, 7x7 stem (64 ch); layer1 has a stride-1 1x1 conv downsample (64->8)",
    ),
    dict(
        name="basic_c7_nonbt",
        kind="basic",
        architecture="resnet34",
        model_args=dict(layers=[2, 1, 1, 1], channels=[8, 16, 24, 32]),
        num_classes=7, hw=64,
        drop_num_batches_tracked=True,
        note="BasicBlock, 2 blocks in layer1 (identity shortcut), 7 classes, "
             "no num_batches_tracked tensors (like older converted checkpoints)",
    ),
    dict(
        name="basic_tiered_stem",
        kind="basic",
        architecture="resnet10t",
        model_args=dict(layers=[1, 1, 1, 1], channels=[24, 24, 32, 32], stem_type="deep_tiered",
                        stem_width=12, avg_down=True),
        num_classes=10, hw=72,
        note="BasicBlock, non-default deep tiered stem (9,12,24), avg-pool shortcuts, layer1 without "
             "downsample; 72x72 input gives odd maps (9, 5, 3) so ceil_mode avg-pool overhang is exercised",
    ),
    dict(
        name="bottleneck",
        kind="bottleneck",
        architecture="resnet50",
        model_args=dict(layers=[1, 2, 1, 1], channels=[8, 16, 24, 32]),
        num_classes=10, hw=64,
        note="Bottleneck (expansion 4), 7x7 stem, conv downsample in every stage",
    ),
    dict(
        name="resnet_d",
        kind="resnet_d",
        architecture="resnet50d",
        model_args=dict(layers=[1, 2, 1, 1], channels=[8, 16, 24, 32], stem_type="deep",
                        stem_width=8, avg_down=True),
        num_classes=10, hw=64,
        first_conv="conv1.0",
        note="ResNet-D: deep stem (8,8,16) + avg-pool shortcut (layer1: Identity pool, stride 1)",
    ),
    dict(
        name="resnext",
        kind="resnext",
        architecture="resnext50_32x4d",
        model_args=dict(layers=[1, 1, 1, 1], channels=[16, 24, 32, 40], cardinality=8, base_width=8),
        num_classes=10, hw=64,
        note="ResNeXt: grouped 3x3 (8 groups, 2..5 channels per group), layer1 without downsample "
             "(64 == 16*4). base_width 8, not 4: with planes this narrow base_width 4 gives 1 "
             "channel per group",
    ),
]

FULL_SIZE = ["resnet50", "resnet50d", "resnext50_32x4d"]


def describe(model, x) -> dict:
    """Structure read off the model itself, for the manifest."""
    import torch.nn as nn

    stem = "7x7" if isinstance(model.conv1, nn.Conv2d) else "deep"
    stem_chs = ([model.conv1.out_channels] if stem == "7x7"
                else [m.out_channels for m in model.conv1 if isinstance(m, nn.Conv2d)])
    stages = []
    shapes = {}
    hooks = []
    for i in range(1, 5):
        layer = getattr(model, f"layer{i}")
        hooks.append(layer.register_forward_hook(
            lambda m, inp, out, i=i: shapes.__setitem__(i, [list(inp[0].shape[2:]), list(out.shape[1:])])))
    with torch.no_grad():
        model(x)
    for h in hooks:
        h.remove()
    for i in range(1, 5):
        layer = getattr(model, f"layer{i}")
        b0 = layer[0]
        ds = b0.downsample
        if ds is None:
            ds_kind = "none"
        elif isinstance(ds[0], nn.Conv2d):
            ds_kind = f"conv{ds[0].kernel_size[0]}x{ds[0].kernel_size[1]}_s{ds[0].stride[0]}"
        elif isinstance(ds[0], nn.Identity):
            ds_kind = "identity_pool+conv1x1"
        else:
            ds_kind = f"avgpool{ds[0].kernel_size}_s{ds[0].stride}+conv1x1"
        conv3x3 = b0.conv2 if hasattr(b0, "conv3") else b0.conv1
        stages.append(dict(
            stage=f"layer{i}", blocks=len(layer), downsample=ds_kind,
            groups=conv3x3.groups, in_hw=shapes[i][0], out_chw=shapes[i][1]))
    return dict(stem=stem, stem_channels=stem_chs, stages=stages)


def run_model(model, x):
    with torch.no_grad():
        return model(x)


def make_case(out: Path, case: dict, seed: int, check_timm_io: bool) -> dict:
    import timm

    name = case["name"]
    arch = case["architecture"]
    n = case["num_classes"]
    hw = case["hw"]
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
        [3, hw, hw], n, interpolation="bicubic", crop_pct=0.95, crop_mode="center",
        first_conv=case.get("first_conv", "conv1"), classifier="fc",
        pool_size=[-(-hw // 32)] * 2, tag="kiln_fixture")
    cfg = common.hf_config(arch, n, model.num_features, pcfg, model_args=model_args)
    d = out / name
    tensors = common.write_hf_dir(d, model, cfg, case.get("drop_num_batches_tracked", False))
    common.save_npy(d / "input.npy", x.numpy().astype(np.float32))
    common.save_npy(d / "logits.npy", logits.numpy().astype(np.float32))
    common.save_npy(d / "logits_fp64.npy", logits64.numpy().astype(np.float64))

    # --- checks: reload from what was written, through timm, and compare.
    model2 = timm.create_model(arch, pretrained=False, num_classes=n, **cfg["model_args"])
    common.load_safetensors_into(model2, d / "model.safetensors")
    model2.eval()
    reload_diff = float((run_model(model2, x) - logits).abs().max())
    assert reload_diff == 0.0, f"{name}: reload changed logits by {reload_diff}"

    top2 = torch.topk(logits64, 2, dim=1).values
    info = dict(
        name=name, kind=case["kind"], architecture=arch, note=case.get("note", ""),
        model_args=model_args, num_classes=n, num_features=model.num_features,
        input_shape=list(x.shape), logits_shape=list(logits.shape),
        has_num_batches_tracked=any(k.endswith("num_batches_tracked") for k in tensors),
        num_tensors=len(tensors),
        num_params=int(sum(v.numel() for v in tensors.values() if v.is_floating_point())),
        randomized=counts,
        top1=[int(i) for i in logits.argmax(1)],
        min_top1_margin=float((top2[:, 0] - top2[:, 1]).min()),
        logits_abs_max=float(logits.abs().max()),
        fp32_vs_fp64_max_abs=float((logits.double() - logits64).abs().max()),
        structure=describe(model, x),
        seed=seed,
    )

    if check_timm_io:
        info["timm_io"] = timm_io_checks(model, d, x, logits, model_args)
    return info


def timm_io_checks(model, d: Path, x, logits, model_args) -> dict:
    """Compare with timm's own save_for_hf and (if this timm has it) its local-dir: loader."""
    import timm

    res = {}
    try:
        from timm.models._hub import save_for_hf
        with tempfile.TemporaryDirectory() as tmp:
            save_for_hf(model, tmp, model_args=model_args, safe_serialization=True)
            theirs = common.safetensors_header(Path(tmp) / "model.safetensors")
            ours = common.safetensors_header(d / "model.safetensors")
            theirs.pop("__metadata__", None)
            ours.pop("__metadata__", None)
            res["save_for_hf_keys_equal"] = sorted(theirs) == sorted(ours)
            res["save_for_hf_only_theirs"] = sorted(set(theirs) - set(ours))[:8]
            res["save_for_hf_dtypes"] = sorted({v["dtype"] for v in theirs.values()})
            with open(Path(tmp) / "config.json") as f:
                tcfg = json.load(f)
            res["save_for_hf_config_keys"] = list(tcfg)
            res["save_for_hf_pretrained_cfg_keys"] = list(tcfg.get("pretrained_cfg", {}))
    except Exception as e:  # report, never fail the fixture on this
        res["save_for_hf_error"] = f"{type(e).__name__}: {e}"
    try:
        m = timm.create_model(f"local-dir:{d}", pretrained=True)
        m.eval()
        res["local_dir_max_abs_diff"] = float((run_model(m, x) - logits).abs().max())
        dc = timm.data.resolve_model_data_config(m)
        res["local_dir_data_config"] = {k: (list(v) if isinstance(v, tuple) else v) for k, v in dc.items()}
    except Exception as e:
        res["local_dir_error"] = f"{type(e).__name__}: {str(e)[:300]}"
    return res


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
            [3, 224, 224], model.num_classes, interpolation=dc.get("interpolation", "bicubic"),
            crop_pct=dc.get("crop_pct", 0.95), crop_mode=dc.get("crop_mode", "center"),
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
                          min_top1_margin=float((top2[:, 0] - top2[:, 1]).min()),
                          seed=seed + 100 * i))
        print(f"[full-size] {name}: top1={infos[-1]['top1']} margin={infos[-1]['min_top1_margin']:.4f}")
    return infos


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="tests/fixtures/resnet", help="fixture root (default: %(default)s)")
    ap.add_argument("--seed", type=int, default=SEED)
    ap.add_argument("--cases", nargs="*", help="only these case names")
    ap.add_argument("--full-size", metavar="OUTDIR",
                    help="instead write full-size seeded resnet50/resnet50d/resnext50_32x4d (224x224)")
    ap.add_argument("--no-timm-io-checks", action="store_true",
                    help="skip comparing with timm's save_for_hf / local-dir loader")
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
        info = make_case(out, case, args.seed + 1000 * i, not args.no_timm_io_checks)
        infos.append(info)
        size = sum(p.stat().st_size for p in (out / case["name"]).iterdir())
        print(f"{case['name']:>18}: {case['architecture']:<16} params={info['num_params']:>7} "
              f"bytes={size:>7} top1={info['top1']} margin={info['min_top1_margin']:.4f} "
              f"|logits|max={info['logits_abs_max']:.3f} fp32-fp64={info['fp32_vs_fp64_max_abs']:.2e}")
        if "timm_io" in info:
            print(f"{'':>20}timm_io: {json.dumps(info['timm_io'])}")

    manifest = dict(
        description="Seeded timm ResNet fixtures for kiln (tools/reference/make_fixtures.py). "
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
