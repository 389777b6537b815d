#!/usr/bin/env python3
"""Time PyTorch peers of a kiln engine: one timm classifier, one batch size, one GPU.

Peers (choose with --peers, comma-separated):

    eager             model(x) every round: what a plain PyTorch user runs
    cuda_graph        one eager forward captured in a torch.cuda.CUDAGraph, replayed
    compile           torch.compile(mode="max-autotune-no-cudagraphs"), then captured in a
                      CUDA graph and replayed (JSON key "compile_max_autotune")
    compile_default   torch.compile(mode="default"), captured and replayed the same way

Every peer runs in fp16, channels_last, eval mode, under torch.no_grad, on one seeded
input already on the device. The timing method is kiln's own (docs/benchmarking.md): per round,
one call (a graph replay, or one eager forward) between two CUDA events on the current stream,
then an event synchronize; warm-up rounds first; the peers are interleaved round by round so
clock and thermal drift hit them all alike; median, p10 and p90 over the timed rounds.

Kernels per call are counted after all timing (so the profiler cannot disturb it): for eager,
the CUDA kernel events torch.profiler records during one forward; for graph peers, the kernel
nodes of the captured graph (read through cuda-python), or, where that API is missing, the
kernel events of one profiled replay.

The model comes from a local timm-layout directory (config.json + model.safetensors, as
tools/reference/make_fixtures.py and `kiln build` read it) or from a timm name with seeded random
weights (tools/reference/common.py randomizes every parameter and BatchNorm statistic).

Examples (on the GPU machine):
    PYTHONUNBUFFERED=1 python3 tools/reference/peer_bench.py --timm-name resnet50 --batch 1 \\
        --peers eager,cuda_graph --rounds 100 --json
    python3 tools/reference/peer_bench.py --model-dir /tmp/fullsize/resnet50 --batch 32 \\
        --peers eager,cuda_graph,compile --out peers_resnet50_b32.json
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import common  # noqa: E402

# --peers name -> (JSON key, torch.compile mode or None, replayed from a CUDA graph)
PEERS = {
    "eager": ("eager", None, False),
    "cuda_graph": ("cuda_graph", None, True),
    "compile": ("compile_max_autotune", "max-autotune-no-cudagraphs", True),
    "compile_max_autotune": ("compile_max_autotune", "max-autotune-no-cudagraphs", True),
    "compile_default": ("compile_default", "default", True),
}

# TRTMC's stability rule (FIELD-NOTES §1), applied to the timed rounds as kiln applies it.
STABLE_WINDOW = 5
STABLE_TOLERANCE = 0.05


def log(msg: str) -> None:
    """Progress goes to stderr so that --json output on stdout stays parseable."""
    print(f"[peer_bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- model

def load_model(args) -> tuple:
    """Return (fp32 CPU model in eval mode, input size [C, H, W], description dict).

    A model directory is loaded exactly as timm would build it from config.json, so the peers
    run the same weights kiln builds its bundle from; a bare timm name gets seeded random
    weights, which time the same as trained ones but need no download.
    """
    import timm

    if args.model_dir:
        d = Path(args.model_dir)
        with open(d / "config.json") as f:
            cfg = json.load(f)
        arch = cfg["architecture"]
        model = timm.create_model(arch, pretrained=False, num_classes=cfg["num_classes"],
                                  **cfg.get("model_args", {}))
        common.load_safetensors_into(model, d / "model.safetensors")
        input_size = cfg.get("pretrained_cfg", {}).get("input_size", [3, 224, 224])
        source = {"model_dir": str(d)}
    else:
        arch = args.timm_name
        model = timm.create_model(arch, pretrained=False)
        common.randomize_(model, args.seed)
        input_size = list(model.pretrained_cfg.get("input_size", (3, 224, 224)))
        source = {"timm_name": arch, "weights": f"seeded random (seed {args.seed})"}
    if args.image_size:
        input_size = [input_size[0], args.image_size, args.image_size]
    model.eval()
    return model, [int(v) for v in input_size], dict(architecture=arch, **source)


def to_device_fp16(model: torch.nn.Module) -> torch.nn.Module:
    """fp16 weights in channels_last: the layout cuDNN's fastest fp16 convolutions want."""
    return model.to(device="cuda", dtype=torch.float16, memory_format=torch.channels_last).eval()


