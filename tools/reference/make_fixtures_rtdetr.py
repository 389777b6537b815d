#!/usr/bin/env python3
"""Write seeded RT-DETR v2 (RTDetrV2ForObjectDetection) checkpoints + fp32 reference outputs for kiln.

Built offline with transformers (no hub): RTDetrResNetConfig + RTDetrV2Config, as FIELD-NOTES §7
"Offline model" says, then every parameter and buffer randomized with a seeded generator and every
BatchNorm / FrozenBatchNorm rescaled (in forward order, one pass) so that its output has unit standard
deviation per channel on the seeded input (FIELD-NOTES §8: deep random nets explode otherwise).

Each case directory holds
    config.json        written by save_pretrained (model_type rt_detr_v2, RTDetrV2ForObjectDetection)
    preprocessor_config.json  RTDetrImageProcessor's, size = the input's (H, W)
    model.safetensors  written by save_pretrained (transformers 5.x names; see families/rt_detr_v2/README.md)
    input.npy          float32 [N, 3, H, W], seeded U(0, 1) (pixel_values after /255)
    logits.npy         float32 [N, Q, C]  model.eval(), torch fp32 on the CPU
    pred_boxes.npy     float32 [N, Q, 4]  (cx, cy, w, h), normalized
plus <out>/manifest.json (structure, selection margins, versions).

The small CI cases (narrow widths) go to tests/fixtures/rt_detr_v2/<case>/; --full-size OUT writes the
r18vd structure at 640x640, batch 1 (about 80 MB: for the GPU machine, never committed).

Usage (where torch + transformers exist, /work/venv-ref here):
    python3 tools/reference/make_fixtures_rtdetr.py                      # CI cases
    python3 tools/reference/make_fixtures_rtdetr.py --full-size /tmp/rtdetr_r18vd
"""
from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn

SEED = 20261212

# Small cases: narrow widths, strides 8/16/32 kept. encoder_hidden_dim == d_model (the decoder's input
# projections read encoder_hidden_dim channels, decoder_in_channels says so).
CASES = [
    dict(name="basic_1l",
         note="r18vd-like basic blocks (depths 1,2,1,1), 1 decoder layer, non-square 96x128 input "
              "(levels 12x16, 6x8, 3x4; every anchor valid)",
         backbone=dict(embedding_size=16, hidden_sizes=[16, 32, 48, 64], depths=[1, 2, 1, 1], layer_type="basic"),
         model=dict(d_model=32, heads=4, enc_ffn=64, dec_ffn=64, decoder_layers=1, num_queries=30,
                    num_labels=5, n_points=4),
         hw=(96, 128), batch=2),
    dict(name="bottleneck_2l",
         note="r50vd-like bottleneck blocks (depths 1,1,2,1), 2 decoder layers, 3 points per level, "
              "64x416 input: level 0 is 8x52, so its first and last anchor columns (x = 0.5/52 < 0.01) are "
              "invalid and the memory masking and finfo.max fill matter",
         backbone=dict(embedding_size=16, hidden_sizes=[32, 64, 96, 96], depths=[1, 1, 2, 1],
                       layer_type="bottleneck"),
         model=dict(d_model=24, heads=2, enc_ffn=48, dec_ffn=48, decoder_layers=2, num_queries=40,
                    num_labels=3, n_points=3),
         hw=(64, 416), batch=2),
    dict(name="discrete_1l",
         note="decoder_method discrete (nearest sample, clamped), basic blocks, 3 images of 64x64",
         backbone=dict(embedding_size=16, hidden_sizes=[16, 16, 32, 64], depths=[1, 1, 1, 1], layer_type="basic"),
         model=dict(d_model=32, heads=4, enc_ffn=64, dec_ffn=64, decoder_layers=1, num_queries=20,
                    num_labels=4, n_points=2, decoder_method="discrete"),
         hw=(64, 64), batch=3),
]


def make_config(case):
    from transformers import RTDetrResNetConfig, RTDetrV2Config

    b, m = case["backbone"], case["model"]
    bb = RTDetrResNetConfig(num_channels=3, embedding_size=b["embedding_size"], hidden_sizes=b["hidden_sizes"],
                            depths=b["depths"], layer_type=b["layer_type"], hidden_act="relu",
                            downsample_in_first_stage=False, out_features=["stage2", "stage3", "stage4"],
                            out_indices=[2, 3, 4])
    d = m["d_model"]
    return RTDetrV2Config(
        backbone_config=bb, encoder_in_channels=b["hidden_sizes"][1:], encoder_hidden_dim=d,
        encoder_ffn_dim=m["enc_ffn"], encoder_attention_heads=m["heads"], hidden_expansion=0.5,
        d_model=d, decoder_in_channels=[d, d, d], decoder_ffn_dim=m["dec_ffn"],
        decoder_attention_heads=m["heads"], decoder_layers=m["decoder_layers"], num_queries=m["num_queries"],
        num_labels=m["num_labels"], decoder_n_points=m["n_points"],
        decoder_method=m.get("decoder_method", "default"),
        # tie_word_embeddings (the 5.x default) ties class/bbox_embed.N to .0, which a 1-layer decoder
        # cannot express (transformers raises); the Hub checkpoints keep one head per layer.
        tie_word_embeddings=False)


