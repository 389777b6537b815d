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
    python3 tools/reference/make_fixtures_res2net.py --full-size D --models res2net50_26w_8s res2net101_26w_4s
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch.nn as nn  # noqa: E402

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


def describe(model, x) -> dict:
    """Structure read off the model itself, for the manifest (x unused)."""
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


FAMILY = common.FixtureFamily(
    doc=__doc__,
    description="Seeded timm Res2Net fixtures for kiln (tools/reference/make_fixtures_res2net.py). "
                "input.npy is already normalized (fed to the network as is); logits.npy is "
                "PyTorch fp32 on CPU in eval mode, logits_fp64.npy the same in float64.",
    default_out="tests/fixtures/res2net", seed=SEED, cases=CASES, full_size=FULL_SIZE, describe=describe,
    interpolation="bilinear", crop_pct=0.875, first_conv="conv1", classifier="fc",
    name_width=12, arch_width=18, models_option=True,
    full_size_help="instead write full-size seeded models (224x224, batch 1; --models picks which, "
                   "default " + " ".join(FULL_SIZE) + ")",
)

if __name__ == "__main__":
    sys.exit(common.fixture_main(FAMILY))
