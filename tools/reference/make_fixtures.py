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

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch.nn as nn  # noqa: E402

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
    stem = "7x7" if isinstance(model.conv1, nn.Conv2d) else "deep"
    stem_chs = ([model.conv1.out_channels] if stem == "7x7"
                else [m.out_channels for m in model.conv1 if isinstance(m, nn.Conv2d)])
    layers = [getattr(model, f"layer{i}") for i in range(1, 5)]
    shapes = common.forward_shapes(model, dict(enumerate(layers)), x)
    stages = []
    for i, layer in enumerate(layers):
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
        in_shape, out_shape = shapes[i]
        stages.append(dict(
            stage=f"layer{i + 1}", blocks=len(layer), downsample=ds_kind,
            groups=conv3x3.groups, in_hw=in_shape[2:], out_chw=out_shape[1:]))
    return dict(stem=stem, stem_channels=stem_chs, stages=stages)


FAMILY = common.FixtureFamily(
    doc=__doc__,
    description="Seeded timm ResNet fixtures for kiln (tools/reference/make_fixtures.py). "
                "input.npy is already normalized (fed to the network as is); logits.npy is "
                "PyTorch fp32 on CPU in eval mode, logits_fp64.npy the same in float64.",
    default_out="tests/fixtures/resnet", seed=SEED, cases=CASES, full_size=FULL_SIZE, describe=describe,
    interpolation="bicubic", crop_pct=0.95, first_conv="conv1", classifier="fc",
    timm_io_option=True, full_size_logits_abs_max=False, name_width=18, arch_width=16, models_option=True,
)

if __name__ == "__main__":
    sys.exit(common.fixture_main(FAMILY))
