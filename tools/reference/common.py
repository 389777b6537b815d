"""Shared helpers for kiln's Python reference scripts.

These scripts run where torch and timm are installed (the GPU machine), never in CI.
They produce the fixtures and the demo model that kiln's C++ tests read:

* seeding (python, numpy, torch) and fp32-exact reference settings (no TF32),
* randomizing EVERY parameter and BatchNorm running statistic of a model with a
  seeded generator (timm's default init zeroes the last BN of each residual block,
  which would hide wiring bugs in an engine builder),
* writing a directory laid out like a timm checkpoint on the Hugging Face Hub
  (config.json + model.safetensors), mirroring timm.models._hub.save_for_hf,
* the whole flow of the make_fixtures*.py scripts (FixtureFamily, fixture_main): each family
  script only lists its cases and describes its structure; building and randomizing the models,
  writing the case directories and the manifest, --full-size and the command line live here.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

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
    write_json(outdir / "config.json", config)
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


def write_json(path: os.PathLike, obj: Any) -> None:
    """json.dump with indent 2 and a trailing newline (config.json, manifest.json)."""
    with open(path, "w") as f:
        json.dump(obj, f, indent=2)
        f.write("\n")


# --------------------------------------------------------------------------- fixture families
#
# Every make_fixtures*.py script writes, per case, a directory
#
#     <out>/<case>/config.json        timm HF layout: architecture, num_classes, num_features,
#                                     model_args, pretrained_cfg
#     <out>/<case>/model.safetensors  model.state_dict(), float32 (+ int64 num_batches_tracked,
#                                     unless the case sets drop_num_batches_tracked)
#     <out>/<case>/input.npy          float32 [2, 3, H, W], seeded N(0, 1), already normalized
#     <out>/<case>/logits.npy         float32 [2, num_classes], PyTorch fp32 on CPU, eval mode
#     <out>/<case>/logits_fp64.npy    float64 [2, num_classes], the same model in float64
#
# plus <out>/manifest.json; with --full-size DIR, full-size 224x224 models (batch 1, no fp64).

FIXTURE_FILES = ["config.json", "model.safetensors", "input.npy", "logits.npy", "logits_fp64.npy"]


def run_model(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(x)


def seeded_input(shape: Sequence[int], seed: int) -> torch.Tensor:
    """float32 N(0, 1) of `shape` from a generator seeded with `seed`."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(tuple(shape), generator=gen, dtype=torch.float32)


def forward_shapes(model: nn.Module, modules: Dict[Any, nn.Module], x: torch.Tensor) -> Dict[Any, Tuple[list, list]]:
    """Run model(x) once; {key: (input shape, output shape)} of each module of `modules` (key -> module)."""
    shapes: Dict[Any, Tuple[list, list]] = {}
    hooks = [m.register_forward_hook(
        lambda mod, inp, out, k=k: shapes.__setitem__(k, (list(inp[0].shape), list(out.shape))))
        for k, m in modules.items()]
    try:
        run_model(model, x)
    finally:
        for h in hooks:
            h.remove()
    return shapes


def top1_margin(logits: torch.Tensor) -> float:
    """Smallest gap between the two largest logits of a row."""
    top2 = torch.topk(logits, 2, dim=1).values
    return float((top2[:, 0] - top2[:, 1]).min())


def write_case_dir(d: Path, model: nn.Module, config: Dict[str, Any], x: torch.Tensor, logits: torch.Tensor,
                   logits64: Optional[torch.Tensor] = None,
                   drop_num_batches_tracked: bool = False) -> Dict[str, torch.Tensor]:
    """config.json + model.safetensors + input.npy + logits.npy (+ logits_fp64.npy) into `d`."""
    tensors = write_hf_dir(d, model, config, drop_num_batches_tracked)
    save_npy(d / "input.npy", x.numpy().astype(np.float32))
    save_npy(d / "logits.npy", logits.numpy().astype(np.float32))
    if logits64 is not None:
        save_npy(d / "logits_fp64.npy", logits64.numpy().astype(np.float64))
    return tensors


def create_timm_model(case: Dict[str, Any], model_args: Dict[str, Any]) -> nn.Module:
    """timm.create_model(architecture, num_classes=..., **model_args): FixtureFamily's default builder."""
    import timm

    return timm.create_model(case["architecture"], pretrained=False, num_classes=case["num_classes"], **model_args)


