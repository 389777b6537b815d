#!/usr/bin/env bash
# One device call for RT-DETR v2 work (issue #12 and its FP8 study), as session 21 ran it by hand
# (bench/results/2026-12-05-session21/README.md), on the GPU machine after tools/gpu/pack.sh here
# with .gpu carried:
#   tools/gpu/rtdetr_round.sh OUT [SECONDS]
# 1. tools/gpu/study.sh, bounded by SECONDS - 90 (default 560; the profiles after it took ~60 s
#    in session 21, and the demo's study needed more than 290 s beside the tests): the RT-DETR GPU tests, the
#    op-harness cases RT-DETR's fusions touch, the r18vd check against PyTorch, and the FP8/INT8
#    study of the trained demo detector (KILN_ROUND_STUDY=0: no study). The tests leave out
#    CudaEngine.* (one of them runs 200 s).
# 2. tools/gpu/profile_kernels.sh on the seeded r18vd on a quiet GPU: batch 1 at the default, with
#    `--enable igemm_conv` (kiln's implicit-GEMM conv timed beside cuDNN), `--disable fuse_mlp`
#    and `--enable fuse_mlp`, and batch 8 at the default and with `--enable igemm_conv`. Each
#    prints the engine time, the in-graph trace and the per-group table (compare_rtdetr.py trace).
# Everything lands in OUT/round.tgz (one file: the device tool returns at most 8), bundles removed.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${1:?OUT}; secs=${2:-560}
# The test binaries look for their fixtures where they were built (/work/main/tests/fixtures).
[ -d /work/main/tests/fixtures ] || { mkdir -p /work && ln -sfn "$PWD" /work/main; }
r=$(mktemp -d)/round; mkdir -p "$r" "$out"
nvidia-smi > "$r/gpu.txt" 2>&1
models=rtdetr_demo
[ "${KILN_ROUND_STUDY:-1}" = 0 ] && models=none
KILN_STUDY_MODELS="$models" \
  KILN_STUDY_TESTS='*CudaIgemmConv*:*IgemmConv*:*CudaRtDetr*:*KernelNames*:*CudaGather*:*Transformer*' \
  KILN_STUDY_OPS='Cases/OpCuda.*conv2d*:Cases/OpCuda.*group*:Cases/OpCuda.*layer_norm*:Cases/OpCuda.*concat*:Cases/OpCuda.*top_k*:Cases/OpCuda.*attention*:Cases/OpCuda.*deform*' \
  KILN_STUDY_RTDETR=1 tools/gpu/study.sh "$r/study" $((secs - 90)) > "$r/study.log" 2>&1
tools/gpu/profile_kernels.sh "$r/prof" r18vd 1 > "$r/prof_default.log" 2>&1
KILN_PROFILE_TAG=igemm KILN_BUILD_FLAGS="--enable igemm_conv" tools/gpu/profile_kernels.sh "$r/prof" r18vd 1 > "$r/prof_igemm.log" 2>&1
KILN_PROFILE_TAG=off KILN_BUILD_FLAGS="--disable fuse_mlp" tools/gpu/profile_kernels.sh "$r/prof" r18vd 1 > "$r/prof_off.log" 2>&1
KILN_PROFILE_TAG=on KILN_BUILD_FLAGS="--enable fuse_mlp" tools/gpu/profile_kernels.sh "$r/prof" r18vd 1 > "$r/prof_on.log" 2>&1
tools/gpu/profile_kernels.sh "$r/prof8" r18vd 8 > "$r/prof8_default.log" 2>&1
KILN_PROFILE_TAG=igemm KILN_BUILD_FLAGS="--enable igemm_conv" tools/gpu/profile_kernels.sh "$r/prof8" r18vd 8 > "$r/prof8_igemm.log" 2>&1
rm -f "$r"/prof*/*.bundle
tar -C "$(dirname "$r")" -czf "$out/round.tgz" round
cat "$r/study/summary.txt" 2>/dev/null
grep -h "engine median" "$r"/prof*/kernels_*.txt