def full_size_config():
    from transformers import RTDetrResNetConfig, RTDetrV2Config

    bb = RTDetrResNetConfig(num_channels=3, embedding_size=64, hidden_sizes=[64, 128, 256, 512], depths=[2, 2, 2, 2],
                            layer_type="basic", hidden_act="relu", downsample_in_first_stage=False,
                            out_features=["stage2", "stage3", "stage4"], out_indices=[2, 3, 4])
    return RTDetrV2Config(backbone_config=bb, encoder_in_channels=[128, 256, 512], hidden_expansion=0.5,
                          decoder_layers=3, num_labels=80, tie_word_embeddings=False)


def is_norm2d(m):
    return isinstance(m, nn.BatchNorm2d) or type(m).__name__.endswith("FrozenBatchNorm2d")


@torch.no_grad()
def randomize(model, seed):
    """Every float tensor of the state_dict but n_points_scale (a constant 1/n_points) gets seeded values."""
    gen = torch.Generator().manual_seed(seed)

    def normal(t, std, mean=0.0):
        t.copy_(torch.randn(t.shape, generator=gen, dtype=torch.float64).mul_(std).add_(mean).to(t.dtype))

    def uniform(t, lo, hi):
        t.copy_((torch.rand(t.shape, generator=gen, dtype=torch.float64) * (hi - lo) + lo).to(t.dtype))

    # By tensor, not by name: transformers 5.x ties the top-level class_embed / bbox_embed to the
    # decoder's (one module, two state_dict keys), and named_modules() names a shared module once.
    touched = set()
    for mname, mod in model.named_modules():
        pre = f"{mname}." if mname else ""
        if is_norm2d(mod):
            uniform(mod.weight, 0.5, 1.5)
            normal(mod.bias, 0.1)
            normal(mod.running_mean, 0.1)
            uniform(mod.running_var, 0.5, 1.5)
            touched.update(pre + k for k in ("weight", "bias", "running_mean", "running_var"))
            continue
        if isinstance(mod, nn.LayerNorm):
            uniform(mod.weight, 0.5, 1.5)
            normal(mod.bias, 0.1)
            touched.update(pre + k for k in ("weight", "bias"))
            continue
        for pname, p in mod.named_parameters(recurse=False):
            if p.dim() >= 2:
                normal(p, 1.0 / math.sqrt(p[0].numel()))
            else:
                normal(p, 0.1)
            touched.add(pre + pname)
    sd = model.state_dict()
    touched_storage = {sd[k].data_ptr() for k in touched if k in sd}
    missed = [k for k, v in sd.items()
              if v.is_floating_point() and k not in touched and v.data_ptr() not in touched_storage
              and not k.endswith("n_points_scale")]
    if missed:
        raise RuntimeError(f"untouched float tensors: {missed[:10]}")


@torch.no_grad()
def unit_scale_norms(model, x):
    """One forward pass; each 2-D norm, as it runs, is rescaled so its output has unit std per channel."""
    def hook(mod, inp, out):
        std = out.double().transpose(0, 1).reshape(out.shape[1], -1).std(dim=1).clamp(min=1e-3)
        mod.weight.div_(std.to(mod.weight.dtype))
        mod.bias.div_(std.to(mod.bias.dtype))
        return out / std.to(out.dtype).view(1, -1, 1, 1)

    hooks = [m.register_forward_hook(hook) for m in model.modules() if is_norm2d(m)]
    try:
        model(pixel_values=x)
    finally:
        for h in hooks:
            h.remove()
    return len(hooks)


def selection_margins(model, x):
    """Smallest gap between neighbours of the encoder's sorted top-(k+1) class maxima: a tiny gap lets
    rounding change which anchors (or in which order) the decoder gets."""
    out = model(pixel_values=x)
    k = model.config.num_queries
    scores = out.enc_outputs_class.max(-1).values
    top = torch.topk(scores, min(k + 1, scores.shape[1]), dim=1).values
    return float((top[:, :-1] - top[:, 1:]).min())


