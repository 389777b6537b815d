#!/usr/bin/env bash
set -u
work=/tmp/kiln_prof; mkdir -p $work; tar -C $work -xJf .gpu/payload.tar.xz
export LD_LIBRARY_PATH=$work/lib:/usr/lib/x86_64-linux-gnu:/usr/local/cuda-13.0/targets/x86_64-linux/lib
[ -d /work/main/tests/fixtures ] || { mkdir -p /work; ln -sfn "$PWD" /work/main; }
R=$work/res; rm -rf $R; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version --format=csv > $R/gpu.txt
B=$work/bin; t0=$SECONDS
log() { echo "$1 rc=$2 t=$((SECONDS-t0))" >> $R/rc.txt; tar -C $work -czf $OUT/res.tgz res; }
rm -f $work/r18vd.b*.bundle
timeout 30 stdbuf -oL $B/kiln_ops_tests --gtest_filter="Cases/OpCuda.*top_k*:Cases/OpCuda.*group*" > $R/ops.log 2>&1; log ops $?
timeout 60 stdbuf -oL $B/kiln_gpu_tests --gtest_filter='CudaEngine.PlanIsRecorded*:CudaEngine.LoadBuildsOnly*:Fixtures/CudaRtDetr.SideLane*' > $R/gpu_tests.log 2>&1; log gpu_tests $?
timeout 50 stdbuf -oL $B/kiln_gpu_tests --gtest_filter='Fixtures/CudaFixture.Fp32MatchesPyTorchAndCpu/*' > $R/gpu_fixtures.log 2>&1; log gpu_fixtures $?
tar -C $work -czf $OUT/res.tgz res
