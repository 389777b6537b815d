#!/usr/bin/env bash
# Per-kernel GPU times of one engine call, on the GPU machine (after tools/gpu/pack.sh here, .gpu
# carried): builds a seeded full-size model at the given batch and runs `kiln bench` under Nsight
# Systems with CUDA-graph node tracing, then sums kernel time by kernel name and lists the
# kernels of one replay in order. Falls back to `kiln bench --profile` (layers timed one by one)
# where nsys is missing (and `kiln bench --trace`, CUPTI in the graph replay). KILN_BUILD_FLAGS adds `kiln build` flags (e.g. "--disable window_conv",
# or "--quantize fp8 --calib tests/fixtures/images/images"); KILN_PROFILE_TAG names that variant's
# files (bundle, build log, kernels_TAG.txt). MODEL r18vd: the seeded RT-DETR v2 r18vd.
#   tools/gpu/profile_kernels.sh OUTDIR [MODEL] [BATCH]
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${1:?OUTDIR}; model=${2:-res2net50_26w_4s}; batch=${3:-1}
mkdir -p "$out"
work=/tmp/kiln_prof
. tools/gpu/full_fixture.sh
full_fixture "$model" "$out/fixtures_$model.log" || exit 1
tag=${KILN_PROFILE_TAG:-default}
bundle=$work/$model.b$batch.$tag.bundle
[ -f $bundle ] || $kiln build $work/full/$model -o $bundle --backend cuda --precision fp16 --batch $batch ${KILN_BUILD_FLAGS:-} > "$out/build_$tag.log" 2>&1 || exit 1
nsys=$(command -v nsys || ls /usr/local/cuda*/bin/nsys /opt/nvidia/nsight-systems*/bin/nsys 2>/dev/null | head -1)
if [ -z "$nsys" ]; then
  echo "nsys not found: kiln bench --trace (CUPTI, in-graph) and --profile (layers one by one) instead" | tee "$out/kernels_$tag.txt"
  $kiln bench $bundle --batch $batch --iterations 50 --profile 20 --trace 20 | tee -a "$out/kernels_$tag.txt"
  $kiln bench $bundle --batch $batch --iterations 50 --trace 20 --json > "$out/trace_$tag.json" 2>&1
  # RT-DETR: the in-graph time per layer group (each launch from the end of the one before).
  [ "$model" = r18vd ] && python3 tools/gpu/compare_rtdetr.py trace --bench "$out/trace_$tag.json" | tee -a "$out/kernels_$tag.txt"
  exit 0
fi
$nsys profile -q --cuda-graph-trace=node -t cuda -o $work/prof_$tag -f true $kiln bench $bundle --batch $batch --iterations 50 \
  > "$out/bench_$tag.txt" 2>&1 || exit 1
$nsys export -q --type sqlite -o $work/prof_$tag.sqlite -f true $work/prof_$tag.nsys-rep || exit 1
per_call=$(grep -o '[0-9]* kernels/call' "$out/bench_$tag.txt" | head -1 | cut -d' ' -f1)
python3 - $work/prof_$tag.sqlite "$out/kernels_$tag.txt" "${per_call:-0}" <<'PY'
import sqlite3, sys, collections
db = sqlite3.connect(sys.argv[1])
rows = db.execute("""select k.start, k.end, s.value from CUPTI_ACTIVITY_KIND_KERNEL k
                     join StringIds s on s.id = k.shortName order by k.start""").fetchall()
n = int(sys.argv[3]) or 100
last = rows[-n:]  # the last replay of the timed loop
with open(sys.argv[2], "w") as f:
    span = (last[-1][1] - last[0][0]) / 1e3
    busy = sum(r[1] - r[0] for r in last) / 1e3
    f.write(f"one replay: {len(last)} kernels, {span:.1f} us first start to last end, {busy:.1f} us in kernels\n")
    by = collections.defaultdict(lambda: [0, 0.0])
    for r in last:
        by[r[2]][0] += 1; by[r[2]][1] += (r[1] - r[0]) / 1e3
    for name, (k, us) in sorted(by.items(), key=lambda kv: -kv[1][1]):
        f.write(f"{us:9.1f} us {k:4d}x  {name[:110]}\n")
    f.write("\norder (us, gap before):\n")
    prev = None
    for r in last:
        gap = (r[0] - prev) / 1e3 if prev else 0.0
        f.write(f"{(r[1]-r[0])/1e3:7.2f} {gap:6.2f}  {r[2][:90]}\n")
        prev = r[1]
print(open(sys.argv[2]).read()[:3000])
PY
