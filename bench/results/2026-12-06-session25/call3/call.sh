#!/usr/bin/env bash
# Session 25, call 3: default (conv_knobs) per-group profiles at batch 1 and 8, engine tests, op harness convs, knob sweep.
set -u
work=/tmp/kiln_prof; mkdir -p $work; tar -C $work -xJf .gpu/payload.tar.xz
export LD_LIBRARY_PATH=$work/lib:/usr/lib/x86_64-linux-gnu:/usr/local/cuda-13.0/targets/x86_64-linux/lib
[ -d /work/main/tests/fixtures ] || { mkdir -p /work; ln -sfn "$PWD" /work/main; }
R=$work/res; rm -rf $R; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version --format=csv > $R/gpu.txt
B=$work/bin; t0=$SECONDS
log() { echo "$1 rc=$2 t=$((SECONDS-t0))" >> $R/rc.txt; tar -C $work -czf $OUT/res.tgz res; }
rm -f $work/r18vd.b*.bundle
timeout 150 tools/gpu/profile_kernels.sh $R/p1 r18vd 1 > $R/prof1.log 2>&1; log prof1 $?
timeout 80 tools/gpu/profile_kernels.sh $R/p8 r18vd 8 > $R/prof8.log 2>&1; log prof8 $?
timeout 120 stdbuf -oL $B/kiln_gpu_tests --gtest_filter='CudaEngine.*:-CudaEngine.Thousand*' > $R/engine_tests.log 2>&1; log engine_tests $?
timeout 60 stdbuf -oL $B/kiln_ops_tests --gtest_filter='Cases/OpCuda.*conv*' > $R/ops_conv.log 2>&1; log ops_conv $?
timeout 150 stdbuf -oL $B/kiln_gpu_tests --gtest_filter='CudaConvPerf.KnobSweep' > $R/sweep.log 2>&1; log sweep $?
tar -C $work -czf $OUT/res.tgz res
