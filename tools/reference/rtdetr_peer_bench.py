#!/usr/bin/env python3
"""Time PyTorch peers of a kiln RT-DETR v2 engine: transformers' RTDetrV2ForObjectDetection, fp16,
one batch size, one GPU (issue #12 §5: the side-by-side must say how each peer ran).

Peers (--peers, comma-separated):

    eager                    model(pixel_values=x) every round
    cuda_graph               one eager forward captured in a torch.cuda.CUDAGraph and replayed; the
                             model builds its spatial shapes on the host, so the capture is expected
                             to fail as-is (FIELD-NOTES §7): the error is reported, not hidden
    compile_default          torch.compile(mode="default"), called every round
    compile_reduce_overhead  torch.compile(mode="reduce-overhead") (torch's own CUDA graphs where
                             it can), called every round

The model comes from a Hub-layout directory (config.json + model.safetensors, as
tools/reference/make_fixtures_rtdetr.py --full-size writes it and `kiln build` reads it). Every
peer runs in fp16, eval mode, under torch.no_grad, on one seeded input already on the device.
Timing is tools/reference/peer_bench.py's (and kiln's): per round one call between two CUDA events,
an event synchronize, peers interleaved with a rotating order, warm-up rounds first; median,
p10/p90 and the stability rule. A peer that cannot be prepared is reported with its error and
left out of the timing. Kernels per call: torch.profiler's kernel events of one call (graph
nodes for the cuda_graph peer when it captures).

Example (on the GPU machine):
    python3 tools/reference/rtdetr_peer_bench.py --model-dir /tmp/r18vd --batch 1 --out peers_b1.json
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

import peer_bench as pb  # noqa: E402

# --peers name -> (torch.compile mode or None, captured by us in a CUDA graph)
PEERS = {
    "eager": (None, False),
    "cuda_graph": (None, True),
    "compile_default": ("default", False),
    "compile_reduce_overhead": ("reduce-overhead", False),
}
HOW = {
    "eager": "transformers eager forward every round",
    "cuda_graph": "eager forward captured once in torch.cuda.CUDAGraph, replayed every round",
    "compile_default": "torch.compile(mode='default'), compiled module called every round",
    "compile_reduce_overhead": "torch.compile(mode='reduce-overhead'): torch's CUDA graphs where it can, called every round",
}


class Outputs(torch.nn.Module):
    """The detector as a tensor function: pixel_values -> (logits, pred_boxes)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x):
        o = self.model(pixel_values=x)
        return o.logits, o.pred_boxes


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-dir", required=True, help="Hub-layout RTDetrV2ForObjectDetection directory")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--peers", default="eager,compile_default,compile_reduce_overhead,cuda_graph",
                    help="cuda_graph last by default: a failed capture must not disturb the others")
    ap.add_argument("--rounds", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", help="write the JSON here (also printed)")
    args = ap.parse_args(argv)
    names = [p for p in args.peers.split(",") if p]
    for n in names:
        if n not in PEERS:
            ap.error(f"unknown peer {n!r} (known: {', '.join(PEERS)})")

    import transformers
    from transformers import RTDetrV2ForObjectDetection

    model = RTDetrV2ForObjectDetection.from_pretrained(args.model_dir).eval()
    model = model.to(device="cuda", dtype=torch.float16)
    module = Outputs(model).eval()
    h = w = 640
    proc = os.path.join(args.model_dir, "preprocessor_config.json")
    if os.path.exists(proc):
        size = json.load(open(proc)).get("size", {})
        h, w = int(size.get("height", h)), int(size.get("width", w))
    g = torch.Generator().manual_seed(args.seed)
    x = torch.rand(args.batch, 3, h, w, generator=g).to(device="cuda", dtype=torch.float16)

    result = {"model_dir": args.model_dir, "batch": args.batch, "input": [args.batch, 3, h, w], "dtype": "float16",
              "rounds": args.rounds, "warmup": args.warmup, "torch": torch.__version__,
              "transformers": transformers.__version__, "gpu": torch.cuda.get_device_name(), "gpu_state": pb.gpu_state(),
              "peers": {}}
    ready = []
    with torch.no_grad():
        for n in names:
            mode, graphed = PEERS[n]
            peer = pb.Peer(n, n, mode, graphed)
            try:
                pb.prepare_peer(peer, module, x)
                ready.append(peer)
                result["peers"][n] = {"how": HOW[n], "prepare_s": round(peer.compile_s, 2)}
            except Exception as e:  # the report says which peer could not run, and why
                msg = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:400]
                pb.log(f"{n}: could not be prepared ({msg})")
                result["peers"][n] = {"how": HOW[n], "error": msg, "traceback_tail": traceback.format_exc()[-1200:]}
                try:
                    torch.cuda.synchronize()
                except Exception:
                    pass
        if ready:
            pb.time_interleaved(ready, args.warmup, args.rounds)
            for peer in ready:
                result["peers"][peer.key].update(pb.summarize(peer.times_ms))
                try:
                    result["peers"][peer.key].update(pb.count_kernels(peer))
                except Exception as e:
                    result["peers"][peer.key]["kernels_error"] = f"{type(e).__name__}: {e}"[:300]
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    for n, r in result["peers"].items():
        line = f"{n}: error ({r['error']})" if "error" in r else f"{n}: median {r['median_ms']:.3f} ms, kernels {r.get('kernels')}"
        pb.log(line)
    return 0 if ready else 1


if __name__ == "__main__":
    sys.exit(main())
