#!/usr/bin/env python3
"""kiln against PyTorch on one GPU, in one job: build, time, compare, tabulate.

For every model and batch size asked for, on the GPU machine:

  1. make a seeded full-size timm checkpoint directory (config.json + model.safetensors):
     tools/reference/make_fixtures.py --full-size for the models it knows, otherwise a small
     helper here that randomizes the timm model with tools/reference/common.py the same way;
  2. `kiln build DIR -o X.bundle --backend cuda --precision fp16 --batch B`, wall time recorded;
  3. `kiln bench X.bundle --batch B --iterations R --warmup W --json` (engine time: one CUDA
     graph replay per round; docs/benchmarking.md);
  4. tools/reference/peer_bench.py on the same checkpoint, batch, rounds and warm-up
     (PyTorch eager, CUDA graph, torch.compile), right after, on the same GPU;
  5. print a Markdown table (ratios kiln/peer: below 1 means kiln is faster) and write every raw
     JSON, the kiln logs and the table under --out-dir.

If the kiln binary is missing or a kiln step fails, the step is reported and skipped and the
peers are still timed, so the PyTorch side of a report never waits on kiln.

Example (on the GPU machine, from the repository root):
    PYTHONUNBUFFERED=1 python3 bench/side_by_side.py --models resnet50 --batches 1,32 \\
        --peers eager,cuda_graph,compile --out-dir out/side_by_side
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "tools" / "reference"
SEED = 20240611  # make_fixtures.py's seed, so checkpoints made either way are reproducible alike


def log(msg: str) -> None:
    print(f"[side_by_side {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- checkpoints

def checkpoint_dir(model: str, work: Path, seed: int, python: str) -> Path:
    """A seeded full-size checkpoint directory for `model`, made once and reused.

    make_fixtures.py --full-size owns the models it lists (it writes all of them in one go);
    any other timm model is written by write_seeded_checkpoint below, to the same layout.
    """
    root = work / "checkpoints"
    d = root / model
    if (d / "config.json").exists() and (d / "model.safetensors").exists():
        log(f"{model}: reusing checkpoint {d}")
        return d
    sys.path.insert(0, str(REFERENCE))
    import make_fixtures  # needs torch + timm: imported only where a checkpoint must be made

    if model in make_fixtures.FULL_SIZE:
        cmd = [python, str(REFERENCE / "make_fixtures.py"), "--full-size", str(root), "--seed", str(seed)]
        log(f"{model}: {shlex.join(cmd)}")
        subprocess.run(cmd, check=True)
    else:
        write_seeded_checkpoint(model, d, seed)
    return d


def write_seeded_checkpoint(model_name: str, d: Path, seed: int) -> None:
    """Write a timm model with every parameter and BN statistic randomized (common.randomize_).

    The pretrained_cfg keeps the architecture's own pre-processing constants (input size,
    interpolation, crop, mean/std), so kiln builds the same runtime.json it would for the real
    checkpoint; only the weights are synthetic, and timings do not depend on their values.
    """
    sys.path.insert(0, str(REFERENCE))
    import common
    import timm

    common.strict_fp32()
    model = timm.create_model(model_name, pretrained=False)
    common.randomize_(model, seed)
    model.eval()
    pc = model.pretrained_cfg
    pcfg = common.pretrained_cfg(
        pc.get("input_size", (3, 224, 224)), model.num_classes,
        interpolation=pc.get("interpolation", "bicubic"), crop_pct=pc.get("crop_pct", 0.875),
        crop_mode=pc.get("crop_mode", "center"), mean=pc.get("mean", common.IMAGENET_DEFAULT_MEAN),
        std=pc.get("std", common.IMAGENET_DEFAULT_STD), first_conv=pc.get("first_conv", "conv1"),
        classifier=pc.get("classifier", "fc"), pool_size=pc.get("pool_size"), tag="kiln_fullsize")
    cfg = common.hf_config(model_name, model.num_classes, model.num_features, pcfg)
    common.write_hf_dir(d, model, cfg)
    log(f"{model_name}: wrote seeded checkpoint {d} (seed {seed})")


# --------------------------------------------------------------------------- kiln steps

def run_logged(cmd: List[str], log_path: Path, timeout: Optional[float]) -> tuple:
    """Run cmd, keep its stdout/stderr in log_path; return (exit code or None, wall s, stdout)."""
    log(shlex.join(cmd))
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError as e:
        log_path.write_text(f"$ {shlex.join(cmd)}\n{e}\n")
        return None, 0.0, ""
    except subprocess.TimeoutExpired as e:
        log_path.write_text(f"$ {shlex.join(cmd)}\ntimed out after {timeout} s\n{e.stdout or ''}{e.stderr or ''}")
        return None, time.perf_counter() - t0, ""
    wall = time.perf_counter() - t0
    log_path.write_text(f"$ {shlex.join(cmd)}\nexit {p.returncode}, {wall:.2f} s\n"
                        f"--- stdout\n{p.stdout}\n--- stderr\n{p.stderr}")
    if p.returncode != 0:
        tail = "\n".join((p.stderr or p.stdout).strip().splitlines()[-8:])
        log(f"exit {p.returncode}; last lines:\n{tail}")
    return p.returncode, wall, p.stdout


def kiln_side(args, model: str, batch: int, ckpt: Path, out: Path) -> Dict[str, Any]:
    """Build and bench one bundle; every failure becomes a 'skipped' reason, never an exception."""
    res: Dict[str, Any] = {"status": "skipped"}
    kiln = Path(args.kiln)
    if args.skip_kiln:
        res["reason"] = "--skip-kiln"
        return res
    if not (kiln.is_file() and os.access(kiln, os.X_OK)):
        res["reason"] = f"no kiln binary at {kiln} (build it: cmake --preset release && cmake --build build)"
        log(f"kiln: {res['reason']}; timing the peers only")
        return res
    bundle = Path(args.work_dir) / "bundles" / f"{model}_b{batch}_fp16.bundle"
    bundle.parent.mkdir(parents=True, exist_ok=True)
    stem = f"{model}_b{batch}"

    rc, build_s, _ = run_logged([str(kiln), "build", str(ckpt), "-o", str(bundle), "--backend", "cuda",
                                 "--precision", "fp16", "--batch", str(batch)],
                                out / f"kiln_build_{stem}.log", args.kiln_timeout)
    res["build_s"] = round(build_s, 3)
    if rc != 0:
        res["reason"] = f"kiln build failed (exit {rc}); see kiln_build_{stem}.log"
        return res

    rc, _, stdout = run_logged([str(kiln), "bench", str(bundle), "--batch", str(batch), "--iterations",
                                str(args.rounds), "--warmup", str(args.warmup), "--json"],
                               out / f"kiln_bench_{stem}.log", args.kiln_timeout)
    if rc != 0:
        res["reason"] = f"kiln bench failed (exit {rc}); see kiln_bench_{stem}.log"
        return res
    try:
        bench = json.loads(stdout)
        entry = bench["results"][0]
        entry["engine_ms"]["median"]
    except (ValueError, KeyError, IndexError, TypeError) as e:
        res["reason"] = f"kiln bench printed no usable JSON ({type(e).__name__}: {e})"
        return res
    (out / f"kiln_bench_{stem}.json").write_text(json.dumps(bench, indent=2) + "\n")
    res.update(status="ok", gpu=bench.get("gpu"), result=entry)
    return res


# --------------------------------------------------------------------------- peers

def peer_side(args, model: str, batch: int, ckpt: Path, out: Path) -> Dict[str, Any]:
    """Run peer_bench.py in its own process (its own CUDA context, as a user's PyTorch would)."""
    path = out / f"peers_{model}_b{batch}.json"
    cmd = [args.python, str(REFERENCE / "peer_bench.py"), "--model-dir", str(ckpt), "--batch", str(batch),
           "--peers", args.peers, "--rounds", str(args.rounds), "--warmup", str(args.warmup), "--out", str(path)]
    cmd += shlex.split(args.peer_args or "")
    log(shlex.join(cmd))
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    try:
        rc = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, timeout=args.peer_timeout).returncode
    except subprocess.TimeoutExpired:
        return {"status": "failed", "reason": f"peer_bench timed out after {args.peer_timeout} s"}
    if rc != 0 or not path.exists():
        return {"status": "failed", "reason": f"peer_bench exit {rc}"}
    return {"status": "ok", **json.loads(path.read_text())}


