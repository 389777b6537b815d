#!/usr/bin/env bash
# Session 33's device call (~8 min; results come back as $OUT/res.tgz, tarred after every step, most useful first).
# `KILN_PACK_BUILD=build bash tools/gpu/pack.sh`, copy this file to .gpu/call1.sh, run `bash .gpu/call1.sh` with
# .gpu carried. It replaces session 32's call (never run), with the three same-bits forms in one bundle (X) to fit
# the session's device time; the probes time each form alone.
# - Correctness of what is off until it has run: top_k's cluster form, attention's wide form and ms_deform_attn's
#   warp form (new, switch warp_deform) against the default forms bit for bit; the two-lane trace (KernelTrace.*).
# - Probes: top_k both forms; attention per (split, query groups); ms_deform_attn block and warp forms.
# - r18vd fp16 batch 1, interleaved: T (default) and X (--enable cluster_top_k,wide_attention,warp_deform); X's
#   outputs against T's, bit for bit, on the full-size input; the engine's two-lane trace of each (kiln bench
#   --trace now traces the engine's own graph, side lane included).
# - Then the op harness' top_k, attention and deform cases (every switch on there), the fixture tests, Nsight
#   Compute with SourceCounters on the decoder's kernels, the sm90 repeat test.
. tools/gpu/call_common.sh
timeout 100 $B/kiln_gpu_tests --gtest_filter='CudaKernels.TopKClusterFormMatchesOneBlock:CudaKernels.AttentionWide*:CudaKernels.DeformWarp*:CudaRtDetrKernelsPerf.TopK:CudaRtDetrKernelsPerf.AttentionSplits:CudaRtDetrKernelsPerf.Deform:KernelTrace.*' > $R/kernels.log 2>&1; log kernels $?
full_fixture r18vd $R/fixtures.log; log fixture $?
T=$work/r18vd.b1.default.bundle X=$work/r18vd.b1.forms.bundle
rm -f $T $X
timeout 240 $kiln build $work/full/r18vd -o $T --backend cuda --precision fp16 --batch 1 > $R/build_T.log 2>&1; log build_T $?
timeout 150 $kiln build $work/full/r18vd -o $X --backend cuda --precision fp16 --batch 1 --enable cluster_top_k,wide_attention,warp_deform > $R/build_X.log 2>&1; log build_X $?
set --; for b in $T $X; do [ -f $b ] && set -- "$@" $b; done
for i in 1 2 3; do $kiln bench "$@" --batch 1 --iterations 300 >> $R/ab_b1.txt 2>&1; log ab$i $?; done
# The engines' outputs on the full-size input, bit for bit (the three forms promise the same bits).
for b in T X; do [ -f ${!b} ] && $kiln run ${!b} --input pixel_values=$work/full/r18vd/input.npy --output-dir $R/out_$b > $R/run_$b.log 2>&1; done
cmp $R/out_X/logits.npy $R/out_T/logits.npy && cmp $R/out_X/pred_boxes.npy $R/out_T/pred_boxes.npy; log same_bits_X $?
[ -f $T ] && $kiln bench $T --batch 1 --iterations 300 --trace 20 --json > $R/bench_T.json 2> $R/bench_T.err; log trace_T $?
[ -f $T ] && $kiln bench $T --batch 1 --iterations 300 --trace 20 > $R/bench_T.txt 2>&1
[ -f $X ] && $kiln bench $X --batch 1 --iterations 300 --trace 20 --json > $R/bench_X.json 2> $R/bench_X.err; log trace_X $?
timeout 150 $B/kiln_ops_tests --gtest_filter='*top_k*:*attention*:*deform*' > $R/ops.log 2>&1; log ops $?
timeout 120 $B/kiln_gpu_tests --gtest_filter='Fixtures/CudaRtDetr.Fp16DetectionsMatchPyTorch/*:Fixtures/CudaRtDetr.Fp32MatchesPyTorch/*' > $R/rtdetr.log 2>&1; log rtdetr $?
KILN_NCU_SECTIONS='--section SourceCounters' timeout 150 bash tools/gpu/ncu_kernels.sh $R r18vd 1 'attention_mma|mlp_chain|ms_deform|top_k' 12 > $R/ncu.log 2>&1; log ncu $?
timeout 90 $B/kiln_gpu_tests --gtest_filter='CudaSm90Conv.RepeatedLaunchesGiveTheSameBits' > $R/sm90_repeat.log 2>&1; log sm90_repeat $?
tar -C $work -czf $OUT/res.tgz res
