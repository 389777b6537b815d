#!/usr/bin/env bash
# Session 25, call 1: conv_knobs (cuDNN knob variants) probe, correctness, engine A/B; H200/H100 baseline.
set -u
work=/tmp/kiln_prof; mkdir -p $work; tar -C $work -xJf .gpu/payload.tar.xz
export LD_LIBRARY_PATH=$work/lib:/usr/lib/x86_64-linux-gnu:/usr/local/cuda-13.0/targets/x86_64-linux/lib
[ -d /work/main/tests/fixtures ] || { mkdir -p /work; ln -sfn "$PWD" /work/main; }
R=$work/res; rm -rf $R; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version --format=csv > $R/gpu.txt
B=$work/bin; t0=$SECONDS
log() { echo "$1 rc=$2 t=$((SECONDS-t0))" >> $R/rc.txt; tar -C $work -czf $OUT/res.tgz res; }
rm -f $work/r18vd.b*.bundle
timeout 100 stdbuf -oL $B/kiln_gpu_tests --gtest_filter='CudaConv.Knob*' > $R/knob_tests.log 2>&1; log knob_tests $?
timeout 200 stdbuf -oL $B/kiln_gpu_tests --gtest_filter='CudaConvPerf.KnobVariants*' > $R/knob_perf.log 2>&1; log knob_perf $?
KILN_AB_ENABLE=1 timeout 200 tools/gpu/switch_ab.sh $R/ab1 r18vd 1 conv_knobs 300 > $R/ab1.log 2>&1; log ab1 $?
cp $work/r18vd.b1.ab_default.bundle $work/r18vd.b1.default.bundle 2>/dev/null
timeout 60 tools/gpu/profile_kernels.sh $R/p1 r18vd 1 > $R/prof1.log 2>&1; log prof1 $?
[ -f $work/r18vd.b1.ab_conv_knobs.bundle ] && cp $work/r18vd.b1.ab_conv_knobs.bundle $work/r18vd.b1.knobs.bundle && \
  KILN_PROFILE_TAG=knobs timeout 40 tools/gpu/profile_kernels.sh $R/p1 r18vd 1 > $R/prof1k.log 2>&1; log prof1k $?
tar -C $work -czf $OUT/res.tgz res
