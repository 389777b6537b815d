#!/usr/bin/env python3
"""Where a regress case lost its time: layer by layer, old bundle against new.

  bench/regress_diff.py OLD_INSPECT NEW_INSPECT OLD_BENCH NEW_BENCH [--top N]

OLD_/NEW_INSPECT: `kiln inspect BUNDLE --json` of the two bundles (one kiln reads both, so
the tactic column is read the same way); OLD_/NEW_BENCH: `kiln bench BUNDLE --json --profile N`
(each layer run on its own, N rounds). Prints the total of each profile, the layers whose
tactic differs, and the N layers whose time changed most, with both tactics. bench/regress.sh
runs it for every case over its limit.
"""
import argparse
import json


def layers(inspect_path, bench_path):
    insp = json.load(open(inspect_path))
    tactic = {l["name"]: l.get("tactic", "") for l in insp.get("layers", [])}
    op = {l["name"]: l.get("op", "") for l in insp.get("layers", [])}
    prof = json.load(open(bench_path))["results"][0].get("profile")
    if prof is None:
        raise SystemExit(f"{bench_path}: no per-layer profile (run kiln bench with --profile N)")
    ms = {l["name"]: l["ms"] for l in prof["layers"]}
    return tactic, op, ms, prof["total_ms"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("old_inspect")
    ap.add_argument("new_inspect")
    ap.add_argument("old_bench")
    ap.add_argument("new_bench")
    ap.add_argument("--top", type=int, default=15)
    a = ap.parse_args()
    ot, oop, oms, otot = layers(a.old_inspect, a.old_bench)
    nt, nop, nms, ntot = layers(a.new_inspect, a.new_bench)
    print(f"per-layer profile total: old {otot:.4f} ms, new {ntot:.4f} ms ({(ntot / otot - 1) * 100 if otot else 0:+.2f}%)")
    only_old = sorted(set(oms) - set(nms))
    only_new = sorted(set(nms) - set(oms))
    if only_old:
        print("steps only in old:", ", ".join(only_old))
    if only_new:
        print("steps only in new:", ", ".join(only_new))
    changed = [n for n in sorted(set(ot) & set(nt)) if ot[n] != nt[n]]
    print(f"{len(changed)} layer(s) with another tactic")
    rows = []
    for n in set(oms) & set(nms):
        rows.append((nms[n] - oms[n], n))
    rows.sort(key=lambda r: -abs(r[0]))
    print(f"{'layer':36} {'op':10} {'old ms':>9} {'new ms':>9} {'delta us':>9}  tactic old -> new")
    for d, n in rows[: a.top]:
        t = ot.get(n, "")
        t2 = nt.get(n, "")
        tac = t if t == t2 else f"{t} -> {t2}"
        print(f"{n:36} {nop.get(n, oop.get(n, '')):10} {oms[n]:9.4f} {nms[n]:9.4f} {d * 1000:+9.2f}  {tac}")
    for n in changed:
        if n not in dict((r[1], 0) for r in rows[: a.top]):
            print(f"{n:36} {nop.get(n, ''):10} {oms.get(n, float('nan')):9.4f} {nms.get(n, float('nan')):9.4f} "
                  f"{(nms.get(n, 0) - oms.get(n, 0)) * 1000:+9.2f}  {ot[n]} -> {nt[n]}")


if __name__ == "__main__":
    main()
