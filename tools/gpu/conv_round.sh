#!/usr/bin/env bash
# One device call for kiln's implicit-GEMM conv (igemm_conv.cu, switch igemm_conv), on the GPU
# machine after tools/gpu/pack.sh here with .gpu carried:
#   tools/gpu/conv_round.sh OUT
# 1. kiln_gpu_tests CudaIgemmConv.* (every tile and K split against the CPU reference),
#    CudaEngine.IgemmConv* (a fixture run through the tactic cache) and CudaIgemmConvPerf.* (the
#    per-shape table: r18vd's convs, cuDNN's fastest tactic against every tile, PDL on and off).
# 2. tools/gpu/profile_kernels.sh on the seeded r18vd, batch 1 and 8, at the default and with
#    `--enable igemm_conv`, each timed and traced on a quiet GPU.
# Everything lands in OUT/conv.tgz (bundles removed).
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${1:?OUT}
[ -d /work/main/tests/fixtures ] || { mkdir -p /work && ln -sfn "$PWD" /work/main; }
r=$(mktemp -d)/conv; mkdir -p "$r" "$out"
work=/tmp/kiln_prof
. tools/gpu/full_fixture.sh
nvidia-smi --query-gpu=name,driver_version --format=csv > "$r/gpu.txt" 2>&1
"$work/bin/kiln_gpu_tests" --gtest_filter='CudaIgemmConv.*:CudaEngine.IgemmConv*:CudaIgemmConvPerf.*' > "$r/tests.log" 2>&1
echo "tests: exit $?" >> "$r/tests.log"
for b in 1 8; do
  tools/gpu/profile_kernels.sh "$r/prof$b" r18vd $b > "$r/prof${b}_default.log" 2>&1
  KILN_PROFILE_TAG=igemm KILN_BUILD_FLAGS="--enable igemm_conv" tools/gpu/profile_kernels.sh "$r/prof$b" r18vd $b \
    > "$r/prof${b}_igemm.log" 2>&1
  for tag in default igemm; do
    "$work/bin/kiln" inspect "$work/r18vd.b$b.$tag.bundle" > "$r/prof$b/inspect_$tag.txt" 2>&1
  done
done
rm -f "$r"/prof*/*.bundle "$work"/*.bundle
tar -C "$(dirname "$r")" -czf "$out/conv.tgz" conv
grep -E "^(conv|stem|stage|fpn|repvgg|downsample|b8)|OK|FAILED|exit" "$r/tests.log"
grep -h "engine median" "$r"/prof*/kernels_*.txt