def build_case(cfg, hw, batch, seed, out_dir: Path, note=""):
    from transformers import RTDetrV2ForObjectDetection

    torch.manual_seed(seed)
    model = RTDetrV2ForObjectDetection(cfg).eval()
    randomize(model, seed)
    h, w = hw
    x = torch.rand((batch, 3, h, w), generator=torch.Generator().manual_seed(seed + 1), dtype=torch.float32)
    n_norms = unit_scale_norms(model, x)
    with torch.no_grad():
        out = model(pixel_values=x)
        margin = selection_margins(model, x)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out_dir))
    # transformers 5.x saves one name of the tied heads (model.decoder.class_embed / bbox_embed and the
    # top-level class_embed / bbox_embed are one module) and, reloading, ties the saved one to the
    # missing one, freshly initialized (seen with 5.17: "class_embed.* MISSING", outputs changed by 8.8).
    # save_pretrained's file keeps the Hub's names (5.x renames some modules inside, e.g. the decoder
    # layers' MLP, and maps them back on save), so the missing top-level copies are added to it rather
    # than writing state_dict() names (which lost layers.N.fc1 on the H200 with 5.17). kiln reads
    # model.decoder.* and accepts the top-level copies. The reload below proves the files alone suffice.
    from safetensors.torch import load_file, save_file
    st = out_dir / "model.safetensors"
    saved = load_file(str(st))
    sd = model.state_dict()
    extra = {k: v.detach().clone().contiguous() for k, v in sd.items()
             if k not in saved and re.match(r"(model\.decoder\.)?(class_embed|bbox_embed)\.", k)}
    if extra:
        saved.update(extra)
        save_file(saved, str(st), metadata={"format": "pt"})
    # The image processor's config carries the input size the engine is built for.
    from transformers import RTDetrImageProcessor
    RTDetrImageProcessor(size={"height": h, "width": w}).save_pretrained(str(out_dir))
    np.save(out_dir / "input.npy", x.numpy())
    np.save(out_dir / "logits.npy", out.logits.numpy().astype(np.float32))
    np.save(out_dir / "pred_boxes.npy", out.pred_boxes.numpy().astype(np.float32))

    # Reload from the files alone: they must reproduce the outputs exactly.
    m2 = RTDetrV2ForObjectDetection.from_pretrained(str(out_dir)).eval()
    with torch.no_grad():
        o2 = m2(pixel_values=x)
    diff = float(max((o2.logits - out.logits).abs().max(), (o2.pred_boxes - out.pred_boxes).abs().max()))
    if diff != 0.0:
        raise RuntimeError(f"{out_dir}: reload changed the outputs by {diff}")
    anchors, valid = model.model.generate_anchors(
        tuple((-(-h // s), -(-w // s)) for s in cfg.feat_strides))
    info = dict(note=note, input_shape=list(x.shape), logits_shape=list(out.logits.shape),
                boxes_shape=list(out.pred_boxes.shape), decoder_method=cfg.decoder_method,
                layer_type=cfg.backbone_config.layer_type, decoder_layers=cfg.decoder_layers,
                norms_rescaled=n_norms, valid_anchors=int(valid.sum()), anchors=int(valid.numel()),
                min_selection_gap=margin, logits_abs_max=float(out.logits.abs().max()),
                seed=seed)
    print(f"{out_dir.name}: logits {tuple(out.logits.shape)} |max| {info['logits_abs_max']:.3f}, "
          f"valid anchors {info['valid_anchors']}/{info['anchors']}, min selection gap {margin:.2e}")
    return info


def versions():
    import transformers
    return {"torch": torch.__version__, "transformers": transformers.__version__, "numpy": np.__version__}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="tests/fixtures/rt_detr_v2", help="directory of the small CI cases")
    ap.add_argument("--full-size", metavar="OUT", help="write the r18vd structure at 640x640, batch 1, to OUT")
    args = ap.parse_args(argv)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    torch.use_deterministic_algorithms(True)
    if args.full_size:
        info = build_case(full_size_config(), (640, 640), 1, SEED + 1000, Path(args.full_size),
                          note="r18vd at 640x640, seeded")
        with open(Path(args.full_size) / "manifest.json", "w") as f:
            json.dump(dict(versions=versions(), case=info), f, indent=2)
            f.write("\n")
        return 0
    out = Path(args.out)
    cases = []
    for i, case in enumerate(CASES):
        info = build_case(make_config(case), case["hw"], case["batch"], SEED + 10 * i, out / case["name"],
                          note=case["note"])
        cases.append(dict(name=case["name"], **info))
    with open(out / "manifest.json", "w") as f:
        json.dump(dict(description="Seeded RT-DETR v2 fixtures (tools/reference/make_fixtures_rtdetr.py): input.npy "
                                   "is pixel_values (after /255); logits.npy and pred_boxes.npy are torch fp32, "
                                   "CPU, eval mode.", versions=versions(), seed=SEED,
                       files=["config.json", "preprocessor_config.json", "model.safetensors", "input.npy", "logits.npy", "pred_boxes.npy"],
                       cases=cases), f, indent=2)
        f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
