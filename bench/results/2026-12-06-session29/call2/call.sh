#!/usr/bin/env bash
# Session 29, call 2 (short form of call 1, for ~300 s of device time): the sm90 and direct convs against
# the CPU reference; r18vd fp16 batch 1 built with the default (N) and with --enable
# linear_norm,concat_mask,sm90_conv,direct_conv (S), benched interleaved; S's --trace; the conv probe.
. tools/gpu/call_common.sh
timeout 90 $B/kiln_gpu_tests --gtest_filter='CudaSm90Conv.*:CudaDirectConv*' > $R/sm90.log 2>&1; log sm90 $?
full_fixture r18vd $R/fixtures.log; log fixture $?
N=$work/r18vd.b1.default.bundle S=$work/r18vd.b1.sm90.bundle
rm -f $N $S
timeout 120 $kiln build $work/full/r18vd -o $N --backend cuda --precision fp16 --batch 1 > $R/build_N.log 2>&1; log build_N $?
timeout 120 $kiln build $work/full/r18vd -o $S --backend cuda --precision fp16 --batch 1 --enable linear_norm,concat_mask,sm90_conv,direct_conv > $R/build_S.log 2>&1; log build_S $?
[ -f $S ] && for i in 1 2 3; do $kiln bench $N $S --batch 1 --iterations 300 >> $R/ab_b1.txt 2>&1; done; log ab $?
[ -f $S ] && { $kiln inspect $S > $R/inspect_S.txt 2>&1; $kiln bench $S --batch 1 --iterations 300 --trace 20 --json > $R/bench_b1.json 2>&1; log bench_b1 $?; }
timeout 100 $B/kiln_gpu_tests --gtest_filter='CudaIgemmConvPerf.*' > $R/conv_perf.log 2>&1; log conv_perf $?
tar -C $work -czf $OUT/res.tgz res