# --------------------------------------------------------------------------- table

def fmt(v: Optional[float], digits: int = 3) -> str:
    return "—" if v is None else f"{v:.{digits}f}"


def table(rows: List[Dict[str, Any]]) -> str:
    """One line per (model, batch, candidate); kiln's line first, ratios against it."""
    head = ("| model | batch | candidate | median ms | p10–p90 ms | kiln / candidate | kernels/call "
            "| build/compile s | stable |")
    lines = [head, "|" + "---|" * 9]
    for r in rows:
        kiln = r["kiln"]
        k_med = None
        if kiln["status"] == "ok":
            e = kiln["result"]
            k_med = e["engine_ms"]["median"]
            lines.append(f"| {r['model']} | {r['batch']} | kiln engine | {fmt(k_med, 4)} | "
                         f"{fmt(e['engine_ms']['p10'], 4)}–{fmt(e['engine_ms']['p90'], 4)} | 1.00 | "
                         f"{e.get('kernels_per_call', '—')} | {fmt(kiln.get('build_s'), 1)} | "
                         f"{'yes' if e.get('stable') else 'NO'} |")
            task = e.get("task_ms")
            if task:
                lines.append(f"| {r['model']} | {r['batch']} | kiln task (classify, wall) | "
                             f"{fmt(task.get('p50'), 4)} | p95 {fmt(task.get('p95'), 4)} | — | — | — | — |")
        else:
            lines.append(f"| {r['model']} | {r['batch']} | kiln engine | skipped: {kiln['reason']} "
                         f"| | | | {fmt(kiln.get('build_s'), 1)} | |")
        peers = r["peers"]
        if peers["status"] != "ok":
            lines.append(f"| {r['model']} | {r['batch']} | PyTorch peers | failed: {peers['reason']} | | | | | |")
            continue
        for name, p in peers["peers"].items():
            ratio = fmt(k_med / p["median_ms"], 2) if k_med else "—"
            lines.append(f"| {r['model']} | {r['batch']} | torch {name} | {fmt(p['median_ms'], 4)} | "
                         f"{fmt(p['p10_ms'], 4)}–{fmt(p['p90_ms'], 4)} | {ratio} | {p.get('kernels', '—')} | "
                         f"{fmt(p.get('compile_s'), 1)} | {'yes' if p.get('stable') else 'NO'} |")
    return "\n".join(lines)


