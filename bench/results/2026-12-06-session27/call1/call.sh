#!/usr/bin/env bash
# Session 27, call 1: kiln 99382b3 — small_gemm's tests and probe (first GPU run), then one seeded r18vd
# bundle at batches 1,8 (default switches) and one at batch 1 with --enable small_gemm, benched interleaved,
# then the default bundle's per-group trace and per-layer profile at batches 1 and 8.
set -u
work=/tmp/kiln_prof; mkdir -p $work; rm -rf $work/bin; tar -C $work -xJf .gpu/payload.tar.xz
. tools/gpu/full_fixture.sh
[ -d /work/main/tests/fixtures ] || { mkdir -p /work; ln -sfn "$PWD" /work/main; }
R=$work/res; rm -rf $R; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > $R/gpu.txt
B=$work/bin; t0=$SECONDS
log() { echo "$1 rc=$2 t=$((SECONDS-t0))" >> $R/rc.txt; tar -C $work -czf $OUT/res.tgz res; }
timeout 150 $B/kiln_gpu_tests --gtest_filter='*SmallGemm*' > $R/small_gemm.log 2>&1; sg=$?; log small_gemm $sg
full_fixture r18vd $R/fixtures.log; log fixture $?
A=$work/r18vd.b18.s27.bundle S=$work/r18vd.b1.sg.s27.bundle
timeout 200 $kiln build $work/full/r18vd -o $A --backend cuda --precision fp16 --batch 1,8 > $R/build_A.log 2>&1; log build_A $?
if [ $sg = 0 ]; then
  timeout 150 $kiln build $work/full/r18vd -o $S --backend cuda --precision fp16 --batch 1 --enable small_gemm > $R/build_S.log 2>&1; log build_S $?
  for i in 1 2; do $kiln bench $A $S --batch 1 --iterations 300 >> $R/ab_b1.txt 2>&1; done; log ab $?
  $kiln bench $S --batch 1 --iterations 50 --trace 20 --json > $R/trace_S_b1.json 2>&1
  python3 tools/gpu/compare_rtdetr.py trace --bench $R/trace_S_b1.json > $R/groups_S_b1.txt 2>&1; log groups_S $?
fi
for b in 1 8; do
  $kiln bench $A --batch $b --iterations 300 --json > $R/bench_b$b.json 2>&1
  $kiln bench $A --batch $b --iterations 50 --trace 20 --json > $R/trace_b$b.json 2>&1
  python3 tools/gpu/compare_rtdetr.py trace --bench $R/trace_b$b.json > $R/groups_b$b.txt 2>&1
  $kiln bench $A --batch $b --iterations 50 --profile 20 > $R/profile_b$b.txt 2>&1; log prof_b$b $?
done
tar -C $work -czf $OUT/res.tgz res
