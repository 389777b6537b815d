#!/usr/bin/env bash
# An engine switch's effect on the engine time, on the GPU machine (after tools/gpu/pack.sh
# here, .gpu carried): builds a seeded full-size model's fp16 bundle twice at one batch size,
# the default and with the switch forced (--disable SWITCH, or --enable with KILN_AB_ENABLE=1),
# and times both with one `kiln bench` call, which interleaves them (so clock and thermal drift
# hit both alike). Session 24's side lane A/B:
#   tools/gpu/switch_ab.sh OUTDIR r18vd 1 side_lane
#   tools/gpu/switch_ab.sh OUTDIR MODEL BATCH SWITCH [ITERATIONS]
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${1:?OUTDIR}; model=${2:?MODEL}; batch=${3:?BATCH}; switch=${4:?SWITCH}; iters=${5:-200}
mkdir -p "$out"
work=/tmp/kiln_prof
. tools/gpu/full_fixture.sh
full_fixture "$model" "$out/fixtures_$model.log" || exit 1
flag=--disable; [ "${KILN_AB_ENABLE:-0}" = 1 ] && flag=--enable
a=$work/$model.b$batch.ab_default.bundle b=$work/$model.b$batch.ab_$switch.bundle
$kiln build $work/full/$model -o $a --backend cuda --precision fp16 --batch $batch > "$out/build_default.log" 2>&1 || exit 1
$kiln build $work/full/$model -o $b --backend cuda --precision fp16 --batch $batch $flag $switch > "$out/build_$switch.log" 2>&1 || exit 1
$kiln bench $a $b --batch $batch --iterations $iters | tee "$out/ab_${model}_b${batch}_$switch.txt"