@dataclass
class FixtureFamily:
    """What a make_fixtures*.py script tells fixture_main about its family.

    A case is a dict: name, architecture, model_args, num_classes, hw (int, or (h, w)), note, and
    optionally first_conv (pretrained_cfg), drop_num_batches_tracked, kind (copied into the manifest
    as "kind") and gen (copied as "generator"), plus whatever `build` reads.
    """
    doc: str                    # the script's docstring: argparse description
    description: str            # manifest.json "description"
    default_out: str
    seed: int
    cases: List[Dict[str, Any]]
    full_size: List[str]        # timm names written by --full-size
    describe: Callable[[nn.Module, torch.Tensor], Dict[str, Any]]  # structure for the manifest
    build: Callable[[Dict[str, Any], Dict[str, Any]], nn.Module] = create_timm_model  # (case, model_args)
    # pretrained_cfg of the small cases, and defaults of --full-size where the model's own cfg lacks a key
    interpolation: str = "bicubic"
    crop_pct: float = 0.95
    first_conv: str = "conv1"
    classifier: str = "fc"
    full_size_cfg: Dict[str, Any] = field(default_factory=dict)  # --full-size pretrained_cfg fixed values
    full_size_help: str = ""
    models_option: bool = False            # --models: which of full_size to write
    timm_io_option: bool = False           # compare with timm's save_for_hf / local-dir loader
    record_num_batches_tracked: bool = True  # manifest: has_num_batches_tracked per case
    full_size_logits_abs_max: bool = True    # manifest of --full-size: logits_abs_max per model
    name_width: int = 16                   # progress line columns
    arch_width: int = 18