# --------------------------------------------------------------------------- peers

def new_graph() -> tuple:
    """A CUDAGraph that keeps its cudaGraph_t, so its kernel nodes can be counted later.

    keep_graph exists from torch 2.7 on; older versions still time correctly, they only fall
    back to the profiler for the kernel count.
    """
    try:
        return torch.cuda.CUDAGraph(keep_graph=True), True
    except TypeError:
        return torch.cuda.CUDAGraph(), False


def capture(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, warmup: int = 3) -> tuple:
    """Capture one call of fn(x) in a CUDA graph.

    The warm-up calls run on a side stream before capture, as torch's documentation asks:
    they let cuDNN pick its algorithms and the caching allocator settle, so nothing is
    allocated or autotuned inside the capture.
    """
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            fn(x)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph, kept = new_graph()
    with torch.cuda.graph(graph):
        out = fn(x)
    if kept:
        graph.instantiate()
    torch.cuda.synchronize()
    return graph, kept, out


class Peer:
    """One candidate: a callable that runs one forward, and what it took to prepare it."""

    def __init__(self, name: str, key: str, mode: Optional[str], graphed: bool):
        self.name, self.key, self.mode, self.graphed = name, key, mode, graphed
        self.call: Callable[[], Any] = lambda: None
        self.fn: Optional[Callable[[torch.Tensor], torch.Tensor]] = None
        self.output: Optional[torch.Tensor] = None
        self.graph = None
        self.graph_kept = False
        self.compile_s = 0.0
        self.times_ms: List[float] = []


def prepare_peer(peer: Peer, module: torch.nn.Module, x: torch.Tensor) -> None:
    """Make peer.call ready to time; peer.compile_s is the wall time this took.

    compile_s covers everything before the first timed round: for eager the first forwards
    (cuDNN autotuning when --cudnn-benchmark is on), for graph peers warm-up and capture, for
    torch.compile peers the compilation (first call) as well.
    """
    t0 = time.perf_counter()
    fn: Callable[[torch.Tensor], torch.Tensor] = module
    if peer.mode is not None:
        fn = torch.compile(module, mode=peer.mode)
        log(f"{peer.key}: compiling (mode={peer.mode}); max-autotune takes minutes")
        fn(x)
        torch.cuda.synchronize()
        log(f"{peer.key}: compiled in {time.perf_counter() - t0:.1f} s")
    # Hold the (compiled) module: a captured graph reads its weights by address, and a compiled
    # peer's private copy would otherwise be freed here and its memory reused (seen: NaN logits).
    peer.fn = fn
    if peer.graphed:
        peer.graph, peer.graph_kept, peer.output = capture(fn, x)
        peer.call = peer.graph.replay
    else:
        for _ in range(3):
            peer.output = fn(x)
        torch.cuda.synchronize()
        peer.call = lambda: fn(x)
    peer.compile_s = time.perf_counter() - t0
    log(f"{peer.key}: ready in {peer.compile_s:.1f} s")


# --------------------------------------------------------------------------- timing

def time_interleaved(peers: List[Peer], warmup: int, rounds: int) -> None:
    """Per round, time one call of each peer between two CUDA events, in turn.

    The order rotates every round so that no peer always runs right after another one's
    (cache state, clocks); the event synchronize after each call keeps calls from overlapping,
    as in kiln's engine timing.
    """
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    stream = torch.cuda.current_stream()
    total = warmup + rounds
    for r in range(total):
        k = r % len(peers)
        for peer in peers[k:] + peers[:k]:
            start.record(stream)
            peer.call()
            end.record(stream)
            end.synchronize()
            if r >= warmup:
                peer.times_ms.append(start.elapsed_time(end))
        if (r + 1) % 50 == 0 or r + 1 == total:
            log(f"round {r + 1}/{total} ({'warm-up' if r < warmup else 'timed'})")


