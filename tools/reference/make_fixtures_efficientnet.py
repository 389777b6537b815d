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
generator kwargs, so `_gen_*(architecture, **model_args)` rebuilds the model (common.make_case checks the reload);
kiln itself reads the structure from the tensors and only the architecture name from the config.

Usage (where torch + timm exist):
    python3 tools/reference/make_fixtures_efficientnet.py --out tests/fixtures/efficientnet
    python3 tools/reference/make_fixtures_efficientnet.py --full-size /tmp/fullsize_effnet
        # efficientnet_b0 and tf_efficientnet_b0, 224x224, batch 1 (--models to pick)
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch.nn as nn  # noqa: E402

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


def gen_model(case: dict, model_args: dict):
    """The entrypoint's generator (case["gen"]) with these kwargs instead of the entrypoint's multipliers."""
    from timm.models import efficientnet as eff

    fn = getattr(eff, case["gen"])
    return fn(case["architecture"], pretrained=False, num_classes=case["num_classes"], **model_args)


def describe(model, x) -> dict:
    """Structure read off the model itself, for the manifest."""
    shapes = common.forward_shapes(model, dict(enumerate(model.blocks)), x)
    stages = []
    for k, stage in enumerate(model.blocks):
        b0 = stage[0]
        conv = getattr(b0, "conv_dw", None) or getattr(b0, "conv_exp", None) or getattr(b0, "conv")
        se = getattr(b0, "se", None)
        stages.append(dict(stage=k, blocks=len(stage), kind=type(b0).__name__, stride=conv.stride[0],
                           kernel=conv.kernel_size[0], se=not isinstance(se, nn.Identity) and se is not None,
                           skips=[bool(b.has_skip) for b in stage], out_chw=shapes[k][1][1:]))
    return dict(stem_channels=model.conv_stem.out_channels, act=type(model.bn1.act).__name__,
                bn_eps=model.bn1.eps, stages=stages)


FAMILY = common.FixtureFamily(
    doc=__doc__,
    description="Seeded timm EfficientNet fixtures for kiln (tools/reference/make_fixtures_efficientnet.py). "
                "input.npy is already normalized; logits.npy is PyTorch fp32 on CPU in eval mode, "
                "logits_fp64.npy the same in float64.",
    default_out="tests/fixtures/efficientnet", seed=SEED, cases=CASES, full_size=FULL_SIZE, describe=describe,
    build=gen_model, interpolation="bicubic", crop_pct=0.875, first_conv="conv_stem", classifier="classifier",
    full_size_cfg=dict(first_conv="conv_stem", classifier="classifier", pool_size=[7, 7]),
    full_size_help="instead write full-size seeded models (224x224, batch 1; --models picks which)",
    models_option=True, record_num_batches_tracked=False, name_width=16, arch_width=22,
)

if __name__ == "__main__":
    sys.exit(common.fixture_main(FAMILY))