def make_case(fam: FixtureFamily, out: Path, case: Dict[str, Any], seed: int, check_timm_io: bool = False) -> Dict[str, Any]:
    """Build, randomize and run one case, write its directory, check a reload; its manifest entry."""
    name, arch, n = case["name"], case["architecture"], case["num_classes"]
    h, w = case["hw"] if isinstance(case["hw"], tuple) else (case["hw"], case["hw"])
    model_args = dict(case["model_args"])
    model = fam.build(case, model_args)
    counts = randomize_(model, seed)
    model.eval()

    x = seeded_input((2, 3, h, w), seed + 1)
    logits = run_model(model, x)
    logits64 = run_model(model.double(), x.double())
    model.float()

    pcfg = pretrained_cfg(
        [3, h, w], n, interpolation=fam.interpolation, crop_pct=fam.crop_pct, crop_mode="center",
        first_conv=case.get("first_conv", fam.first_conv), classifier=fam.classifier,
        pool_size=[-(-h // 32), -(-w // 32)], tag="kiln_fixture")
    cfg = hf_config(arch, n, model.num_features, pcfg, model_args=model_args)
    d = out / name
    tensors = write_case_dir(d, model, cfg, x, logits, logits64, case.get("drop_num_batches_tracked", False))

    # Reload from what was written, through the same builder: the files alone must reproduce the logits.
    model2 = fam.build(case, cfg["model_args"])
    load_safetensors_into(model2, d / "model.safetensors")
    model2.eval()
    reload_diff = float((run_model(model2, x) - logits).abs().max())
    assert reload_diff == 0.0, f"{name}: reload changed logits by {reload_diff}"

    info: Dict[str, Any] = dict(name=name)
    if "kind" in case:
        info["kind"] = case["kind"]
    info["architecture"] = arch
    if "gen" in case:
        info["generator"] = case["gen"]
    info.update(note=case.get("note", ""), model_args=model_args, num_classes=n, num_features=model.num_features,
                input_shape=list(x.shape), logits_shape=list(logits.shape))
    if fam.record_num_batches_tracked:
        info["has_num_batches_tracked"] = any(k.endswith("num_batches_tracked") for k in tensors)
    info.update(
        num_tensors=len(tensors),
        num_params=int(sum(v.numel() for v in tensors.values() if v.is_floating_point())),
        randomized=counts,
        top1=[int(i) for i in logits.argmax(1)],
        min_top1_margin=top1_margin(logits64),
        logits_abs_max=float(logits.abs().max()),
        fp32_vs_fp64_max_abs=float((logits.double() - logits64).abs().max()),
        structure=fam.describe(model, x),
        seed=seed,
    )
    if check_timm_io:
        info["timm_io"] = timm_io_checks(model, d, x, logits, model_args)
    return info


def timm_io_checks(model: nn.Module, d: Path, x: torch.Tensor, logits: torch.Tensor, model_args) -> Dict[str, Any]:
    """Compare with timm's own save_for_hf and (if this timm has it) its local-dir: loader."""
    import timm

    res: Dict[str, Any] = {}
    try:
        from timm.models._hub import save_for_hf
        with tempfile.TemporaryDirectory() as tmp:
            save_for_hf(model, tmp, model_args=model_args, safe_serialization=True)
            theirs = safetensors_header(Path(tmp) / "model.safetensors")
            ours = safetensors_header(d / "model.safetensors")
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


def make_full_size(fam: FixtureFamily, out: Path, seed: int, names: Sequence[str]) -> List[Dict[str, Any]]:
    """Full-size timm models (their own num_classes), randomized, 224x224 batch 1; no fp64 logits."""
    import timm

    infos = []
    for i, name in enumerate(names):
        model_seed = seed + 100 * i
        model = timm.create_model(name, pretrained=False)
        counts = randomize_(model, model_seed)
        model.eval()
        dc = model.pretrained_cfg
        x = seeded_input((1, 3, 224, 224), model_seed + 1)
        logits = run_model(model, x)
        cfg_args = dict(
            interpolation=dc.get("interpolation", fam.interpolation), crop_pct=dc.get("crop_pct", fam.crop_pct),
            crop_mode=dc.get("crop_mode", "center"),
            mean=dc.get("mean", IMAGENET_DEFAULT_MEAN), std=dc.get("std", IMAGENET_DEFAULT_STD),
            first_conv=dc.get("first_conv", fam.first_conv), classifier=dc.get("classifier", fam.classifier),
            pool_size=dc.get("pool_size"))
        cfg_args.update(fam.full_size_cfg)
        pcfg = pretrained_cfg([3, 224, 224], model.num_classes, tag="kiln_fullsize", **cfg_args)
        cfg = hf_config(name, model.num_classes, model.num_features, pcfg)
        tensors = write_case_dir(out / name, model, cfg, x, logits)
        info = dict(name=name, architecture=name, num_classes=model.num_classes,
                    num_features=model.num_features, input_shape=list(x.shape),
                    num_tensors=len(tensors), randomized=counts,
                    top1=[int(j) for j in logits.argmax(1)])
        if fam.full_size_logits_abs_max:
            info["logits_abs_max"] = float(logits.abs().max())
        info.update(min_top1_margin=top1_margin(logits), seed=model_seed)
        infos.append(info)
        print(f"[full-size] {name}: top1={info['top1']} margin={info['min_top1_margin']:.4f} "
              f"|logits|max={float(logits.abs().max()):.3f}")
    return infos


def fixture_main(fam: FixtureFamily, argv: Optional[Sequence[str]] = None) -> int:
    """The command line of a make_fixtures*.py script: --out, --seed, --cases, --full-size (and options)."""
    ap = argparse.ArgumentParser(description=fam.doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=fam.default_out, help="fixture root (default: %(default)s)")
    ap.add_argument("--seed", type=int, default=fam.seed)
    ap.add_argument("--cases", nargs="*", help="only these case names")
    ap.add_argument("--full-size", metavar="OUTDIR", help=fam.full_size_help or (
        "instead write full-size seeded " + "/".join(fam.full_size) + " (224x224, batch 1)"))
    if fam.models_option:
        ap.add_argument("--models", nargs="*", default=fam.full_size,
                        help="with --full-size: which (default: %(default)s)")
    if fam.timm_io_option:
        ap.add_argument("--no-timm-io-checks", action="store_true",
                        help="skip comparing with timm's save_for_hf / local-dir loader")
    args = ap.parse_args(argv)

    strict_fp32()
    torch.set_num_threads(max(1, min(8, os.cpu_count() or 1)))
    vers = versions()
    print(f"torch {vers['torch']}  timm {vers['timm']}  numpy {vers['numpy']}")

    if args.full_size:
        out = Path(args.full_size)
        out.mkdir(parents=True, exist_ok=True)
        infos = make_full_size(fam, out, args.seed, args.models if fam.models_option else fam.full_size)
        write_json(out / "manifest.json", dict(versions=vers, seed=args.seed, cases=infos))
        return 0

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cases = [c for c in fam.cases if not args.cases or c["name"] in args.cases]
    check_timm_io = fam.timm_io_option and not args.no_timm_io_checks
    infos = []
    for i, case in enumerate(cases):
        info = make_case(fam, out, case, args.seed + 1000 * i, check_timm_io)
        infos.append(info)
        size = sum(p.stat().st_size for p in (out / case["name"]).iterdir())
        print(f"{case['name']:>{fam.name_width}}: {case['architecture']:<{fam.arch_width}} "
              f"params={info['num_params']:>7} bytes={size:>7} top1={info['top1']} "
              f"margin={info['min_top1_margin']:.4f} |logits|max={info['logits_abs_max']:.3f} "
              f"fp32-fp64={info['fp32_vs_fp64_max_abs']:.2e}")
        if "timm_io" in info:
            print(f"{'':>{fam.name_width + 2}}timm_io: {json.dumps(info['timm_io'])}")

    write_json(out / "manifest.json", dict(
        description=fam.description, versions=vers, seed=args.seed, files=list(FIXTURE_FILES), cases=infos))
    print(f"wrote {len(infos)} cases to {out}")
    return 0
