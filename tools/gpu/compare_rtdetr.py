#!/usr/bin/env python3
"""Checks kiln RT-DETR v2 outputs against PyTorch's (issue #12's bars); numpy only.

  compare_rtdetr.py fp32 --got DIR --want PREFIX     logits and boxes max|diff| <= 1e-3 * max|ref|, per query
        after assigning kiln's queries to PyTorch's one to one (a query keeps its index where it
        passes there; reordered queries are counted; strict_pass: by index alone)
  compare_rtdetr.py fp16 --got DIR --want PREFIX     detection rule at --threshold (0.3): the same
        number of detections per image, each reference detection (in score order) matched to a
        distinct one of the same label with IoU >= 0.5 and |score diff| <= 0.05
        (--allowed-unmatched N: up to N per image may go unmatched; strict_pass: none unmatched)
  compare_rtdetr.py finite --got DIR                 no NaN/Inf in logits and boxes (stress inputs)
  compare_rtdetr.py profile --bench BENCH.json       per-layer-group table of `kiln bench --profile`
  compare_rtdetr.py trace --bench BENCH.json         per-layer-group table of `kiln bench --trace`: each
        launch counts from the end of the launch before it (what it adds to the call; PDL overlaps
        spans, docs/benchmarking.md), so the groups sum to the call's span

DIR holds kiln run's logits.npy and pred_boxes.npy; PREFIX names PyTorch's PREFIXlogits.npy and
PREFIXpred_boxes.npy (e.g. MODEL/images_). Post-processing is transformers'
post_process_object_detection (sigmoid, top num_queries of queries x classes, label = index % C,
boxes (cx, cy, w, h) to corners); boxes stay normalized (IoU does not depend on the image size).
Each check prints one JSON line (also appended to --jsonl) and exits 1 when the bar is missed.
"""
import argparse
import json
import sys

import numpy as np


def load(prefix):
    return np.load(prefix + "logits.npy").astype(np.float64), np.load(prefix + "pred_boxes.npy").astype(np.float64)


def rel(got, want):
    return float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))


