#!/usr/bin/env bash
# Full-size GPU checks of many named Res2Net/EfficientNet variants at once, on the GPU machine
# (after tools/gpu/pack.sh here, with .gpu carried along):
#   tools/gpu/check_variants.sh OUTDIR STREAMS MODEL...
# Deals the timm names round-robin over STREAMS concurrent `tools/gpu/on_device.sh --family4`
# runs (checks only, no benches), each with its own scratch folder. The checks are correctness
# checks (tools/check_full_size.sh), so sharing the GPU and the CPUs changes how long they take,
# not what they assert. Each stream's results land in OUTDIR/sN (and OUTDIR/sN.tar.gz); all JSON
# lines are gathered into OUTDIR/full_size.jsonl and summarised on stdout. Exit status 1 when
# any check fails or any stream fails.
# KILN_STREAM_TIMEOUT (seconds, default 540) bounds each stream, so the summary is always written
# within one device call.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${1:?OUTDIR}; streams=${2:?STREAMS}; shift 2
[ $# -gt 0 ] || { echo "check_variants.sh: no models named" >&2; exit 2; }
mkdir -p "$out"
rm -rf "$out"/s[0-9]* "$out/full_size.jsonl"  # results of an earlier run would be counted again
declare -a r2 ef
i=0
for m in "$@"; do
  case $m in
    res2net*|res2next*) r2[$i]="${r2[$i]:-} $m" ;;
    *efficientnet*) ef[$i]="${ef[$i]:-} $m" ;;
    *) echo "check_variants.sh: $m is neither a Res2Net nor an EfficientNet name" >&2; exit 2 ;;
  esac
  i=$(( (i + 1) % streams ))
done
pids=()
for ((s = 0; s < streams; s++)); do
  [ -n "${r2[$s]:-}${ef[$s]:-}" ] || continue
  KILN_GPU_WORK=/tmp/kiln_gpu_s$s KILN_RES2NET_MODELS="${r2[$s]:-}" KILN_EFFNET_MODELS="${ef[$s]:-}" \
    KILN_BENCH_MODELS=none timeout -k 10 "${KILN_STREAM_TIMEOUT:-540}" \
    bash tools/gpu/on_device.sh "$out/s$s" --family4 > "$out/s$s.log" 2>&1 &
  pids+=($!)
done
status=0
for p in "${pids[@]}"; do wait "$p" || status=1; done
cat "$out"/s*/full_size.jsonl > "$out/full_size.jsonl" 2>/dev/null
python3 - "$out/full_size.jsonl" "$@" <<'EOF' || status=1
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
bad = 0
for m in sys.argv[2:]:
    mine = [r for r in rows if r["label"].split()[0] == m]
    ok = len(mine) == 4 and all(r["pass"] for r in mine)  # fp32/fp16 x random input/photos
    bad += not ok
    print(f"{m:24s} {'PASS' if ok else 'FAIL'} ({len(mine)}/4 comparisons)")
print(f"{len(sys.argv) - 2 - bad}/{len(sys.argv) - 2} models pass")
sys.exit(1 if bad else 0)
EOF
exit $status
