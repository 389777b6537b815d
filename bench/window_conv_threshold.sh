#!/usr/bin/env bash
# The measurement behind kWindowConvMaxRows (src/backends/cuda/cuda_program.cpp):
# two fp16 Res2Net bundles per batch size, built with kiln's window-conv path on
# (`--enable window_conv`) and off (`--disable window_conv`: cuDNN convs with
# split/add/concat kernels), timed by `kiln bench` one after the other. On the GPU machine:
#   bench/window_conv_threshold.sh KILN_BINARY MODEL_DIR OUTDIR [BATCHES]
# MODEL_DIR: a seeded checkpoint (tools/reference/make_fixtures_res2net.py --full-size).
set -uo pipefail
kiln=${1:?kiln binary}; model=${2:?model dir}; out=${3:?outdir}; batches=${4:-1 2 4 8 16 32}
mkdir -p "$out"
name=$(basename "$model")
printf '%-6s %-12s %-12s %-8s %-8s\n' batch window_ms cudnn_ms kernels_w kernels_c | tee "$out/threshold_$name.txt"
for b in $batches; do
  for mode in enable disable; do
    "$kiln" build "$model" -o "$out/$name.b$b.$mode.bundle" --backend cuda --precision fp16 --batch "$b" --opt-level 3 \
      --$mode window_conv > /dev/null || exit 1
  done
  "$kiln" bench "$out/$name.b$b.enable.bundle" --batch "$b" --json > "$out/win_b$b.json" || exit 1
  "$kiln" bench "$out/$name.b$b.disable.bundle" --batch "$b" --json > "$out/cudnn_b$b.json" || exit 1
  python3 - "$out" "$b" <<'PY' | tee -a "$out/threshold_$name.txt"
import json, sys
out, b = sys.argv[1], sys.argv[2]
w = json.load(open(f"{out}/win_b{b}.json"))["results"][0]
c = json.load(open(f"{out}/cudnn_b{b}.json"))["results"][0]
print(f"{b:<6} {w['engine_ms']['median']:<12.4f} {c['engine_ms']['median']:<12.4f} {w['kernels_per_call']:<8} {c['kernels_per_call']:<8}")
PY
  rm -f "$out/$name.b$b".*.bundle
done
