"""Shared helpers for kiln's Python reference scripts.

These scripts run where torch and timm are installed (the GPU machine), never in CI.
They produce the fixtures and the demo model that kiln's C++ tests read:

* seeding (python, numpy, torch) and fp32-exact reference settings (no TF32),
* randomizing EVERY parameter and BatchNorm running statistic of a model with a
  seeded generator (timm's default init zeroes the last BN of each residual block,
  which would hide wiring bugs in an engine builder),
* writing a directory laid out like a timm checkpoint on the Hugging Face Hub
  (config.json + model.safetensors), mirroring timm.models._hub.save_for_hf.
"""
from __future__ import annotations

import json
import math
import os
import random
from pathlib import Path
from typing import Any, Dict, Iterable, Optional

import numpy as np
import torch
import torch.nn as nn

IMAGENET_DEFAULT_MEAN = [0.485, 0.456, 0.406]
IMAGENET_DEFAULT_STD = [0.229, 0.224, 0.225]


# --------------------------------------------------------------------------- seeding

def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch (CPU and CUDA)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)


def strict_fp32() -> None:
    """Make fp32 mean fp32: no TF32 in matmuls or cuDNN convolutions, deterministic cuDNN."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.set_float32_matmul_precision("highest")


# --------------------------------------------------------------------------- randomizing

_BN_TYPES = (nn.modules.batchnorm._BatchNorm,)


@torch.no_grad()
def randomize_(model: nn.Module, seed: int) -> Dict[str, int]:
    """Overwrite every floating-point parameter and buffer of `model`, deterministically.

    * weights with >= 2 dims (conv, linear): N(0, std = 1/sqrt(fan_in)), fan_in = weight[0].numel()
      (in_channels/groups * kh * kw for a conv), so activations stay O(1) through depth;
    * BatchNorm: weight U(0.5, 1.5), bias N(0, 0.1), running_mean N(0, 0.1), running_var U(0.5, 1.5);
    * any other 1-D parameter (conv/linear bias): N(0, 0.1).

    num_batches_tracked (an int64 buffer of BatchNorm) is left as is. Raises if a floating-point
    tensor of the state_dict would stay untouched, so nothing silently keeps timm's init.
    Returns counts of what was randomized, by category.
    """
    gen = torch.Generator(device="cpu")
    gen.manual_seed(seed)

    def normal_(t: torch.Tensor, std: float, mean: float = 0.0) -> None:
        t.copy_(torch.randn(t.shape, generator=gen, dtype=torch.float64).mul_(std).add_(mean).to(t.dtype))

    def uniform_(t: torch.Tensor, lo: float, hi: float) -> None:
        t.copy_((torch.rand(t.shape, generator=gen, dtype=torch.float64) * (hi - lo) + lo).to(t.dtype))

    touched = set()
    counts = {"weight_nd": 0, "bn": 0, "bias": 0}
    # named_modules() order is the registration order, which is also state_dict order: deterministic.
    for mname, module in model.named_modules():
        prefix = f"{mname}." if mname else ""
        if isinstance(module, _BN_TYPES):
            if module.weight is not None:
                uniform_(module.weight, 0.5, 1.5)
                touched.add(prefix + "weight")
            if module.bias is not None:
                normal_(module.bias, 0.1)
                touched.add(prefix + "bias")
            if module.running_mean is not None:
                normal_(module.running_mean, 0.1)
                touched.add(prefix + "running_mean")
            if module.running_var is not None:
                uniform_(module.running_var, 0.5, 1.5)
                touched.add(prefix + "running_var")
            counts["bn"] += 1
            continue
        for pname, p in module.named_parameters(recurse=False):
            if not p.is_floating_point():
                continue
            if p.dim() >= 2:
                fan_in = p[0].numel()
                normal_(p, 1.0 / math.sqrt(fan_in))
                counts["weight_nd"] += 1
            else:
                normal_(p, 0.1)
                counts["bias"] += 1
            touched.add(prefix + pname)

    missed = [k for k, v in model.state_dict().items() if v.is_floating_point() and k not in touched]
    if missed:
        raise RuntimeError(f"randomize_: floating-point tensors left untouched: {missed}")
    return counts


# --------------------------------------------------------------------------- HF (timm) layout

def pretrained_cfg(
        input_size: Iterable[int],
        num_classes: int,
        *,
        interpolation: str = "bicubic",
        crop_pct: float = 0.95,
        crop_mode: str = "center",
        mean: Iterable[float] = IMAGENET_DEFAULT_MEAN,
        std: Iterable[float] = IMAGENET_DEFAULT_STD,
        first_conv: str = "conv1",
        classifier: str = "fc",
        pool_size: Optional[Iterable[int]] = None,
        tag: Optional[str] = None,
) -> Dict[str, Any]:
    """A pretrained_cfg as timm writes it into config.json (filter_pretrained_cfg: no nulls, no source)."""
    cfg: Dict[str, Any] = {}
    if tag:
        cfg["tag"] = tag
    cfg["custom_load"] = False
    cfg["input_size"] = [int(x) for x in input_size]
    cfg["fixed_input_size"] = False
    cfg["interpolation"] = interpolation
    cfg["crop_pct"] = float(crop_pct)
    cfg["crop_mode"] = crop_mode
    cfg["mean"] = [float(x) for x in mean]
    cfg["std"] = [float(x) for x in std]
    cfg["num_classes"] = int(num_classes)
    if pool_size is not None:
        cfg["pool_size"] = [int(x) for x in pool_size]
    cfg["first_conv"] = first_conv
    cfg["classifier"] = classifier
    return cfg


def hf_config(
        architecture: str,
        num_classes: int,
        num_features: int,
        pretrained: Dict[str, Any],
        model_args: Optional[Dict[str, Any]] = None,
        label_names: Optional[list] = None,
        global_pool: str = "avg",
) -> Dict[str, Any]:
    """config.json content, keys in the order timm's save_config_for_hf writes them."""
    cfg: Dict[str, Any] = {
        "architecture": architecture,
        "num_classes": int(num_classes),
        "num_features": int(num_features),
        "global_pool": global_pool,
    }
    if label_names:
        cfg["label_names"] = list(label_names)
    if model_args:
        cfg["model_args"] = model_args
    cfg["pretrained_cfg"] = pretrained
    return cfg