def summarize(times_ms: List[float]) -> Dict[str, Any]:
    """Median and p10/p90 (linear interpolation) plus TRTMC's stability rule on the same rounds."""
    t = np.asarray(times_ms, dtype=np.float64)
    med = float(np.median(t))
    first = float(np.median(t[:STABLE_WINDOW]))
    last = float(np.median(t[-STABLE_WINDOW:]))
    return {
        "median_ms": med,
        "p10_ms": float(np.percentile(t, 10)),
        "p90_ms": float(np.percentile(t, 90)),
        "min_ms": float(t.min()),
        "rounds": int(t.size),
        "first5_median_ms": first,
        "last5_median_ms": last,
        "within5pct_of_median": float(np.mean(np.abs(t - med) <= STABLE_TOLERANCE * med)),
        "stable": abs(first - last) <= STABLE_TOLERANCE * max(first, last),  # as kiln bench
    }


# --------------------------------------------------------------------------- kernel counts

def profiled_kernels(call: Callable[[], Any]) -> tuple:
    """CUDA kernel events of one call, from torch.profiler's trace (category "kernel").

    Reading the exported Chrome trace keeps this independent of the profiler's Python event
    classes, which change between torch versions. Memcpy/memset activities are not kernels.
    """
    import warnings

    from torch.profiler import ProfilerActivity, profile

    warnings.filterwarnings("ignore", message=".*Profiler clears events.*")
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        call()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f).get("traceEvents", [])
    names = [e.get("name", "") for e in events if e.get("cat") == "kernel"]
    return len(names), names


def graph_kernel_nodes(graph) -> Optional[int]:
    """Kernel nodes in a captured graph (child graphs included), or None if not readable.

    This is the count of kernels one replay launches, which is what kiln reports for its
    engine. The profiler would also see the few kernels CUDAGraph.replay() may launch before
    the graph itself (its RNG-state prologue), which are not part of the model.
    """
    try:
        from cuda.bindings import driver as cu
    except ImportError:
        try:
            from cuda import cuda as cu  # cuda-python < 12.6
        except ImportError:
            return None

    def check(res):
        err, *rest = res
        if err != cu.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"CUDA driver error {err}")
        return rest

    def count(g) -> int:
        (_, n) = check(cu.cuGraphGetNodes(g, 0))
        if n == 0:
            return 0
        (nodes, _) = check(cu.cuGraphGetNodes(g, n))
        total = 0
        for node in nodes:
            (kind,) = check(cu.cuGraphNodeGetType(node))
            if kind == cu.CUgraphNodeType.CU_GRAPH_NODE_TYPE_KERNEL:
                total += 1
            elif kind == cu.CUgraphNodeType.CU_GRAPH_NODE_TYPE_GRAPH:
                (child,) = check(cu.cuGraphChildGraphNodeGetGraph(node))
                total += count(child)
        return total

    try:
        check(cu.cuInit(0))
        return count(cu.CUgraph(graph.raw_cuda_graph()))
    except Exception as e:  # a count is a report, never a reason to lose the timings
        log(f"graph node count unavailable ({type(e).__name__}: {e}); using the profiler")
        return None


def count_kernels(peer: Peer) -> Dict[str, Any]:
    """Kernels per call for one peer, and how they were counted."""
    n_prof, names = profiled_kernels(peer.call)
    res: Dict[str, Any] = {"kernels_profiler": n_prof}
    nodes = graph_kernel_nodes(peer.graph) if peer.graphed and peer.graph_kept else None
    if nodes is not None:
        res.update(kernels=nodes, kernels_method="cuda graph kernel nodes")
    else:
        res.update(kernels=n_prof, kernels_method="torch.profiler kernel events of one call")
    if peer.key == "eager":
        res["top_kernels"] = sorted(((names.count(n), n[:80]) for n in set(names)), reverse=True)[:5]
    return res


