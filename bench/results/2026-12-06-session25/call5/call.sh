#!/usr/bin/env bash
# Session 25, call 5: engine record/replay and RT-DETR fixture tests with conv_knobs on by default.
set -u
work=/tmp/kiln_prof; mkdir -p $work; tar -C $work -xJf .gpu/payload.tar.xz
export LD_LIBRARY_PATH=$work/lib:/usr/lib/x86_64-linux-gnu:/usr/local/cuda-13.0/targets/x86_64-linux/lib
[ -d /work/main/tests/fixtures ] || { mkdir -p /work; ln -sfn "$PWD" /work/main; }
R=$work/res; rm -rf $R; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version --format=csv > $R/gpu.txt
B=$work/bin; t0=$SECONDS
log() { echo "$1 rc=$2 t=$((SECONDS-t0))" >> $R/rc.txt; tar -C $work -czf $OUT/res.tgz res; }
timeout 130 stdbuf -oL $B/kiln_gpu_tests --gtest_filter='CudaEngine.PlanIsRecorded*:CudaEngine.LoadBuildsOnly*:Fixtures/CudaRtDetr.*' > $R/t1.log 2>&1; log t1 $?
timeout 120 stdbuf -oL $B/kiln_gpu_tests --gtest_filter='CudaEngine.*:-CudaEngine.Thousand*:CudaEngine.PlanIsRecorded*:CudaEngine.LoadBuildsOnly*:CudaEngine.BatchesBuilt*:CudaEngine.BundleCarries*' > $R/t2.log 2>&1; log t2 $?
tar -C $work -czf $OUT/res.tgz res
