#!/usr/bin/env bash
# Must-not-regress bench (issue #10): two kiln binaries, the same models, one GPU job.
#   bench/regress.sh OLD_KILN NEW_KILN OUTDIR [MODEL...]
# MODEL: timm names (default: resnet50 res2net50_26w_4s efficientnet_b0), made as seeded
# full-size checkpoints by tools/reference/make_fixtures*.py (needs torch + timm). For each model
# and batch (KILN_REGRESS_BATCHES, default "1 32"), each binary builds its own fp16 bundle at opt
# level 3 (tactic cache off: both time every layer afresh), then the bundles are benched back to
# back, alternating old/new twice (old, new, old, new). A case's time is the mean of its two
# `kiln bench` engine medians. Writes OUTDIR/regress.json and a table; exits 1 when any case of
# NEW is more than KILN_REGRESS_LIMIT percent (default 3) slower than OLD; each such case is then
# profiled layer by layer in both bundles (bench/regress_diff.py: OUTDIR/diff_MODEL_bB.txt).
# KILN_REGRESS_REBUILD=1 also builds NEW's bundle a second time (tag new2, benched in the same
# alternation) and reports, per case, how many layers the rebuild gave another tactic and how far
# its time moved: how reproducible tactic selection is (OUTDIR/rebuild.json).
# Here (no GPU): build OLD from a git worktree at the old commit
#   git worktree add /work/wt/base REV && (cd /work/wt/base && cp -r /work/main/third_party . &&
#     cmake -S . -B build-cuda -G Ninja -DCMAKE_BUILD_TYPE=Release && cmake --build build-cuda --target kiln)
#   KILN_BASE_KILN=/work/wt/base/build-cuda/kiln tools/gpu/pack.sh   # packs it as bin/kiln-base
# then on the GPU machine: bench/regress.sh $work/bin/kiln-base $work/bin/kiln OUT
set -uo pipefail
cd "$(dirname "$0")/.."
old=${1:?OLD_KILN}; new=${2:?NEW_KILN}; out=${3:?OUTDIR}; shift 3
models=${*:-resnet50 res2net50_26w_4s efficientnet_b0}
batches=${KILN_REGRESS_BATCHES:-1 32}
work=${KILN_REGRESS_WORK:-/tmp/kiln_regress}
mkdir -p "$out" "$work/full"
for m in $models; do
  [ -d "$work/full/$m" ] && continue
  case $m in
    res2net*|res2next*) script=make_fixtures_res2net.py ;;
    *efficientnet*) script=make_fixtures_efficientnet.py ;;
    *) script=make_fixtures.py ;;
  esac
  extra="--models $m"; [ $script = make_fixtures.py ] && extra=""
  env -u LD_LIBRARY_PATH python3 tools/reference/$script --full-size "$work/full" $extra >> "$out/fixtures.log" 2>&1 ||
    { echo "regress: could not make $m (see $out/fixtures.log)" >&2; exit 2; }
done
status=0
tags="old new"; [ "${KILN_REGRESS_REBUILD:-0}" = 1 ] && tags="old new new2"
for m in $models; do
  for b in $batches; do
    for tag in $tags; do
      bin=$old; [ $tag != old ] && bin=$new
      $bin build "$work/full/$m" -o "$work/$m.b$b.$tag.bundle" --backend cuda --precision fp16 --batch $b --opt-level 3 \
        --tactic-cache off > "$out/build_${m}_b${b}_$tag.log" 2>&1 || { echo "regress: $tag build of $m b$b failed" >&2; status=2; }
    done
    for round in 1 2; do
      for tag in $tags; do
        bin=$old; [ $tag != old ] && bin=$new
        $bin bench "$work/$m.b$b.$tag.bundle" --batch $b --json > "$out/bench_${m}_b${b}_${tag}_r$round.json" 2>/dev/null ||
          { echo "regress: $tag bench of $m b$b failed" >&2; status=2; }
      done
    done
  done
done
python3 - "$out" "${KILN_REGRESS_LIMIT:-3}" "$models" "$batches" <<'PY' || status=1
import json, os, sys
out, limit, models, batches = sys.argv[1], float(sys.argv[2]), sys.argv[3].split(), sys.argv[4].split()
rows, worst = [], None
def ms(m, b, tag, r):
    p = os.path.join(out, f"bench_{m}_b{b}_{tag}_r{r}.json")
    return json.load(open(p))["results"][0]["engine_ms"]["median"]
