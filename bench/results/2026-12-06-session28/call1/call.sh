#!/usr/bin/env bash
# Session 28, call 1: small_gemm_norm (switch linear_norm), concat_rows_masked and small_gemm's GELU on a
# GPU for the first time — unit tests and probes; r18vd fp16 built with --enable linear_norm,concat_mask (batches 1 and 8:
# engine time, --profile and --trace at batch 1) and with the default (batch 1), benched
# interleaved; the RT-DETR fixture test of the fusions; the op harness' new groups. Ordered so that a
# call cut short (little device time was left) still returns the most useful steps.
. tools/gpu/call_common.sh
timeout 60 $B/kiln_gpu_tests --gtest_filter='CudaSmallGemm*:CudaRtDetrKernelsPerf.AttentionSplits' > $R/small_gemm.log 2>&1; log small_gemm $?
full_fixture r18vd $R/fixtures.log; log fixture $?
D=$work/r18vd.b18.fused.bundle N=$work/r18vd.b1.default.bundle
rm -f $D $N
timeout 150 $kiln build $work/full/r18vd -o $D --backend cuda --precision fp16 --batch 1,8 --enable linear_norm,concat_mask > $R/build_D.log 2>&1; log build_D $?
$kiln bench $D --batch 1 --iterations 300 --profile 20 --trace 20 --json > $R/bench_b1.json 2>&1; log bench_b1 $?
$kiln bench $D --batch 8 --iterations 300 --json > $R/bench_b8.json 2>&1; log bench_b8 $?
timeout 150 $kiln build $work/full/r18vd -o $N --backend cuda --precision fp16 --batch 1 > $R/build_N.log 2>&1; log build_N $?
for i in 1 2 3; do $kiln bench $D $N --batch 1 --iterations 300 >> $R/ab_b1.txt 2>&1; done; log ab $?
$kiln inspect $D > $R/inspect_D.txt 2>&1
timeout 90 $B/kiln_gpu_tests --gtest_filter='Fixtures/CudaRtDetr.PostNorm*:Fixtures/CudaRtDetr.SmallGemm*' > $R/rtdetr_gpu.log 2>&1; log rtdetr_gpu $?
timeout 60 $B/kiln_ops_tests --gtest_filter='*linear_norm*:*concat_mask*:*mlp_chain_norm_out_proj*' > $R/ops.log 2>&1; log ops $?
tar -C $work -czf $OUT/res.tgz res
