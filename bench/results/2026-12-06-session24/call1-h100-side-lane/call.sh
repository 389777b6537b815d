#!/usr/bin/env bash
set -u
work=/tmp/kiln_prof; mkdir -p $work; tar -C $work -xJf .gpu/payload.tar.xz
export LD_LIBRARY_PATH=$work/lib:/usr/lib/x86_64-linux-gnu:/usr/local/cuda-13.0/targets/x86_64-linux/lib
[ -d /work/main/tests/fixtures ] || { mkdir -p /work; ln -sfn "$PWD" /work/main; }
R=$work/res; rm -rf $R; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version --format=csv > $R/gpu.txt
B=$work/bin; t0=$SECONDS
log() { echo "$1 rc=$2 t=$((SECONDS-t0))" >> $R/rc.txt; }
rm -f $work/r18vd.b*.bundle
timeout 150 tools/gpu/profile_kernels.sh $R/p1 r18vd 1 > $R/prof1.log 2>&1; log prof1 $?
KILN_PROFILE_TAG=noside KILN_BUILD_FLAGS="--disable side_lane" timeout 60 tools/gpu/profile_kernels.sh $R/p1 r18vd 1 > $R/prof1_noside.log 2>&1; log prof1n $?
$B/kiln bench $work/r18vd.b1.default.bundle $work/r18vd.b1.noside.bundle --batch 1 --iterations 300 > $R/bench_ab1.txt 2>&1; log ab1 $?
timeout 90 tools/gpu/profile_kernels.sh $R/p8 r18vd 8 > $R/prof8.log 2>&1; log prof8 $?
KILN_PROFILE_TAG=noside KILN_BUILD_FLAGS="--disable side_lane" timeout 60 tools/gpu/profile_kernels.sh $R/p8 r18vd 8 > $R/prof8_noside.log 2>&1; log prof8n $?
$B/kiln bench $work/r18vd.b8.default.bundle $work/r18vd.b8.noside.bundle --batch 8 --iterations 100 > $R/bench_ab8.txt 2>&1; log ab8 $?
timeout 60 stdbuf -oL $B/kiln_ops_tests --gtest_filter="Cases/OpCuda.*top_k*" > $R/ops_topk.log 2>&1; log ops_topk $?
timeout 60 cuda-gdb -batch -ex run -ex bt --args $B/kiln_ops_tests --gtest_filter='Cases/OpCuda.MatchesReference/group_conv_input_add_dw3x3_b1_f32' > $R/gdb_ops.log 2>&1; log gdb $?
timeout 100 stdbuf -oL $B/kiln_gpu_tests --gtest_filter='CudaEngine.*:-CudaEngine.Thousand*:CudaEngine.PlanIsRecorded*' > $R/gpu_tests.log 2>&1; log gpu_tests $?
KILN_SKIP_BENCH=1 timeout 200 tools/gpu/check_rtdetr.sh $R/rt > $R/rtdetr.log 2>&1; log rtdetr $?
tar -C $work -czf $OUT/res.tgz res
