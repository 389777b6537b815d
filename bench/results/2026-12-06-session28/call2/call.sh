#!/usr/bin/env bash
# Session 28, call 2 (call 1 never found a machine; 240 s of device time were left): the unit tests and
# probes of small_gemm_norm, small_gemm's GELU and attention's key split; r18vd fp16 batch 1 built at
# opt level 1 (heuristic tactics: fast builds) with --enable linear_norm,concat_mask and with the default, benched
# interleaved; the RT-DETR fixture test of the fusions; then, if time is left, the fused build at opt level 3.
. tools/gpu/call_common.sh
timeout 40 $B/kiln_gpu_tests --gtest_filter='CudaSmallGemm*:CudaRtDetrKernelsPerf.AttentionSplits' > $R/small_gemm.log 2>&1; log small_gemm $?
full_fixture r18vd $R/fixtures.log; log fixture $?
D=$work/r18vd.b1.o1.fused.bundle N=$work/r18vd.b1.o1.default.bundle
rm -f $D $N
timeout 60 $kiln build $work/full/r18vd -o $D --backend cuda --precision fp16 --batch 1 --opt-level 1 --enable linear_norm,concat_mask > $R/build_D.log 2>&1; log build_D $?
timeout 60 $kiln build $work/full/r18vd -o $N --backend cuda --precision fp16 --batch 1 --opt-level 1 > $R/build_N.log 2>&1; log build_N $?
for i in 1 2 3; do $kiln bench $D $N --batch 1 --iterations 300 >> $R/ab_b1_o1.txt 2>&1; done; log ab $?
$kiln bench $D --batch 1 --iterations 300 --trace 20 --json > $R/bench_b1_o1.json 2>&1; log bench_b1 $?
timeout 60 $B/kiln_gpu_tests --gtest_filter='Fixtures/CudaRtDetr.PostNorm*' > $R/rtdetr_gpu.log 2>&1; log rtdetr_gpu $?
E=$work/r18vd.b1.o3.fused.bundle; rm -f $E
timeout 150 $kiln build $work/full/r18vd -o $E --backend cuda --precision fp16 --batch 1 --enable linear_norm,concat_mask > $R/build_E.log 2>&1; log build_E $?
$kiln bench $E --batch 1 --iterations 300 --profile 20 --trace 20 --json > $R/bench_b1_o3.json 2>&1; log bench_b1_o3 $?
tar -C $work -czf $OUT/res.tgz res
