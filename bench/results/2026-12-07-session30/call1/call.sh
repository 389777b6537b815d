#!/usr/bin/env bash
# Session 30, call 1 (~7 min; the most useful steps first, since little device time was left):
# - CudaDirectConv*: the register-blocked direct conv (a warp shares one 8-channel group, 4 pixels a thread) and its
#   NCHW f32 form against the CPU reference conv; the probe against cuDNN, and against the input's cast + cuDNN.
# - r18vd fp16 batch 1 built with the default (N), --enable direct_conv (P) and --enable concat_mask (M), benched
#   interleaved; the RT-DETR fixture test of the NCHW form; then --enable concat_mask,direct_conv (Q) and the fixture
#   tests of the other opt-in conv paths.
. tools/gpu/call_common.sh
timeout 60 $B/kiln_gpu_tests --gtest_filter='CudaDirectConv*' > $R/direct.log 2>&1; log direct $?
full_fixture r18vd $R/fixtures.log; log fixture $?
N=$work/r18vd.b1.default.bundle M=$work/r18vd.b1.mask.bundle P=$work/r18vd.b1.direct.bundle Q=$work/r18vd.b1.mask_direct.bundle
rm -f $N $M $P $Q
timeout 110 $kiln build $work/full/r18vd -o $N --backend cuda --precision fp16 --batch 1 > $R/build_N.log 2>&1; log build_N $?
timeout 40 $kiln build $work/full/r18vd -o $P --backend cuda --precision fp16 --batch 1 --enable direct_conv > $R/build_P.log 2>&1; log build_P $?
[ -f $P ] && $kiln inspect $P 2>&1 | grep -E "embedder|switches|to_nhwc" > $R/inspect_P.txt
timeout 40 $kiln build $work/full/r18vd -o $M --backend cuda --precision fp16 --batch 1 --enable concat_mask > $R/build_M.log 2>&1; log build_M $?
set -- $N; for b in $P $M; do [ -f $b ] && set -- "$@" $b; done
for i in 1 2 3; do $kiln bench "$@" --batch 1 --iterations 300 >> $R/ab_b1.txt 2>&1; log ab$i $?; done
timeout 75 $B/kiln_gpu_tests --gtest_filter='Fixtures/CudaRtDetr.DirectConvReadsTheEngineInput/basic_1l' > $R/rtdetr_direct.log 2>&1; log rtdetr_direct $?
timeout 40 $kiln build $work/full/r18vd -o $Q --backend cuda --precision fp16 --batch 1 --enable concat_mask,direct_conv > $R/build_Q.log 2>&1; log build_Q $?
[ -f $Q ] && $kiln bench $N $Q --batch 1 --iterations 300 >> $R/ab_q_b1.txt 2>&1; log abq $?
timeout 120 $B/kiln_gpu_tests --gtest_filter='Fixtures/CudaRtDetr.Sm90Conv*/basic_1l:Fixtures/CudaRtDetr.PostNorm*/basic_1l' > $R/rtdetr_gpu.log 2>&1; log rtdetr_gpu $?
tar -C $work -czf $OUT/res.tgz res
