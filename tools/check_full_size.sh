#!/usr/bin/env bash
# Full-size check of seeded models against PyTorch (issue #3/#4's bars), on any backend:
#   tools/check_full_size.sh KILN BACKEND OUT_JSONL LOG_DIR MODEL_DIR...
# Each MODEL_DIR comes from tools/reference/make_fixtures*.py --full-size (config.json,
# model.safetensors, input.npy, logits.npy). For each: PyTorch logits of the sample photos
# (tools/reference/reference_logits.py), then kiln fp32 and fp16 engines on the random input
# and the photos, compared by tools/gpu/compare.py (fp32 max|diff| <= 1e-3 * max|logit|; fp16
# cosine >= 0.9995 and the same top-1). One JSON line per comparison goes to OUT_JSONL (and
# stdout); build logs to LOG_DIR. Exit status 1 when any check fails.
# Needs torch + timm (reference logits) and numpy. Run from the repository root.
set -uo pipefail
kiln=${1:?KILN binary} backend=${2:?BACKEND (cpu|cuda)} out=${3:?OUT_JSONL} logs=${4:?LOG_DIR}
shift 4
mkdir -p "$logs"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
imgs=$(ls tests/fixtures/images/images/*.png | head -6)
status=0
for d in "$@"; do
  m=$(basename "$d")
  python3 tools/reference/reference_logits.py --model-dir "$d" --images $imgs --out-dir "$d" 2>>"$logs/reference.log" || {
    status=1; echo "{\"label\": \"$m\", \"pass\": false, \"error\": \"reference logits failed\"}" | tee -a "$out"; continue; }
  for p in fp32 fp16; do
    if ! $kiln build "$d" -o "$work/$m.$p.bundle" --backend "$backend" --precision $p --opt-level 1 > "$logs/build_$m.$p.log" 2>&1; then
      status=1; echo "{\"label\": \"$m $p\", \"pass\": false, \"error\": \"build failed\"}" | tee -a "$out"; continue
    fi
    for set in "random input:input.npy:logits.npy" "sample photos:images_input.npy:images_logits.npy"; do
      IFS=: read -r label input want <<< "$set"
      rm -rf "$work/o"
      $kiln run "$work/$m.$p.bundle" --input "pixel_values=$d/$input" --output-dir "$work/o" > /dev/null || status=1
      python3 tools/gpu/compare.py --kind $p --label "$m $p $label" --got "$work/o/logits.npy" --want "$d/$want" \
        | tee -a "$out" || status=1
    done
    rm -f "$work/$m.$p.bundle"
  done
done
exit $status