def state_dict_for_save(model: nn.Module, drop_num_batches_tracked: bool = False) -> Dict[str, torch.Tensor]:
    """model.state_dict() as timm's save_for_hf saves it (it keeps num_batches_tracked, int64)."""
    out = {}
    for k, v in model.state_dict().items():
        if drop_num_batches_tracked and k.endswith("num_batches_tracked"):
            continue
        out[k] = v.detach().to("cpu").contiguous()
    return out


def write_hf_dir(
        outdir: os.PathLike,
        model: nn.Module,
        config: Dict[str, Any],
        drop_num_batches_tracked: bool = False,
) -> Dict[str, torch.Tensor]:
    """Write config.json and model.safetensors (fp32 float tensors) into `outdir`."""
    from safetensors.torch import save_file

    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    tensors = state_dict_for_save(model, drop_num_batches_tracked)
    for k, v in tensors.items():
        if v.is_floating_point() and v.dtype != torch.float32:
            raise RuntimeError(f"{k}: expected float32, got {v.dtype}")
    save_file(tensors, str(outdir / "model.safetensors"))
    with open(outdir / "config.json", "w") as f:
        json.dump(config, f, indent=2)
        f.write("\n")
    return tensors


def load_safetensors_into(model: nn.Module, path: os.PathLike, strict: bool = True) -> None:
    from safetensors.torch import load_file

    sd = load_file(str(path))
    missing, unexpected = model.load_state_dict(sd, strict=False)
    # BatchNorm fills a missing num_batches_tracked itself; anything else missing is an error.
    missing = [k for k in missing if not k.endswith("num_batches_tracked")]
    if strict and (missing or unexpected):
        raise RuntimeError(f"load {path}: missing={missing} unexpected={unexpected}")


def save_npy(path: os.PathLike, array) -> None:
    if isinstance(array, torch.Tensor):
        array = array.detach().cpu().numpy()
    np.save(str(path), np.ascontiguousarray(array))


def safetensors_header(path: os.PathLike) -> Dict[str, Any]:
    """Parse a safetensors file's JSON header without torch (u64 little-endian length + JSON)."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        return json.loads(f.read(n))


def versions() -> Dict[str, str]:
    import timm

    return {"torch": torch.__version__, "timm": timm.__version__, "numpy": np.__version__}
