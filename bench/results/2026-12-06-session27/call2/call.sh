#!/usr/bin/env bash
# Session 27, call 2 (same warm H100 as call 1): bundle A from call 1 (default switches, batches 1,8) against
# the same model built with --enable small_gemm at batch 1, interleaved; then the small_gemm bundle's trace.
set -u
work=/tmp/kiln_prof
. tools/gpu/full_fixture.sh
R=$work/res2; rm -rf $R; mkdir -p $R; t0=$SECONDS
log() { echo "$1 rc=$2 t=$((SECONDS-t0))" >> $R/rc.txt; tar -C $work -czf $OUT/res.tgz res2; }
full_fixture r18vd $R/fixtures.log; log fixture $?
A=$work/r18vd.b18.s27.bundle S=$work/r18vd.b1.sg.s27.bundle
[ -f $A ] || timeout 200 $kiln build $work/full/r18vd -o $A --backend cuda --precision fp16 --batch 1,8 > $R/build_A.log 2>&1; log build_A $?
timeout 150 $kiln build $work/full/r18vd -o $S --backend cuda --precision fp16 --batch 1 --enable small_gemm > $R/build_S.log 2>&1; log build_S $?
for i in 1 2 3; do $kiln bench $A $S --batch 1 --iterations 300 >> $R/ab_b1.txt 2>&1; done; log ab $?
$kiln bench $S --batch 1 --iterations 50 --trace 20 --json > $R/trace_S_b1.json 2>&1
python3 tools/gpu/compare_rtdetr.py trace --bench $R/trace_S_b1.json > $R/groups_S_b1.txt 2>&1; log groups_S $?
tar -C $work -czf $OUT/res.tgz res2