# --------------------------------------------------------------------------- environment

def gpu_state() -> Dict[str, Any]:
    """Clocks, temperature and power as found (read only: METHOD.md says never to set them)."""
    fields = "clocks.sm,clocks.mem,clocks.max.sm,temperature.gpu,power.draw,driver_version"
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=20, check=True).stdout
        lines = out.splitlines()
        line = lines[torch.cuda.current_device()] if len(lines) > torch.cuda.current_device() else lines[0]
        vals = [v.strip() for v in line.split(",")]
        return dict(zip(fields.split(","), vals))
    except Exception as e:
        return {"error": f"{type(e).__name__}: {e}"}


def output_check(out: torch.Tensor, ref: torch.Tensor) -> Dict[str, Any]:
    """||out - ref|| / ||ref|| in fp32 over the finite entries, and how many entries are finite.

    A broken capture or compile shows up as an O(1) error or as non-finite outputs; the two
    are reported apart so that one overflow does not hide how close the rest is.
    """
    a, b = out.float(), ref.float()
    ok = torch.isfinite(a) & torch.isfinite(b)
    err = (a[ok] - b[ok]).norm() / b[ok].norm().clamp_min(1e-30) if ok.any() else torch.tensor(float("nan"))
    return {"rel_err_vs_eager": float(err), "finite_frac": float(torch.isfinite(a).float().mean()),
            "max_abs": float(a[torch.isfinite(a)].abs().max()) if torch.isfinite(a).any() else None}


# --------------------------------------------------------------------------- main

