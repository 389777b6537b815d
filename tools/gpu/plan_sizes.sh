#!/usr/bin/env bash
# Plan sizes without a study (issue #13's "plan <= 0.6x fp16"), on the GPU machine after
# tools/gpu/pack.sh here (.gpu carried): builds the seeded full-size MODEL as CUDA bundles, fp16 and
# FP8 with each recipe given (default: the default recipe), batches 1 and 32 (as kiln study quant
# builds them), and prints bytes and the ratio to fp16 (OUT/plan_sizes.txt) and each bundle's
# sections (OUT/inspect_*.txt). Builds at --opt-level 1: the size does not depend on tactic timing.
#   tools/gpu/plan_sizes.sh OUT MODEL [RECIPE.json ...]
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${1:?OUT}; model=${2:?MODEL}; shift 2
recipes=("$@"); [ ${#recipes[@]} -eq 0 ] && recipes=(default)
work=/tmp/kiln_prof; mkdir -p "$out"
. tools/gpu/full_fixture.sh
full_fixture "$model" "$out/fixtures_$model.log" || exit 1
common=(--backend cuda --precision fp16 --batch 1,32 --opt-level 1)
b16=$work/$model.size_fp16.bundle
$kiln build $work/full/$model -o $b16 "${common[@]}" > "$out/build_${model}_fp16.log" 2>&1 || exit 1
s16=$(stat -c %s $b16)
$kiln inspect $b16 | sed -n 1,12p > "$out/inspect_${model}_fp16.txt"
echo "$model fp16 $s16 bytes" | tee -a "$out/plan_sizes.txt"
for r in "${recipes[@]}"; do
  name=$(basename "$r" .json); b=$work/$model.size_fp8_$name.bundle
  flags=(--quantize fp8 --calib tests/fixtures/images/images); [ "$r" = default ] || flags+=(--recipe "$r")
  $kiln build $work/full/$model -o $b "${common[@]}" "${flags[@]}" > "$out/build_${model}_fp8_$name.log" 2>&1 || { echo "$model fp8 $name: build failed" | tee -a "$out/plan_sizes.txt"; continue; }
  s=$(stat -c %s $b)
  $kiln inspect $b | sed -n 1,12p > "$out/inspect_${model}_fp8_$name.txt"
  echo "$model fp8:$name $s bytes, $(python3 -c "print(f'{$s/$s16:.3f}')")x fp16" | tee -a "$out/plan_sizes.txt"
done