def header(rows: List[Dict[str, Any]], args) -> str:
    """Where and how the numbers were taken, so the table is never quoted without it."""
    peers = next((r["peers"] for r in rows if r["peers"]["status"] == "ok"), {})
    kiln_gpu = next((r["kiln"].get("gpu") for r in rows if r["kiln"]["status"] == "ok"), None)
    return (f"GPU: {peers.get('gpu', kiln_gpu or '?')}; torch {peers.get('torch', '?')}, "
            f"timm {peers.get('timm', '?')}, CUDA {peers.get('cuda', '?')}, cuDNN {peers.get('cudnn', '?')}; "
            f"fp16, channels_last; {args.warmup} warm-up + {args.rounds} timed rounds per candidate; "
            f"engine time = one call between two CUDA events (docs/benchmarking.md). "
            f"kiln / candidate < 1: kiln is faster.")


# --------------------------------------------------------------------------- main

def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="resnet50", help="comma-separated timm names (default: %(default)s)")
    ap.add_argument("--batches", default="1,32", help="comma-separated batch sizes (default: %(default)s)")
    ap.add_argument("--peers", default="eager,cuda_graph,compile",
                    help="passed to peer_bench.py --peers (default: %(default)s)")
    ap.add_argument("--rounds", type=int, default=200, help="timed rounds, kiln and peers (default: %(default)s)")
    ap.add_argument("--warmup", type=int, default=20, help="warm-up rounds, kiln and peers (default: %(default)s)")
    ap.add_argument("--kiln", default=str(ROOT / "build" / "kiln"), help="kiln binary (default: build/kiln)")
    ap.add_argument("--skip-kiln", action="store_true", help="time the PyTorch peers only")
    ap.add_argument("--out-dir", default=str(ROOT / "out" / "side_by_side"),
                    help="raw JSON, kiln logs and the table go here (default: out/side_by_side)")
    ap.add_argument("--work-dir", default="/tmp/kiln_side_by_side",
                    help="checkpoints and bundles, large and reusable (default: %(default)s)")
    ap.add_argument("--seed", type=int, default=SEED, help="checkpoint weight seed (default: %(default)s)")
    ap.add_argument("--python", default=sys.executable, help="interpreter with torch + timm (default: this one)")
    ap.add_argument("--peer-args", help="extra arguments for peer_bench.py, e.g. '--freezing on'")
    ap.add_argument("--kiln-timeout", type=float, default=1800, help="seconds per kiln step (default: %(default)s)")
    ap.add_argument("--peer-timeout", type=float, help="seconds per peer_bench run (default: none)")
    args = ap.parse_args(argv)
    args.model_list = [m.strip() for m in args.models.split(",") if m.strip()]
    try:
        args.batch_list = [int(b) for b in args.batches.split(",") if b.strip()]
    except ValueError:
        ap.error(f"--batches: expected integers, got {args.batches!r}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    Path(args.work_dir).mkdir(parents=True, exist_ok=True)

    rows = []
    for model in args.model_list:
        ckpt = checkpoint_dir(model, Path(args.work_dir), args.seed, args.python)
        for batch in args.batch_list:
            log(f"=== {model} batch {batch} ===")
            kiln = kiln_side(args, model, batch, ckpt, out)
            peers = peer_side(args, model, batch, ckpt, out)
            rows.append(dict(model=model, batch=batch, checkpoint=str(ckpt), kiln=kiln, peers=peers))

    report = header(rows, args) + "\n\n" + table(rows) + "\n"
    (out / "side_by_side.md").write_text(report)
    (out / "side_by_side.json").write_text(json.dumps(
        dict(argv=sys.argv, rounds=args.rounds, warmup=args.warmup, rows=rows), indent=2) + "\n")
    print(report)
    log(f"wrote {out}/side_by_side.md, side_by_side.json and the raw files")
    failed = [r for r in rows if r["peers"]["status"] != "ok"]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