def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--model-dir", help="timm-layout checkpoint directory (config.json + model.safetensors)")
    src.add_argument("--timm-name", help="timm architecture name, built with seeded random weights")
    ap.add_argument("--batch", type=int, default=1, help="batch size (default: %(default)s)")
    ap.add_argument("--peers", default="eager,cuda_graph,compile",
                    help=f"comma-separated, from {', '.join(PEERS)} (default: %(default)s)")
    ap.add_argument("--rounds", type=int, default=200, help="timed rounds per peer (default: %(default)s)")
    ap.add_argument("--warmup", type=int, default=20,
                    help="untimed rounds before them, after capture/compile (default: %(default)s)")
    ap.add_argument("--tf32", choices=["on", "off"], default="off",
                    help="TF32 in fp32 matmuls/convs; irrelevant to fp16 math, kept off like kiln's "
                         "fp32 builds (default: %(default)s)")
    ap.add_argument("--cudnn-benchmark", choices=["on", "off"], default="on",
                    help="let cuDNN time its algorithms, as a user after speed would (default: %(default)s)")
    ap.add_argument("--freezing", choices=["on", "off"], default="off",
                    help="torch._inductor.config.freezing for the compile peers (folds BatchNorm and "
                         "constants; not torch.compile's default) (default: %(default)s)")
    ap.add_argument("--image-size", type=int, help="override the checkpoint's input height = width")
    ap.add_argument("--seed", type=int, default=0, help="seed for random weights and the input (default: %(default)s)")
    ap.add_argument("--no-kernel-count", action="store_true", help="skip the profiler pass")
    ap.add_argument("--json", action="store_true", help="print the result JSON on stdout")
    ap.add_argument("--out", help="write the result JSON to this file")
    args = ap.parse_args(argv)
    names = [p.strip() for p in args.peers.split(",") if p.strip()]
    unknown = [p for p in names if p not in PEERS]
    if unknown or not names:
        ap.error(f"--peers: unknown {unknown}; choose from {', '.join(PEERS)}")
    if args.rounds < 2 * STABLE_WINDOW:
        ap.error(f"--rounds must be at least {2 * STABLE_WINDOW}")
    args.peer_names = list(dict.fromkeys(PEERS[p][0] for p in names))  # dedupe aliases, keep order
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        log("no CUDA device: peers are GPU timings, nothing to do")
        return 3
    import timm

    common.seed_everything(args.seed)
    torch.backends.cuda.matmul.allow_tf32 = args.tf32 == "on"
    torch.backends.cudnn.allow_tf32 = args.tf32 == "on"
    torch.backends.cudnn.benchmark = args.cudnn_benchmark == "on"
    if args.freezing == "on":
        import torch._inductor.config as inductor_config
        inductor_config.freezing = True

    model_cpu, input_size, source = load_model(args)
    model = to_device_fp16(model_cpu).requires_grad_(False)
    del model_cpu
    gen = torch.Generator(device="cuda").manual_seed(args.seed + 1)
    log(f"{source['architecture']} batch {args.batch} input {input_size} on {torch.cuda.get_device_name()}")

    result: Dict[str, Any] = {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "timm": timm.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
        "model": source["architecture"],
        "source": source,
        "batch": args.batch,
        "input_shape": [args.batch] + input_size,
        "dtype": "fp16",
        "memory_format": "channels_last",
        "tf32": args.tf32 == "on",
        "cudnn_benchmark": args.cudnn_benchmark == "on",
        "inductor_freezing": args.freezing == "on",
        "rounds": args.rounds,
        "warmup": args.warmup,
        "interleaved": True,
        "timed_region": "one call (eager forward or CUDA graph replay) between two CUDA events "
                        "on the current stream, event synchronize after each round",
        "gpu_state_before": gpu_state(),
        "peers": {},
    }

    # no_grad rather than inference_mode: torch.compile and graph capture are best trodden there.
    with torch.no_grad():
        # N(0,1) input, already "normalized": never zeros (METHOD.md), same for every peer.
        x = torch.randn([args.batch] + input_size, generator=gen, device="cuda", dtype=torch.float32)
        x = x.to(torch.float16).contiguous(memory_format=torch.channels_last)

        peers = []
        for key in args.peer_names:
            _, mode, graphed = next(v for v in PEERS.values() if v[0] == key)
            peer = Peer(key, key, mode, graphed)
            # A private module per compiled peer keeps one mode's dynamo caches from the other's.
            prepare_peer(peer, copy.deepcopy(model) if mode else model, x)
            peers.append(peer)

        log(f"timing {', '.join(p.key for p in peers)}: {args.warmup} warm-up + {args.rounds} rounds, interleaved")
        time_interleaved(peers, args.warmup, args.rounds)

        # Output check: every peer's output after one more call, against eager fp16; for compiled
        # peers also the compiled function called directly, to tell a compile from a capture fault.
        ref = model(x).float()
        result["eager_output"] = {"finite_frac": float(torch.isfinite(ref).float().mean()),
                                  "max_abs": float(ref[torch.isfinite(ref)].abs().max())}
        for peer in peers:
            out = peer.call()
            torch.cuda.synchronize()
            entry = summarize(peer.times_ms)
            entry.update(compile_s=round(peer.compile_s, 3), mode=peer.mode, cuda_graph=peer.graphed)
            entry.update(output_check(peer.output if peer.graphed else out, ref))
            if peer.mode is not None:
                entry["rel_err_uncaptured_vs_eager"] = output_check(peer.fn(x), ref)["rel_err_vs_eager"]
            result["peers"][peer.key] = entry

        if not args.no_kernel_count:
            for peer in peers:
                result["peers"][peer.key].update(count_kernels(peer))

    result["gpu_state_after"] = gpu_state()
    for key, e in result["peers"].items():
        log(f"{key:>22}: median {e['median_ms']:.4f} ms (p10 {e['p10_ms']:.4f}, p90 {e['p90_ms']:.4f}) "
            f"kernels {e.get('kernels', '-')} compile {e['compile_s']:.1f} s "
            f"{'stable' if e['stable'] else 'UNSTABLE'} rel_err {e['rel_err_vs_eager']:.1e} "
            f"finite {e['finite_frac']:.3f}")

    text = json.dumps(result, indent=2)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text + "\n")
        log(f"wrote {args.out}")
    if args.json or not args.out:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
