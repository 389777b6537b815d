#!/usr/bin/env bash
# Session 27, call 4: switch small_gemm's auto setting (the shapes where it won) — r18vd fp16 batch 1 built with
# the default (auto), --disable small_gemm and --enable small_gemm, benched interleaved; the default's engine
# time, --profile and --trace at batch 1 (and batch 8, where auto takes nothing); the full-size PyTorch check of
# the default.
set -u
work=/tmp/kiln_prof; mkdir -p $work; rm -rf $work/bin; tar -C $work -xJf .gpu/payload.tar.xz
. tools/gpu/full_fixture.sh
[ -d /work/main/tests/fixtures ] || { mkdir -p /work; ln -sfn "$PWD" /work/main; }
R=$work/res; rm -rf $R; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > $R/gpu.txt
B=$work/bin; t0=$SECONDS
log() { echo "$1 rc=$2 t=$((SECONDS-t0))" >> $R/rc.txt; tar -C $work -czf $OUT/res.tgz res; }
timeout 30 $B/kiln_gpu_tests --gtest_filter='CudaSmallGemm*' > $R/small_gemm.log 2>&1; log small_gemm $?
full_fixture r18vd $R/fixtures.log; log fixture $?
D=$work/r18vd.b18.auto.bundle N=$work/r18vd.b1.off.bundle E=$work/r18vd.b1.on.bundle
rm -f $D $N $E
timeout 200 $kiln build $work/full/r18vd -o $D --backend cuda --precision fp16 --batch 1,8 --json > $R/build_D.json 2> $R/build_D.log; log build_D $?
timeout 100 $kiln build $work/full/r18vd -o $N --backend cuda --precision fp16 --batch 1 --disable small_gemm > $R/build_N.log 2>&1; log build_N $?
timeout 100 $kiln build $work/full/r18vd -o $E --backend cuda --precision fp16 --batch 1 --enable small_gemm > $R/build_E.log 2>&1; log build_E $?
for i in 1 2 3; do $kiln bench $D $N $E --batch 1 --iterations 300 >> $R/ab_b1.txt 2>&1; done; log ab $?
$kiln inspect $D > $R/inspect_D.txt 2>&1
for b in 1 8; do
  $kiln bench $D --batch $b --iterations 300 --profile 20 --trace 20 --json > $R/bench_b$b.json 2>&1
  $kiln bench $D --batch $b --iterations 300 --profile 20 --trace 20 > $R/bench_b$b.txt 2>&1; log bench_b$b $?
done
KILN_SKIP_BENCH=1 timeout 240 tools/gpu/check_rtdetr.sh $R/check > $R/check.log 2>&1; log check $?
tar -C $work -czf $OUT/res.tgz res