def detections(logits, boxes, threshold):
    """One image: [(score, label, box corners)], sorted by score (ties: lower index first, as torch.topk)."""
    q, c = logits.shape
    scores = 1.0 / (1.0 + np.exp(-logits.reshape(-1)))
    order = np.lexsort((np.arange(q * c), -scores))[:q]
    out = []
    for i in order:
        if scores[i] <= threshold:
            break
        cx, cy, w, h = boxes[i // c]
        out.append((float(scores[i]), int(i % c), (cx - 0.5 * w, cy - 0.5 * h, cx + 0.5 * w, cy + 0.5 * h)))
    return out


def iou(a, b):
    iw = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    ih = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = iw * ih
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def match(want, got):
    """(reference detections without a match, why the first one failed or the count differs)."""
    if len(want) != len(got):
        return len(want), f"{len(got)} detections, the reference has {len(want)}"
    used = [False] * len(got)
    unmatched, why = 0, ""
    for k, (s, label, box) in enumerate(want):
        best, best_iou = -1, 0.5
        for j, (gs, gl, gb) in enumerate(got):
            if used[j] or gl != label or abs(gs - s) > 0.05:
                continue
            v = iou(box, gb)
            if v >= best_iou:
                best, best_iou = j, v
        if best < 0:
            unmatched += 1
            why = why or f"reference detection {k} (label {label}, score {s:.4f}) has no match"
            continue
        used[best] = True
    return unmatched, why


def emit(args, record):
    line = json.dumps(record)
    print(line)
    if args.jsonl:
        with open(args.jsonl, "a") as f:
            f.write(line + "\n")
    return 0 if record["pass"] else 1


def query_matched_error(gl, gb, wl, wb):
    """Per image, kiln's queries assigned one to one to PyTorch's: a query keeps its index where it is
    within the bar there, the others take the closest unassigned query. Returns (largest error of an
    assigned pair relative to max|ref| of logits / boxes, queries not at their index). Seeded models
    have encoder top-k scores closer than fp32 rounding (min gap 2e-6 on a photo), so two queries can
    swap places while every query is the same."""
    sl, sb = max(np.abs(wl).max(), 1e-30), max(np.abs(wb).max(), 1e-30)
    worst, moved = 0.0, 0
    for i in range(wl.shape[0]):
        cost = np.maximum(np.abs(wl[i][:, None, :] - gl[i][None, :, :]).max(-1) / sl,
                          np.abs(wb[i][:, None, :] - gb[i][None, :, :]).max(-1) / sb)  # [ref query, kiln query]
        q = cost.shape[0]
        used, assigned = np.zeros(q, bool), np.full(q, -1)
        for r in range(q):
            if cost[r, r] <= 1e-3:
                assigned[r], used[r] = r, True
        for r in np.where(assigned < 0)[0]:
            c = np.where(used, np.inf, cost[r])
            assigned[r] = int(c.argmin())
            used[assigned[r]] = True
        worst = max(worst, float(cost[np.arange(q), assigned].max()))
        moved += int((assigned != np.arange(q)).sum())
    return worst, moved


def check_fp32(args):
    gl, gb = load(args.got.rstrip("/") + "/")
    wl, wb = load(args.want)
    rl, rb = rel(gl, wl), rel(gb, wb)
    matched, moved = query_matched_error(gl, gb, wl, wb)
    return emit(args, {"label": args.label, "kind": "fp32", "logits_max_diff_rel": rl, "boxes_max_diff_rel": rb,
                       "query_matched_max_diff_rel": matched, "queries_reordered": moved,
                       "strict_pass": bool(rl <= 1e-3 and rb <= 1e-3), "pass": bool(matched <= 1e-3)})


def check_fp16(args):
    gl, gb = load(args.got.rstrip("/") + "/")
    wl, wb = load(args.want)
    counts, unmatched, why = [], [], ""
    for i in range(wl.shape[0]):
        want, got = detections(wl[i], wb[i], args.threshold), detections(gl[i], gb[i], args.threshold)
        n, problem = match(want, got)
        counts.append(len(want))
        unmatched.append(n)
        if n > args.allowed_unmatched or len(want) != len(got):
            why = why or f"image {i}: {problem}"
    return emit(args, {"label": args.label, "kind": "fp16", "threshold": args.threshold, "detections": counts,
                       "unmatched": unmatched, "allowed_unmatched": args.allowed_unmatched,
                       "logits_max_diff_rel": rel(gl, wl), "boxes_max_diff_rel": rel(gb, wb),
                       "mismatch": why, "strict_pass": not any(unmatched) and not why, "pass": not why})


def check_finite(args):
    gl, gb = load(args.got.rstrip("/") + "/")
    bad = int((~np.isfinite(gl)).sum() + (~np.isfinite(gb)).sum())
    return emit(args, {"label": args.label, "kind": "finite", "non_finite": bad, "pass": bad == 0})


# The per-group tables come from kiln itself: `kiln bench --profile` and `--trace` sum layers into the
# family's groups (Family::layer_groups; RT-DETR v2: input, backbone, AIFI, encoder, query selection,
# decoder, output). These commands print them and write one JSON line.
def profile(args):
    r = json.load(open(args.bench))["results"][0]
    p = r.get("profile")
    if not p:
        return emit(args, {"label": args.label, "kind": "profile", "pass": False, "error": "no profile in the bench JSON"})
    listed = all("kernels" in g for g in p["groups"])
    width = max(len(g["group"]) for g in p["groups"])
    for g in p["groups"]:
        print(f"  {g['group']:<{width}}  {g['ms']:8.4f} ms" + (f"  {g['kernels']:4d} kernels" if listed else ""))
    print(f"  {'sum':<{width}}  {p['total_ms']:8.4f} ms (layers run one by one; engine_ms is the replayed graph)")
    line = {"label": args.label, "kind": "profile", "groups_ms": {g["group"]: g["ms"] for g in p["groups"]},
            "rounds": p.get("rounds"), "engine_ms": r.get("engine_ms"), "kernels_per_call": r.get("kernels_per_call"),
            "pass": True}
    if listed:
        line["groups_kernels"] = {g["group"]: g["kernels"] for g in p["groups"]}
    return emit(args, line)


def trace(args):
    r = json.load(open(args.bench))["results"][0]
    t = r.get("trace")
    if not t or "groups" not in t:
        return emit(args, {"label": args.label, "kind": "trace", "pass": False,
                           "error": (t or {}).get("unavailable", "no trace in the bench JSON")})
    width = max(len(g["group"]) for g in t["groups"])
    for g in t["groups"]:
        print(f"  {g['group']:<{width}}  {g['us']:8.1f} us  {g['launches']:4d} launches")
    print(f"  {'span':<{width}}  {t['span_us']:8.1f} us (engine median {r['engine_ms']['median']:.3f} ms)")
    return emit(args, {"label": args.label, "kind": "trace", "groups_us": {g["group"]: g["us"] for g in t["groups"]},
                       "groups_launches": {g["group"]: g["launches"] for g in t["groups"]},
                       "engine_ms": r.get("engine_ms"), "kernels_per_call": r.get("kernels_per_call"), "pass": True})


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("kind", choices=["fp32", "fp16", "finite", "profile", "trace"])
    ap.add_argument("--got", help="directory with kiln's logits.npy and pred_boxes.npy")
    ap.add_argument("--want", help="prefix of PyTorch's logits.npy / pred_boxes.npy")
    ap.add_argument("--bench", help="kiln bench --json output with --profile (profile) or --trace (trace)")
    ap.add_argument("--threshold", type=float, default=0.3)
    ap.add_argument("--allowed-unmatched", type=int, default=0,
                    help="fp16: reference detections per image that may go unmatched (default 0: the issue's rule)")
    ap.add_argument("--label", default="")
    ap.add_argument("--jsonl", help="also append the JSON line here")
    a = ap.parse_args()
    need = {"fp32": ("got", "want"), "fp16": ("got", "want"), "finite": ("got",), "profile": ("bench",), "trace": ("bench",)}[a.kind]
    for k in need:
        if getattr(a, k) is None:
            ap.error(f"{a.kind} needs --{k}")
    return {"fp32": check_fp32, "fp16": check_fp16, "finite": check_finite, "profile": profile, "trace": trace}[a.kind](a)


if __name__ == "__main__":
    sys.exit(main())
