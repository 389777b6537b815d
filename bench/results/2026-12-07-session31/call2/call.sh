#!/usr/bin/env bash
# Superseded (session 32, no device time): ../../2026-12-07-session32/call1/call.sh runs all of this and more; run that instead.
# Session 31, call 2 (~5 min). It did not run in session 31 (no machine; then no device time): run it first next
# session, after `KILN_PACK_BUILD=build bash tools/gpu/pack.sh`, as `bash .gpu/call2.sh` with .gpu carried.
# - top_k: the cluster form (switch cluster_top_k, off until this runs) against the one-block kernel, bit for bit,
#   the probe of both; the op harness' top_k cases (the default one-block path, refactored in 52cad05) against the
#   CPU reference.
# - The sm90 conv: repeated launches at r18vd's full-size shapes, bit for bit (kernel or engine?).
# - r18vd fp16 batch 1: --enable cluster_top_k (N) against --disable cluster_top_k (T), interleaved; N's in-graph
#   trace (the top_k step's time); both engines' outputs on the full-size input, bit for bit; the RT-DETR fixture
#   tests of the default path.
. tools/gpu/call_common.sh
timeout 60 $B/kiln_gpu_tests --gtest_filter='CudaKernels.TopKClusterFormMatchesOneBlock:CudaRtDetrKernelsPerf.TopK' > $R/top_k.log 2>&1; log top_k $?
timeout 90 $B/kiln_ops_tests --gtest_filter='*top_k*' > $R/ops_top_k.log 2>&1; log ops_top_k $?
timeout 90 $B/kiln_gpu_tests --gtest_filter='CudaSm90Conv.RepeatedLaunchesGiveTheSameBits' > $R/sm90_repeat.log 2>&1; log sm90_repeat $?
full_fixture r18vd $R/fixtures.log; log fixture $?
N=$work/r18vd.b1.cluster.bundle T=$work/r18vd.b1.oneblock.bundle
rm -f $N $T
timeout 240 $kiln build $work/full/r18vd -o $N --backend cuda --precision fp16 --batch 1 --enable cluster_top_k > $R/build_N.log 2>&1; log build_N $?
timeout 60 $kiln build $work/full/r18vd -o $T --backend cuda --precision fp16 --batch 1 --disable cluster_top_k > $R/build_T.log 2>&1; log build_T $?
set --; for b in $N $T; do [ -f $b ] && set -- "$@" $b; done
for i in 1 2 3; do $kiln bench "$@" --batch 1 --iterations 300 >> $R/ab_b1.txt 2>&1; log ab$i $?; done
[ -f $N ] && $kiln bench $N --batch 1 --iterations 300 --trace 20 --json > $R/bench_b1.json 2> $R/bench_b1.err; log trace1 $?
# The two engines' outputs on the full-size input, bit for bit.
for b in N T; do [ -f ${!b} ] && $kiln run ${!b} --input pixel_values=$work/full/r18vd/input.npy --output-dir $R/out_$b > $R/run_$b.log 2>&1; done
cmp $R/out_N/logits.npy $R/out_T/logits.npy && cmp $R/out_N/pred_boxes.npy $R/out_T/pred_boxes.npy; log same_bits $?
timeout 120 $B/kiln_gpu_tests --gtest_filter='Fixtures/CudaRtDetr.Fp16DetectionsMatchPyTorch/*:Fixtures/CudaRtDetr.Fp32MatchesPyTorch/*' > $R/rtdetr.log 2>&1; log rtdetr $?
tar -C $work -czf $OUT/res.tgz res
