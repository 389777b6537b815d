#!/usr/bin/env bash
# Session 29, call 3 (~7 min): after call 1 — the direct conv with its stem filters unrolled (3x3 and 7x7
# over RGB) against the CPU reference and cuDNN (CudaDirectConv*); r18vd fp16 batch 1 built with the default
# (N), --enable concat_mask (M: session 28's masked concat alone; call 1 measured it only together with
# small_gemm_norm, which loses) and --enable concat_mask,direct_conv (Q), benched interleaved; then the
# RT-DETR fixture tests of the sm90 conv and of the post-norm fusions (~7 min in all).
. tools/gpu/call_common.sh
timeout 40 $B/kiln_gpu_tests --gtest_filter='CudaDirectConv*' > $R/direct.log 2>&1; log direct $?
full_fixture r18vd $R/fixtures.log; log fixture $?
N=$work/r18vd.b1.default.bundle M=$work/r18vd.b1.mask.bundle Q=$work/r18vd.b1.mask_direct.bundle
rm -f $N $M $Q
timeout 110 $kiln build $work/full/r18vd -o $N --backend cuda --precision fp16 --batch 1 > $R/build_N.log 2>&1; log build_N $?
timeout 30 $kiln build $work/full/r18vd -o $M --backend cuda --precision fp16 --batch 1 --enable concat_mask > $R/build_M.log 2>&1; log build_M $?
timeout 30 $kiln build $work/full/r18vd -o $Q --backend cuda --precision fp16 --batch 1 --enable concat_mask,direct_conv > $R/build_Q.log 2>&1; log build_Q $?
set -- $N; [ -f $M ] && set -- "$@" $M; [ -f $Q ] && set -- "$@" $Q
for i in 1 2 3; do $kiln bench "$@" --batch 1 --iterations 300 >> $R/ab_b1.txt 2>&1; log ab$i $?; done
[ -f $Q ] && $kiln inspect $Q 2>&1 | grep -E "embedder|switches" > $R/inspect_Q.txt
# The fixture tests of the opt-in paths that call 1's 120 s step did not reach (~45 s each at opt level 3).
timeout 150 $B/kiln_gpu_tests --gtest_filter='Fixtures/CudaRtDetr.Sm90Conv*/basic_1l:Fixtures/CudaRtDetr.PostNorm*/basic_1l' > $R/rtdetr_gpu.log 2>&1; log rtdetr_gpu $?
tar -C $work -czf $OUT/res.tgz res
