#!/usr/bin/env bash
# Session 25, call 2: gemm_conv correctness + A/B on top of conv_knobs (now default), PyTorch check of the default, knob sweep.
set -u
work=/tmp/kiln_prof; mkdir -p $work; tar -C $work -xJf .gpu/payload.tar.xz
export LD_LIBRARY_PATH=$work/lib:/usr/lib/x86_64-linux-gnu:/usr/local/cuda-13.0/targets/x86_64-linux/lib
[ -d /work/main/tests/fixtures ] || { mkdir -p /work; ln -sfn "$PWD" /work/main; }
R=$work/res; rm -rf $R; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version --format=csv > $R/gpu.txt
B=$work/bin; t0=$SECONDS
log() { echo "$1 rc=$2 t=$((SECONDS-t0))" >> $R/rc.txt; tar -C $work -czf $OUT/res.tgz res; }
rm -f $work/r18vd.b*.bundle
timeout 120 stdbuf -oL $B/kiln_gpu_tests --gtest_filter='GemmConvRules.*:CudaGemmConv.*' > $R/gemm_tests.log 2>&1; log gemm_tests $?
KILN_AB_ENABLE=1 timeout 220 tools/gpu/switch_ab.sh $R/ab1 r18vd 1 gemm_conv 300 > $R/ab1.log 2>&1; log ab1_gemm $?
KILN_SKIP_BENCH=1 timeout 200 tools/gpu/check_rtdetr.sh $R/rt > $R/rtdetr.log 2>&1; log rtdetr $?
timeout 60 stdbuf -oL $B/kiln_gpu_tests --gtest_filter='CudaIgemmConvPerf.RtDetrR18vdShapes' > $R/gemm_perf.log 2>&1; log gemm_perf $?
tar -C $work -czf $OUT/res.tgz res
