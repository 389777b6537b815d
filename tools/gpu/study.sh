#!/usr/bin/env bash
# The FP8 studies of issue #13 §6 and the RT-DETR v2 check of issue #12, in one bounded device call
# (on the GPU machine, after tools/gpu/pack.sh here with .gpu carried):
#   tools/gpu/study.sh OUT [SECONDS]
# Stream A, side by side (each bounded): `kiln study quant --backend cuda` on the seeded full-size
# resnet50, res2net50_26w_4s and efficientnet_b0 (tools/reference/make_fixtures*.py --full-size;
# calibration and quality images: the 15 sample photos of tests/fixtures/images, JPEG and PNG) at
# batch 1 and 32, opt levels 1 and 3, FP8 and INT8 (KILN_STUDY_PRECISIONS, default fp8,int8) against
# fp16; and the digits demo model with its held-out labels (--accuracy). KILN_STUDY_RECIPES adds recipe
# variants to a model's study; each study keeps the plans of its bundles (`kiln inspect --plan`) and
# batch 1's per-layer profile (profile_b1.json).
# Stream B, beside it: tools/gpu/check_rtdetr.sh without its bench (RT-DETR v2 r18vd seeded,
# fp32/fp16 against PyTorch); its speed wants a quiet GPU: tools/gpu/speed.sh. KILN_STUDY_RTDETR=0: off.
# Stream C: GPU tests a verify.sh run did not reach (KILN_STUDY_TESTS).
# Stream D: op-harness cases (KILN_STUDY_OPS, a --gtest_filter for kiln_ops_tests).
# Session 16's call: KILN_STUDY_MODELS="resnet50 res2net50_26w_4s efficientnet_b0 digits"
#   KILN_STUDY_TESTS='CudaFp8.*:CudaQuantModel.*' KILN_STUDY_OPS='*quantiz*' KILN_STUDY_RTDETR=0
#   KILN_STUDY_RECIPES="res2net50_26w_4s=families/timm_res2net/recipes/fp8_pointwise.json" tools/gpu/study.sh $OUT 470
# Session 20's call (kiln 866718b, H200, bench/results/2026-12-05-h200-session20/):
#   KILN_STUDY_MODELS="resnet50 res2net50_26w_4s efficientnet_b0 digits"
#   KILN_STUDY_TESTS='*CudaFp8*:*CudaQuantModel*:*CudaRtDetr*:*KernelNames*:*CudaEngine.*:*Transformer*:*StridedCopy*'
#   KILN_STUDY_OPS='Cases/OpCuda.*' KILN_STUDY_RTDETR=1
#   KILN_STUDY_RECIPES="res2net50_26w_4s=families/timm_res2net/recipes/fp8_pointwise.json
#   resnet50=families/timm_resnet/recipes/fp8_wide_residuals.json efficientnet_b0=families/timm_efficientnet/recipes/fp8_small_plan.json"
#   tools/gpu/study.sh $OUT 530
# The RT-DETR v2 FP8 study (#13 §6, once #12 lands): KILN_STUDY_MODELS="rtdetr_demo" KILN_STUDY_TESTS=none
#   KILN_STUDY_RTDETR=0 tools/gpu/study.sh $OUT 400
# then, on a quiet GPU: KILN_TASK_B1_BUNDLE=0 KILN_SPEED_PARTS=rtdetr tools/gpu/speed.sh $OUT/speed 260
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
. tools/gpu/bounded.sh
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$r/gpu.txt" 2>&1
$kiln version >> "$r/gpu.txt" 2>&1
calib=$work/calib; mkdir -p "$calib"
cp tests/fixtures/images/images/*.jpg tests/fixtures/images/images/*.png "$calib/"

# The three full-size studies run side by side (each its fixture, then its study, bounded by what
# is left of the call): one after another they did not fit one device call (5 builds each, two at
# opt level 3 with tactic timing). Their builds and timings share the GPU, so tactic choices and
# absolute milliseconds carry the others' load; each study's variants are still timed interleaved,
# round by round, in one process, so its ratios compare like with like (the report's method says
# how to rerun one alone).
# recipe_flags MODEL: KILN_STUDY_RECIPES' recipe variants, "MODEL=RECIPE_FILE ..." (that model's
# study then compares the default recipe with each file in one run: --recipe default,FILE...),
# into the array rflag.
recipe_flags() {
  local v recipe=()
  rflag=()
  for v in ${KILN_STUDY_RECIPES:-}; do
    [ "${v%%=*}" = "$1" ] && recipe+=("${v#*=}")
  done
  [ ${#recipe[@]} -gt 0 ] && rflag=(--recipe "default,$(IFS=,; echo "${recipe[*]}")")
  return 0
}
study_one() {  # MODEL FIXTURE_SCRIPT
  local m=$1 script=$2 rflag
  recipe_flags "$m"
  bounded 150 "fixture_$m" python3 "tools/reference/$script" --full-size "$work/full" --models "$m" || return
  [ -f "$work/full/$m/config.json" ] || return
  bounded "$(left)" "study_$m" $kiln study quant "$work/full/$m" --backend cuda --calib "$calib" --batch 1,32 \
    --opt-level 1,3 --precisions ${KILN_STUDY_PRECISIONS:-fp8,int8} --rounds 30 "${rflag[@]}" -o "$r/study_$m"
  plans "$r/study_$m"
  # The study profiles its last batch; batch 1's per-layer times come from kiln bench on its bundles.
  local b1=("$r/study_$m"/bundles/*_o3.bundle)
  [ -f "${b1[0]}" ] && bounded 60 "profile_b1_$m" $kiln bench "${b1[@]}" --batch 1 --iterations 100 --profile 20 \
    --no-task --json && cp "$r/profile_b1_$m.log" "$r/study_$m/profile_b1.json"
}
# plans DIR: every step and its tactic of each bundle a study built (`kiln inspect --plan`),
# kept beside its REPORT.md (the bundles themselves do not come back).
plans() {
  local b
  for b in "$1"/bundles/*.bundle; do
    [ -f "$b" ] && $kiln inspect "$b" --plan > "$1/plan_$(basename "$b" .bundle).txt" 2>&1
  done
}
# KILN_STUDY_MODELS narrows stream A (space-separated: resnet50 res2net50_26w_4s efficientnet_b0 digits;
# rtdetr_demo adds the detector's study). Unset: those four; set but empty (or "none"): no study.
models=" ${KILN_STUDY_MODELS-resnet50 res2net50_26w_4s efficientnet_b0 digits} "
want() { [[ "$models" == *" $1 "* ]]; }
stream_a() {
  want digits && bounded 120 study_digits_resnet $kiln study quant models/digits_resnet --backend cuda \
    --calib models/digits_resnet/samples --accuracy models/digits_resnet/heldout --batch 1,32 --opt-level 1,3 \
    --precisions ${KILN_STUDY_PRECISIONS:-fp8,int8} --rounds 30 -o "$r/study_digits_resnet" && plans "$r/study_digits_resnet" &
  want resnet50 && study_one resnet50 make_fixtures.py &
  want res2net50_26w_4s && study_one res2net50_26w_4s make_fixtures_res2net.py &
  want efficientnet_b0 && study_one efficientnet_b0 make_fixtures_efficientnet.py &
  want rtdetr_demo && study_detector &
  wait
}
# rtdetr_demo (not in the default list): issue #13 §6's RT-DETR v2 study, due once #12 lands. The
# trained demo detector (320x320, models/rtdetr_demo): calibration and quality on its held-out
# images (detection agreement per image, non-finite scan), batch 1 and 8; recipe variants (the
# seven linear parts of FIELD-NOTES §4 are recipe parts) through KILN_STUDY_RECIPES
# "rtdetr_demo=FILE"; mAP per variant by the `kiln eval --coco` command the report names.
study_detector() {
  local rflag d=models/rtdetr_demo
  recipe_flags rtdetr_demo
  bounded "$(left)" study_rtdetr_demo $kiln study quant $d --backend cuda --calib $d/heldout/images --batch 1,8 \
    --opt-level 1,3 --precisions ${KILN_STUDY_PRECISIONS:-fp8,int8} --rounds 20 "${rflag[@]}" -o "$r/study_rtdetr_demo" &&
    plans "$r/study_rtdetr_demo"
}
stream_b() {  # accuracy only: its speed is timed on a quiet GPU by tools/gpu/speed.sh
  bounded 400 rtdetr env KILN_GPU_WORK=$work/rtdetr KILN_SKIP_BENCH=1 tools/gpu/check_rtdetr.sh "$r/rtdetr"
}
# Stream C: the GPU tests a verify.sh run did not reach (KILN_STUDY_TESTS, a --gtest_filter pattern;
# default: those session 10's verify call left when it stopped at 500 s; "none" skips).
tests=${KILN_STUDY_TESTS:-'Fixtures/CudaFixture.ProgrammaticLaunch*:Fixtures/CudaFixture.Res2NetSplits*:Fixtures/CudaFixture.SqueezeExcitation*:Fixtures/CudaRtDetr.*:Fixtures/WindowPlanFixture.*:Fixtures/CudaFixture.EveryOptLevel*'}
stream_c() {
  [ "$tests" = none ] && return
  bounded 520 gpu_tests env KILN_GPU_WORK=$work/tests KILN_GPU_TEST_FILTER="$tests" tools/gpu/on_device.sh "$r/tests" --quick
  echo "gpu tests: $(grep -cE '^\[       OK' "$r/tests/gpu_tests.log") OK, $(grep -cE '^\[  FAILED  \] [A-Z]' "$r/tests/gpu_tests.log") FAILED" >> "$r/summary.txt"
}
# Stream D: op-harness cases (KILN_STUDY_OPS, a --gtest_filter pattern for kiln_ops_tests; unset:
# none), e.g. the FP8 layer cases forced onto each path.
stream_d() {
  [ -n "${KILN_STUDY_OPS:-}" ] || return
  bounded 400 ops_tests $work/bin/kiln_ops_tests --gtest_brief=1 --errors --gtest_filter="$KILN_STUDY_OPS"
  echo "ops tests: $(grep -E 'PASSED|FAILED  \]' "$r/ops_tests.log" | tail -2 | tr '\n' ' ')" >> "$r/summary.txt"
}
# KILN_STUDY_RTDETR=0 leaves stream B out.
[ "${KILN_STUDY_RTDETR:-1}" = 0 ] && stream_b() { :; }
stream_a & stream_b & stream_c & stream_d & wait
. tools/gpu/strip_heavy.sh; strip_heavy "$r"
cat "$r/summary.txt"
for f in "$r"/study_*/REPORT.md; do [ -f "$f" ] && { echo "== $f"; sed -n '1,25p' "$f"; }; done
grep -hE 'PASS|FAIL|ms' "$r/rtdetr.log" 2>/dev/null | tail -20
tar -C "$r" -czf "$out/study.tgz" .
ls -la "$out/study.tgz"
