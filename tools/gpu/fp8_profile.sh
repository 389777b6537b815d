#!/usr/bin/env bash
# Where FP8 engine time goes, layer by layer (issue #13): on the GPU machine, after
# tools/gpu/pack.sh here with .gpu carried:
#   tools/gpu/fp8_profile.sh OUT [SECONDS]
# Builds the seeded full-size models named by KILN_FP8_MODELS (default resnet50) as fp16 and FP8
# (default recipe, max calibration on the fixture photos) at opt level 3 for the batches in
# KILN_FP8_BATCHES (default 1,32), then per batch `kiln bench --profile 20 --json` on both bundles
# (interleaved in one process) and `kiln inspect --plan` of each (every step and its tactic).
# KILN_FP8_NCU=N (N > 0): also Nsight Compute on the FP8 bundle at the last batch, the first N
# kernels of kiln's CUTLASS GEMM (CUTLASS's device_kernel) with the speed-of-light, memory, launch,
# occupancy and warp-state sections (`--clock-control none`: the clocks stay as they are), in
# ncu_<model>.txt: where the GEMM's time goes (docs/cuda-backend.md "FP8": ~1.4 TB/s on
# resnet50 layer1 conv3 in session 16).
# Everything comes back as OUT/fp8_profile.tgz (one file: the device tool returns few).
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${1:?OUT}; secs=${2:-420}
work=${KILN_GPU_WORK:-/tmp/kiln_fp8_profile}; rm -rf "$work"; mkdir -p "$work/full" "$out"
r=$(mktemp -d)
tar -C "$work" -xJf .gpu/payload.tar.xz
export LD_LIBRARY_PATH=$work/lib:/usr/lib/x86_64-linux-gnu:/usr/local/cuda-13.0/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}
kiln=$work/bin/kiln
. tools/gpu/bounded.sh
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$r/gpu.txt" 2>&1
$kiln version >> "$r/gpu.txt" 2>&1
calib=$work/calib; mkdir -p "$calib"
cp tests/fixtures/images/images/*.jpg tests/fixtures/images/images/*.png "$calib/"
batches=${KILN_FP8_BATCHES:-1,32}
declare -A script=([resnet50]=make_fixtures.py [res2net50_26w_4s]=make_fixtures_res2net.py [efficientnet_b0]=make_fixtures_efficientnet.py)
for m in ${KILN_FP8_MODELS:-resnet50}; do
  bounded 150 "fixture_$m" python3 "tools/reference/${script[$m]}" --full-size "$work/full" --models "$m" || continue
  bounded "$(left)" "build_${m}_fp16" $kiln build "$work/full/$m" -o "$work/${m}_fp16.bundle" --backend cuda \
    --precision fp16 --opt-level 3 --batch "$batches" --tactic-cache off || continue
  bounded "$(left)" "build_${m}_fp8" $kiln build "$work/full/$m" -o "$work/${m}_fp8.bundle" --backend cuda \
    --precision fp16 --quantize fp8 --calib "$calib" --opt-level 3 --batch "$batches" --tactic-cache off || continue
  for p in fp16 fp8; do $kiln inspect "$work/${m}_$p.bundle" --plan > "$r/plan_${m}_$p.txt" 2>&1; done
  for b in ${batches//,/ }; do
    bounded "$(left)" "bench_${m}_b$b" $kiln bench "$work/${m}_fp16.bundle" "$work/${m}_fp8.bundle" --batch "$b" \
      --iterations 200 --profile 20 --no-task --json
  done
  if [ "${KILN_FP8_NCU:-0}" -gt 0 ]; then
    bounded "$(left)" "ncu_$m" ncu --clock-control none --kernel-name regex:device_kernel --launch-count "$KILN_FP8_NCU" \
      --section SpeedOfLight --section MemoryWorkloadAnalysis --section LaunchStats --section Occupancy \
      --section WarpStateStats $kiln bench "$work/${m}_fp8.bundle" --batch "${batches##*,}" --iterations 10 --warmup 0 --no-task
  fi
done
cat "$r/summary.txt"
tar -C "$r" -czf "$out/fp8_profile.tgz" .
ls -la "$out/fp8_profile.tgz"
