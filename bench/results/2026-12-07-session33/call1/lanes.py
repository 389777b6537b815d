#!/usr/bin/env python3
"""Per-lane time alone, as kiln's trace_json now computes it (tools/kiln/profile_json.hpp time_alone), from a
`kiln bench --trace --json` file whose spans carry lanes. Call 1's binaries printed an earlier per-lane figure
("adds", each launch's share of the span in start order), which credits the earlier-starting of two overlapping
launches. Usage: python3 lanes.py bench_T.json"""
import json, sys

spans = json.load(open(sys.argv[1]))['results'][0]['trace']['spans']


def alone(k):
    s = spans[k]
    a, b = s['start_us'], s['start_us'] + s['us']
    others = sorted((max(o['start_us'], a), min(o['start_us'] + o['us'], b)) for o in spans
                    if o.get('lane') and o.get('lane') != s.get('lane') and min(o['start_us'] + o['us'], b) > max(o['start_us'], a))
    covered, at = 0.0, a
    for lo, hi in others:
        if hi <= at:
            continue
        covered += hi - max(lo, at)
        at = hi
    return s['us'] - covered


lanes = {}
side = []
for k, s in enumerate(spans):
    l = lanes.setdefault(s.get('lane', ''), [0, 0.0, 0.0])
    t = alone(k)
    l[0] += 1; l[1] += s['us']; l[2] += t
    if s.get('lane') == 'side' and t > 0:
        side.append((t, s['step']))
for name, (n, busy, al) in lanes.items():
    print(f'{name} lane: {n} launches, {busy:.1f} us busy, {al:.1f} us alone')
for t, step in sorted(side, reverse=True)[:8]:
    print(f'  {t:6.2f} us alone  {step}')