print(f"{'model':20} {'batch':>5} {'old ms':>9} {'new ms':>9} {'change':>8}   (runs old: a/b, new: a/b)")
for m in models:
    for b in batches:
        try:
            o = [ms(m, b, "old", r) for r in (1, 2)]
            n = [ms(m, b, "new", r) for r in (1, 2)]
        except (OSError, KeyError, ValueError, IndexError) as e:
            print(f"{m:20} {b:>5} missing result: {e}"); rows.append({"model": m, "batch": int(b), "error": str(e)}); continue
        mo, mn = sum(o) / 2, sum(n) / 2
        ch = (mn / mo - 1) * 100
        rows.append({"model": m, "batch": int(b), "old_ms": mo, "new_ms": mn, "change_pct": ch, "old_runs": o, "new_runs": n})
        print(f"{m:20} {b:>5} {mo:9.4f} {mn:9.4f} {ch:+7.2f}%   ({o[0]:.4f}/{o[1]:.4f}, {n[0]:.4f}/{n[1]:.4f})")
bad = [r for r in rows if "error" in r or r["change_pct"] > limit]
json.dump({"limit_pct": limit, "cases": rows, "pass": not bad}, open(os.path.join(out, "regress.json"), "w"), indent=1)
print("PASS" if not bad else f"FAIL: {len(bad)} case(s) over {limit}% slower or missing")
open(os.path.join(out, "over_limit.txt"), "w").write("".join(f"{r['model']} {r['batch']}\n" for r in bad if "error" not in r))
sys.exit(1 if bad else 0)
PY
if [ "${KILN_REGRESS_REBUILD:-0}" = 1 ]; then
  for m in $models; do
    for b in $batches; do
      for tag in new new2; do $new inspect "$work/$m.b$b.$tag.bundle" --json > "$out/inspect_${m}_b${b}_$tag.json" 2>/dev/null; done
    done
  done
  python3 - "$out" "$models" "$batches" <<'PY'
import json, os, sys
out, models, batches = sys.argv[1], sys.argv[2].split(), sys.argv[3].split()
rows = []
print(f"{'rebuild of new':20} {'batch':>5} {'layers':>6} {'other tactic':>12} {'new ms':>9} {'new2 ms':>9} {'change':>8}")
for m in models:
    for b in batches:
        try:
            t = [{l["name"]: l.get("tactic", "") for l in json.load(open(os.path.join(out, f"inspect_{m}_b{b}_{tag}.json")))["layers"]}
                 for tag in ("new", "new2")]
            ms = [sum(json.load(open(os.path.join(out, f"bench_{m}_b{b}_{tag}_r{r}.json")))["results"][0]["engine_ms"]["median"]
                      for r in (1, 2)) / 2 for tag in ("new", "new2")]
        except (OSError, KeyError, ValueError, IndexError) as e:
            print(f"{m:20} {b:>5} missing result: {e}"); continue
        differ = sorted(n for n in t[0] if t[1].get(n) != t[0][n])
        rows.append({"model": m, "batch": int(b), "layers": len(t[0]), "other_tactic": len(differ), "layers_differing": differ,
                     "new_ms": ms[0], "new2_ms": ms[1], "change_pct": (ms[1] / ms[0] - 1) * 100})
        print(f"{m:20} {b:>5} {len(t[0]):6} {len(differ):12} {ms[0]:9.4f} {ms[1]:9.4f} {rows[-1]['change_pct']:+7.2f}%")
json.dump(rows, open(os.path.join(out, "rebuild.json"), "w"), indent=1)
PY
fi
# Every case over the limit: both bundles profiled layer by layer (KILN_REGRESS_PROFILE rounds,
# default 50) and compared with bench/regress_diff.py (tactics and layer times, old -> new).
while read -r m b; do
  [ -n "$m" ] || continue
  for tag in old new; do
    bin=$old; [ $tag = new ] && bin=$new
    $new inspect "$work/$m.b$b.$tag.bundle" --json > "$out/inspect_${m}_b${b}_$tag.json" 2>/dev/null
    $bin bench "$work/$m.b$b.$tag.bundle" --batch $b --json --profile ${KILN_REGRESS_PROFILE:-50} \
      > "$out/profile_${m}_b${b}_$tag.json" 2>/dev/null
  done
  echo "== $m batch $b, layer by layer"
  python3 bench/regress_diff.py "$out/inspect_${m}_b${b}_old.json" "$out/inspect_${m}_b${b}_new.json" \
    "$out/profile_${m}_b${b}_old.json" "$out/profile_${m}_b${b}_new.json" | tee "$out/diff_${m}_b$b.txt"
done < <(cat "$out/over_limit.txt" 2>/dev/null)
exit $status
