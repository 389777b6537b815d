#!/usr/bin/env python3
"""Max calibration: kiln's activation amax against an external implementation (issue #13 §2).

Two halves, so CI can run the second without torch:

  reference  (needs torch + timm; ModelOpt optional)
      calib_amax_reference.py reference --model-dir M --calib DIR --nodes NODES.json --out REF.json
          [--calib-images 32] [--modelopt]
    Pre-processes the first --calib-images .jpg/.jpeg/.png files directly in DIR (sorted by
    name, the files `kiln build --calib DIR` takes) with timm's own eval transform, runs the
    timm model in fp32, and records for every node named in NODES.json (the quantized layers,
    as `kiln` below lists them) the largest |x| of that module's data input, by a forward
    pre-hook ("torch_hooks"). With --modelopt it also runs NVIDIA ModelOpt's FP8 max
    calibration (`mtq.quantize(model, mtq.FP8_DEFAULT_CFG, loop)`) on a copy of the model
    and records each module's `input_quantizer.amax` ("modelopt").

  kiln       (needs only the kiln binary)
      calib_amax_reference.py kiln --kiln BIN --model-dir M --calib DIR [--calib-images 32]
          [--nodes-out NODES.json] [--reference REF.json --out CMP.json] [--limit 1e-3]
    Builds an FP8 bundle with `--calib-method max` on the CPU backend, reads from
    `kiln inspect --graph` each quantized conv2d/linear and the static scale of its data input
    (amax = scale * 448, printed with 6 significant digits: 5e-6 relative at worst), writes
    the node list, and, given a reference, compares every node's amax with each reference
    source: |kiln - ref| / |ref| <= --limit. Exit status 1 when any node misses the limit or
    is missing on either side.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

E4M3_MAX = 448.0
IMAGE_EXT = (".jpg", ".jpeg", ".png")


def calib_files(d, n):
    files = sorted(f for f in os.listdir(d) if f.lower().endswith(IMAGE_EXT) and os.path.isfile(os.path.join(d, f)))
    if not files:
        sys.exit(f"{d}: no .jpg/.jpeg/.png files")
    return [os.path.join(d, f) for f in files[:n]]


# --- kiln half -------------------------------------------------------------------------------

LINE = re.compile(r'^(%\d+) = (\w+) "([^"]+)"\(([^)]*)\).*?: (\w+)\[[^\]]*\](?: quant\((\w+), scale ([0-9.eE+-]+)\))?')
CONST = re.compile(r'^const (@\S+) : (\w+)\[')


def quantized_inputs(graph_text):
    """{node name: amax of its data input} for every conv2d/linear whose weight is 8-bit."""
    scale_of = {}  # value id -> static scale of an 8-bit value
    eight_bit_consts = set()
    rows = {}
    for line in graph_text.splitlines():
        line = line.strip()
        c = CONST.match(line)
        if c:
            if c.group(2) in ("f8e4m3", "i8"):
                eight_bit_consts.add(c.group(1))
            continue
        m = LINE.match(line)
        if not m:
            continue
        vid, op, name, args, _, qdt, scale = m.groups()
        if qdt:
            scale_of[vid] = float(scale)
        ins = [a.strip() for a in args.split(",")]
        if op in ("conv2d", "linear") and len(ins) > 1 and ins[1] in eight_bit_consts:
            if ins[0] not in scale_of:
                raise SystemExit(f"kiln graph: quantized layer '{name}' reads {ins[0]}, which has no static scale")
            rows[name] = scale_of[ins[0]] * E4M3_MAX
    if not rows:
        raise SystemExit("kiln graph: no quantized conv2d/linear found")
    return rows


def kiln_half(a):
    with tempfile.TemporaryDirectory() as tmp:
        bundle = os.path.join(tmp, "fp8.bundle")
        cmd = [a.kiln, "build", a.model_dir, "-o", bundle, "--backend", "cpu", "--quantize", "fp8", "--calib", a.calib,
               "--calib-images", str(a.calib_images), "--calib-method", "max", "--quiet"]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        text = subprocess.run([a.kiln, "inspect", bundle, "--graph"], check=True, capture_output=True, text=True).stdout
    kiln = quantized_inputs(text)
    if a.nodes_out:
        Path(a.nodes_out).write_text(json.dumps(sorted(kiln), indent=1) + "\n")
    if not a.reference:
        print(json.dumps(kiln, indent=1))
        return 0
    ref = json.load(open(a.reference))
    out = {"model": os.path.basename(os.path.normpath(a.model_dir)), "calib_images": a.calib_images, "limit": a.limit,
           "sources": {}}
    status = 0
    for src, table in ref["sources"].items():
        rows, worst, bad = [], 0.0, []
        for node in sorted(set(kiln) | set(table)):
            if node not in kiln or node not in table:
                bad.append(node)
                rows.append({"node": node, "kiln": kiln.get(node), src: table.get(node), "missing": True})
                continue
            r = abs(kiln[node] - table[node]) / max(abs(table[node]), 1e-30)
            worst = max(worst, r)
            if r > a.limit:
                bad.append(node)
            rows.append({"node": node, "kiln": kiln[node], src: table[node], "rel": r})
        out["sources"][src] = {"layers": len(rows), "worst_rel": worst, "failed": bad, "rows": rows}
        print(f"{out['model']}: {len(rows)} quantized layers, kiln max calibration vs {src}: worst relative "
              f"difference {worst:.2e} (limit {a.limit:g}){'' if not bad else ', FAILED: ' + ', '.join(bad)}")
        if bad:
            status = 1
    if a.out:
        Path(a.out).write_text(json.dumps(out, indent=1) + "\n")
    return status


# --- reference half --------------------------------------------------------------------------

def reference_half(a):
    import torch
    import timm
    from PIL import Image

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from reference_logits import load_model

    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    nodes = json.load(open(a.nodes))
    model, cfg = load_model(a.model_dir)
    data_cfg = timm.data.resolve_data_config({}, model=model, pretrained_cfg=cfg["pretrained_cfg"])
    tf = timm.data.create_transform(**data_cfg)
    images = [tf(Image.open(p).convert("RGB")).unsqueeze(0) for p in calib_files(a.calib, a.calib_images)]
    modules = dict(model.named_modules())
    missing = [n for n in nodes if n not in modules]
    if missing:
        sys.exit(f"{a.model_dir}: kiln layers with no module of that name in timm's model: {missing}")

    amax = {n: 0.0 for n in nodes}

    def hook(name):
        def pre(_, inputs):
            amax[name] = max(amax[name], float(inputs[0].detach().abs().max()))
        return pre

    handles = [modules[n].register_forward_pre_hook(hook(n)) for n in nodes]
    with torch.no_grad():
        for x in images:
            model(x)
    for h in handles:
        h.remove()
    sources = {"torch_hooks": amax}
    notes = {"torch_hooks": "max |input| of each module over the calibration images (forward pre-hooks), fp32, TF32 off"}

    if a.modelopt:
        import copy
        try:
            import modelopt
            import modelopt.torch.quantization as mtq

            q = copy.deepcopy(model)

            def loop(m):
                with torch.no_grad():
                    for x in images:
                        m(x)

            q = mtq.quantize(q, mtq.FP8_DEFAULT_CFG, loop)
            qm = dict(q.named_modules())
            mo = {}
            for n in nodes:
                iq = getattr(qm[n], "input_quantizer", None)
                if iq is not None and getattr(iq, "amax", None) is not None:
                    mo[n] = float(iq.amax.detach().float().max())
            sources["modelopt"] = mo
            notes["modelopt"] = f"nvidia-modelopt {modelopt.__version__}, mtq.FP8_DEFAULT_CFG (max calibration), input_quantizer.amax"
        except Exception as e:  # say why, keep the hooks result
            notes["modelopt"] = f"not run: {type(e).__name__}: {e}"
            print(f"ModelOpt: {notes['modelopt']}", file=sys.stderr)

    import platform
    out = {"model": os.path.basename(os.path.normpath(a.model_dir)), "calib_images": len(images),
           "versions": {"python": platform.python_version(), "torch": torch.__version__, "timm": timm.__version__},
           "notes": notes, "sources": sources}
    Path(a.out).write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    print(f"{a.out}: {len(nodes)} layers, sources {', '.join(sources)}", file=sys.stderr)
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="half", required=True)
    r = sub.add_parser("reference")
    r.add_argument("--model-dir", required=True)
    r.add_argument("--calib", required=True)
    r.add_argument("--calib-images", type=int, default=32)
    r.add_argument("--nodes", required=True)
    r.add_argument("--out", required=True)
    r.add_argument("--modelopt", action="store_true")
    k = sub.add_parser("kiln")
    k.add_argument("--kiln", required=True)
    k.add_argument("--model-dir", required=True)
    k.add_argument("--calib", required=True)
    k.add_argument("--calib-images", type=int, default=32)
    k.add_argument("--nodes-out")
    k.add_argument("--reference")
    k.add_argument("--out")
    k.add_argument("--limit", type=float, default=1e-3)
    a = ap.parse_args()
    return reference_half(a) if a.half == "reference" else kiln_half(a)


if __name__ == "__main__":
    sys.exit(main())
