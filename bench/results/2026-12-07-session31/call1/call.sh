#!/usr/bin/env bash
# Session 31, call 1 (~6 min): session 30's call 2, which did not run, plus the default's groups.
# - The sm90 conv's engine test again, now that engines launch it without PDL (session 30: bits differed).
# - r18vd fp16 batch 1: the default (N) against --enable concat_mask (M), interleaved, 240 s for the first build.
# - The default's per-group table (`--profile`, `--trace`) at batch 1 and 8, for the card this call gets.
. tools/gpu/call_common.sh
full_fixture r18vd $R/fixtures.log; log fixture $?
N=$work/r18vd.b1.default.bundle M=$work/r18vd.b1.mask.bundle
rm -f $N $M
timeout 240 $kiln build $work/full/r18vd -o $N --backend cuda --precision fp16 --batch 1 > $R/build_N.log 2>&1; log build_N $?
timeout 60 $kiln build $work/full/r18vd -o $M --backend cuda --precision fp16 --batch 1 --enable concat_mask > $R/build_M.log 2>&1; log build_M $?
set --; for b in $N $M; do [ -f $b ] && set -- "$@" $b; done
for i in 1 2 3; do $kiln bench "$@" --batch 1 --iterations 300 >> $R/ab_b1.txt 2>&1; log ab$i $?; done
[ -f $N ] && $kiln bench $N --batch 1 --iterations 300 --profile 20 --trace 20 --json > $R/bench_b1.json 2> $R/bench_b1.err; log prof1 $?
timeout 60 $B/kiln_gpu_tests --gtest_filter='Fixtures/CudaRtDetr.Sm90Conv*/basic_1l' > $R/rtdetr_sm90.log 2>&1; log rtdetr_sm90 $?
E=$work/r18vd.b8.default.bundle; rm -f $E
timeout 150 $kiln build $work/full/r18vd -o $E --backend cuda --precision fp16 --batch 8 > $R/build_E.log 2>&1; log build_E $?
[ -f $E ] && $kiln bench $E --batch 8 --iterations 200 --profile 10 --trace 10 --json > $R/bench_b8.json 2> $R/bench_b8.err; log prof8 $?
tar -C $work -czf $OUT/res.tgz res
