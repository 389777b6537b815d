#!/usr/bin/env bash
# The FP8 studies of issue #13 §6 and the RT-DETR v2 check of issue #12, in one bounded device call
# (on the GPU machine, after tools/gpu/pack.sh here with .gpu carried):
#   tools/gpu/study.sh OUT [SECONDS]
# Stream A, one study after another (each bounded): `kiln study quant --backend cuda` on the seeded
# full-size resnet50, res2net50_26w_4s and efficientnet_b0 (tools/reference/make_fixtures*.py
# --full-size; calibration and quality images: the 15 sample photos of tests/fixtures/images, JPEG
# and PNG) at batch 1 and 32, opt levels 1 and 3, FP8 against fp16; then the digits demo model with
# its held-out labels (--accuracy).
# Stream B, beside it: tools/gpu/check_rtdetr.sh (RT-DETR v2 r18vd seeded, fp32/fp16 vs PyTorch,
# bench with the per-layer-group profile).
# Stream C: GPU tests a verify.sh run did not reach (KILN_STUDY_TESTS).
# The streams share the GPU: the studies time their variants interleaved in one process (each round
# runs every variant once), so the ratios compare like with like, but absolute milliseconds carry
# the other stream's load; the report says so. Every part has its own bound (SECONDS, default 540,
# split below) so the call ends inside the device tool's 600 s. Bundles, checkpoints and arrays are
# deleted before OUT/study.tgz is packed (a returned file may have at most 16 MiB); each study's
# REPORT.md and study.json come back.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${1:?OUT}; secs=${2:-540}
work=${KILN_GPU_WORK:-/tmp/kiln_gpu_study}; rm -rf "$work"; mkdir -p "$work/full" "$out"
r=$(mktemp -d)
tar -C "$work" -xJf .gpu/payload.tar.xz
export LD_LIBRARY_PATH=$work/lib:/usr/lib/x86_64-linux-gnu:/usr/local/cuda-13.0/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}
kiln=$work/bin/kiln
start=$(date +%s)
left() { echo $(( secs - ($(date +%s) - start) )); }
bounded() {  # SECONDS NAME COMMAND...: at most SECONDS (and never past the call's bound)
  local s=$1 name=$2; shift 2
  local l; l=$(left); [ "$s" -le "$l" ] || s=$l
  [ "$s" -gt 5 ] || { echo "$name: skipped (no time left)" >> "$r/summary.txt"; return; }
  timeout "$s" "$@" > "$r/$name.log" 2>&1
  local rc=$?
  [ $rc = 124 ] && rc="124 (stopped at $s s)"
  echo "$name: exit $rc" >> "$r/summary.txt"
}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$r/gpu.txt" 2>&1
$kiln version >> "$r/gpu.txt" 2>&1
calib=$work/calib; mkdir -p "$calib"
cp tests/fixtures/images/images/*.jpg tests/fixtures/images/images/*.png "$calib/"

stream_a() {
  bounded 120 fixtures sh -c "python3 tools/reference/make_fixtures.py --full-size $work/full --models resnet50 &&
    python3 tools/reference/make_fixtures_res2net.py --full-size $work/full --models res2net50_26w_4s &&
    python3 tools/reference/make_fixtures_efficientnet.py --full-size $work/full --models efficientnet_b0"
  for m in resnet50 res2net50_26w_4s efficientnet_b0; do
    bounded 130 "study_$m" $kiln study quant "$work/full/$m" --backend cuda --calib "$calib" --batch 1,32 \
      --opt-level 1,3 --precisions fp8 --rounds 30 -o "$r/study_$m"
  done
  bounded 60 study_digits_resnet $kiln study quant models/digits_resnet --backend cuda \
    --calib models/digits_resnet/samples --accuracy models/digits_resnet/heldout --batch 1,32 --opt-level 3 \
    --precisions fp8 --rounds 30 -o "$r/study_digits_resnet"
}
stream_b() {
  bounded 400 rtdetr env KILN_GPU_WORK=$work/rtdetr tools/gpu/check_rtdetr.sh "$r/rtdetr"
}
# Stream C: the GPU tests a verify.sh run did not reach (KILN_STUDY_TESTS, a --gtest_filter pattern;
# default: those session 10's verify call left when it stopped at 500 s; "none" skips).
tests=${KILN_STUDY_TESTS:-'Fixtures/CudaFixture.ProgrammaticLaunch*:Fixtures/CudaFixture.Res2NetSplits*:Fixtures/CudaFixture.SqueezeExcitation*:Fixtures/CudaRtDetr.*:Fixtures/WindowPlanFixture.*:Fixtures/CudaFixture.EveryOptLevel*'}
stream_c() {
  [ "$tests" = none ] && return
  bounded 520 gpu_tests env KILN_GPU_WORK=$work/tests KILN_GPU_TEST_FILTER="$tests" tools/gpu/on_device.sh "$r/tests" --quick
  echo "gpu tests: $(grep -cE '^\[       OK' "$r/tests/gpu_tests.log") OK, $(grep -cE '^\[  FAILED  \] [A-Z]' "$r/tests/gpu_tests.log") FAILED" >> "$r/summary.txt"
}
stream_a & stream_b & stream_c & wait
. tools/gpu/strip_heavy.sh; strip_heavy "$r"
cat "$r/summary.txt"
for f in "$r"/study_*/REPORT.md; do [ -f "$f" ] && { echo "== $f"; sed -n '1,25p' "$f"; }; done
grep -hE 'PASS|FAIL|ms' "$r/rtdetr.log" 2>/dev/null | tail -20
tar -C "$r" -czf "$out/study.tgz" .
ls -la "$out/study.tgz"
