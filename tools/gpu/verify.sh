#!/usr/bin/env bash
# One device call that verifies a commit, bounded so its results always come back
# (on the GPU machine, after tools/gpu/pack.sh here, with .gpu carried):
#   tools/gpu/verify.sh OUT [SECONDS] [MODEL...]
# Runs, side by side and each with its own scratch folder: the GPU tests (--quick), the op
# harness (--ops) and tools/gpu/check_variants.sh over MODEL... (default: every named Res2Net
# and EfficientNet variant) in 6 streams. Every part is bounded by SECONDS (default 530) so
# the call ends inside the device tool's 600 s; then the logs and JSON lines (no checkpoints,
# no bundles) are packed into OUT/verify.tgz, which stays far below the 16 MiB a returned file
# may have, and a summary is printed: one line per part.
# Lessons of session 9: a part without its own bound ran the call past 600 s and nothing came
# back; an archive with bundles in it (> 16 MiB) did not come back either.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${1:?OUT}; secs=${2:-530}; shift $(( $# >= 2 ? 2 : 1 ))
models=("$@")
[ ${#models[@]} -gt 0 ] || models=(res2net50_26w_4s res2net50_14w_8s res2net50_48w_2s res2net50_26w_6s res2net50_26w_8s
  res2net50d res2next50 res2net101_26w_4s res2net101d efficientnet_b0 efficientnet_b1 efficientnet_b2 efficientnet_b3
  efficientnet_b4 tf_efficientnet_b0 tf_efficientnet_b1 tf_efficientnet_b2 tf_efficientnet_b3 tf_efficientnet_b4
  efficientnet_lite0 efficientnet_lite1 efficientnet_lite2 efficientnet_lite3 efficientnet_lite4 tf_efficientnet_lite0
  tf_efficientnet_lite1 tf_efficientnet_lite2 tf_efficientnet_lite3 tf_efficientnet_lite4 efficientnetv2_rw_s
  tf_efficientnetv2_s)
r=$(mktemp -d); mkdir -p "$out"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
part() {  # NAME COMMAND...: run bounded, exit status in $r/NAME.rc
  local name=$1; shift
  timeout "$secs" "$@" > "$r/$name.log" 2>&1
  echo $? > "$r/$name.rc"
}
part quick env KILN_GPU_WORK=/tmp/kv_quick tools/gpu/on_device.sh "$r/quick" --quick &
part ops env KILN_GPU_WORK=/tmp/kv_ops tools/gpu/on_device.sh "$r/ops" --ops &
part var env KILN_STREAM_TIMEOUT=$((secs - 15)) tools/gpu/check_variants.sh "$r/var" 6 "${models[@]}" &
wait
summary() {  # TITLE NAME: exit status and gtest's summary lines
  local rc s
  rc=$(cat "$r/$2.rc")
  s=$(cat "$r/$2"/*_tests.log 2>/dev/null | grep -E '^\[  (PASSED|FAILED)  \]' | head -3 | tr '\n' ' ')
  [ "$rc" = 124 ] && rc="124 (stopped at $secs s)"
  echo "$1: exit $rc ${s:-(no gtest summary; see $2.log)}"
}
{
  summary "GPU tests (--quick)" quick
  summary "op harness (--ops)" ops
  echo "variants: exit $(cat "$r/var.rc"), $(grep -cE ' PASS \(' "$r/var.log") PASS, $(grep -cE ' FAIL \(' "$r/var.log") FAIL of ${#models[@]} models"
} | tee "$r/summary.txt"
. tools/gpu/strip_heavy.sh; strip_heavy "$r"
tar -C "$r" -czf "$out/verify.tgz" .
ls -la "$out/verify.tgz"
