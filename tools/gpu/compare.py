#!/usr/bin/env python3
"""Compares kiln outputs (.npy) with PyTorch references and applies issue #3's bars.

  compare.py --kind fp32 --got logits.npy --want ref.npy     max|diff| <= 1e-3 * max|ref|
  compare.py --kind fp16 --got logits.npy --want ref.npy     cosine >= 0.9995 and same top-1
Prints one JSON line; exit code 1 when the bar is missed.
"""
import argparse
import json
import sys

import numpy as np


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--kind", choices=["fp32", "fp16"], required=True)
    ap.add_argument("--got", required=True)
    ap.add_argument("--want", required=True)
    ap.add_argument("--label", default="")
    a = ap.parse_args()
    got, want = np.load(a.got).astype(np.float64), np.load(a.want).astype(np.float64)
    rel = float(np.abs(got - want).max() / np.abs(want).max())
    cos = [float(np.dot(g, w) / (np.linalg.norm(g) * np.linalg.norm(w))) for g, w in zip(got, want)]
    top_same = (got.argmax(1) == want.argmax(1)).tolist()
    srt = np.sort(want, axis=1)
    margins = (srt[:, -1] - srt[:, -2]).tolist()
    ok = rel <= 1e-3 if a.kind == "fp32" else (min(cos) >= 0.9995 and all(top_same))
    print(json.dumps({"label": a.label, "kind": a.kind, "max_diff_rel": rel, "min_cosine": min(cos),
                      "top1_same": top_same, "ref_top1_margin": margins, "pass": ok}))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
