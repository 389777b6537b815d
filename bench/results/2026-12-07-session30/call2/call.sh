#!/usr/bin/env bash
# Session 30, call 2 (~5 min): after call 1.
# - The sm90 conv's engine test again, now that engines launch it without PDL (call 1: bits differed from call to call).
# - r18vd fp16 batch 1: the default (N) against --enable concat_mask (M), interleaved; call 1's default build hit its
#   110 s timeout on the fresh machine, so this one gets 240 s.
. tools/gpu/call_common.sh
timeout 60 $B/kiln_gpu_tests --gtest_filter='Fixtures/CudaRtDetr.Sm90Conv*/basic_1l' > $R/rtdetr_sm90.log 2>&1; log rtdetr_sm90 $?
full_fixture r18vd $R/fixtures.log; log fixture $?
N=$work/r18vd.b1.default.bundle M=$work/r18vd.b1.mask.bundle
rm -f $N $M
timeout 240 $kiln build $work/full/r18vd -o $N --backend cuda --precision fp16 --batch 1 > $R/build_N.log 2>&1; log build_N $?
timeout 40 $kiln build $work/full/r18vd -o $M --backend cuda --precision fp16 --batch 1 --enable concat_mask > $R/build_M.log 2>&1; log build_M $?
# Only the bundles that were built (call 1 benched a missing one and lost its A/B).
set --; for b in $N $M; do [ -f $b ] && set -- "$@" $b; done
for i in 1 2 3; do $kiln bench "$@" --batch 1 --iterations 300 >> $R/ab_b1.txt 2>&1; log ab$i $?; done
tar -C $work -czf $OUT/res.tgz res
