#!/usr/bin/env bash
# Session 29, call 1: kiln's sm90 conv (switch sm90_conv, CUTLASS TMA + wgmma with PDL) and session 28's
# small_gemm_norm / concat_rows_masked on a GPU for the first time. Ordered so that a call cut short still
# returns the most useful steps: the sm90 conv against the CPU reference; r18vd fp16 batch 1 built with the
# default (N), --enable linear_norm,concat_mask (D) and --enable linear_norm,concat_mask,sm90_conv (S,
# batches 1 and 8), benched interleaved; S's --profile/--trace; the conv probe (cuDNN, igemm, GEMM conv and
# each sm90 configuration per r18vd shape); session 28's probes; the RT-DETR fixture tests; the op harness.
. tools/gpu/call_common.sh
timeout 120 $B/kiln_gpu_tests --gtest_filter='CudaSm90Conv.*:CudaDirectConv*' > $R/sm90.log 2>&1; log sm90 $?
full_fixture r18vd $R/fixtures.log; log fixture $?
N=$work/r18vd.b1.default.bundle D=$work/r18vd.b1.norm.bundle S=$work/r18vd.b18.sm90.bundle
rm -f $N $D $S
timeout 150 $kiln build $work/full/r18vd -o $N --backend cuda --precision fp16 --batch 1 > $R/build_N.log 2>&1; log build_N $?
timeout 60 $kiln build $work/full/r18vd -o $D --backend cuda --precision fp16 --batch 1 --enable linear_norm,concat_mask > $R/build_D.log 2>&1; log build_D $?
timeout 200 $kiln build $work/full/r18vd -o $S --backend cuda --precision fp16 --batch 1,8 --enable linear_norm,concat_mask,sm90_conv,direct_conv > $R/build_S.log 2>&1; log build_S $?
set -- $N $D; [ -f $S ] && set -- $N $D $S
for i in 1 2 3; do $kiln bench "$@" --batch 1 --iterations 300 >> $R/ab_b1.txt 2>&1; done; log ab $?
if [ -f $S ]; then
  $kiln inspect $S > $R/inspect_S.txt 2>&1
  $kiln bench $S --batch 1 --iterations 300 --profile 20 --trace 20 --json > $R/bench_b1.json 2>&1; log bench_b1 $?
  $kiln bench $S --batch 8 --iterations 300 --json > $R/bench_b8.json 2>&1; log bench_b8 $?
fi
timeout 150 $B/kiln_gpu_tests --gtest_filter='CudaIgemmConvPerf.*' > $R/conv_perf.log 2>&1; log conv_perf $?
timeout 60 $B/kiln_gpu_tests --gtest_filter='CudaSmallGemm*:CudaRtDetrKernelsPerf.AttentionSplits' > $R/small_gemm.log 2>&1; log small_gemm $?
timeout 120 $B/kiln_gpu_tests --gtest_filter='Fixtures/CudaRtDetr.PostNorm*:Fixtures/CudaRtDetr.SmallGemm*:Fixtures/CudaRtDetr.Sm90Conv*' > $R/rtdetr_gpu.log 2>&1; log rtdetr_gpu $?
timeout 60 $B/kiln_ops_tests --gtest_filter='*linear_norm*:*concat_mask*:*mlp_chain_norm_out_proj*:*stem_c3_k16*:*c4_k8_5x5*:*c64_k128_3x3*:*c128_k64_1x1*:*c32_k64_3x3*:*c64_k32_3x3*' > $R/ops.log 2>&1; log ops $?
tar -C $work -czf $OUT/res.tgz res
