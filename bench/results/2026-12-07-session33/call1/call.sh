#!/usr/bin/env bash
# Session 33's device call 1 (~9 min): session 32's call (never run: no device time), plus the two-lane trace.
# `KILN_PACK_BUILD=build bash tools/gpu/pack.sh`, copy this file to .gpu/call1.sh, run `bash .gpu/call1.sh` with .gpu
# carried, timeout_s 600; the results come back as $OUT/res.tgz (tarred after every step, most useful first).
# - kiln bench --trace now traces the engine's own graph, side lane included (KernelTrace.*: the GPU test checks
#   every launch has its step and lane); trace_T is the default engine's.
# - Correctness of what is off until it has run: top_k's cluster form against the one-block kernel bit for bit, the
#   attention's wide form against blocks of 4 warps bit for bit, the op harness' top_k and attention cases (both
#   switches on there) against the CPU reference, the sm90 conv's repeat-launch test.
# - Probes: top_k both forms; attention per (split, query groups).
# - r18vd fp16 batch 1, interleaved: T (default), N (--enable cluster_top_k), W (--enable wide_attention); N's and
#   W's outputs against T's, bit for bit, on the full-size input; the fixture tests of the default path.
# - Nsight Compute on the decoder's own kernels with the SASS lines they stall on (SourceCounters).
. tools/gpu/call_common.sh
timeout 90 $B/kiln_gpu_tests --gtest_filter='CudaKernels.TopKClusterFormMatchesOneBlock:CudaKernels.AttentionWide*:CudaRtDetrKernelsPerf.TopK:CudaRtDetrKernelsPerf.AttentionSplits:KernelTrace.*' > $R/kernels.log 2>&1; log kernels $?
timeout 150 $B/kiln_ops_tests --gtest_filter='*top_k*:*attention*' > $R/ops.log 2>&1; log ops $?
timeout 90 $B/kiln_gpu_tests --gtest_filter='CudaSm90Conv.RepeatedLaunchesGiveTheSameBits' > $R/sm90_repeat.log 2>&1; log sm90_repeat $?
full_fixture r18vd $R/fixtures.log; log fixture $?
T=$work/r18vd.b1.default.bundle N=$work/r18vd.b1.cluster.bundle W=$work/r18vd.b1.wide.bundle
rm -f $T $N $W
timeout 240 $kiln build $work/full/r18vd -o $T --backend cuda --precision fp16 --batch 1 > $R/build_T.log 2>&1; log build_T $?
timeout 150 $kiln build $work/full/r18vd -o $N --backend cuda --precision fp16 --batch 1 --enable cluster_top_k > $R/build_N.log 2>&1; log build_N $?
timeout 150 $kiln build $work/full/r18vd -o $W --backend cuda --precision fp16 --batch 1 --enable wide_attention > $R/build_W.log 2>&1; log build_W $?
set --; for b in $T $N $W; do [ -f $b ] && set -- "$@" $b; done
for i in 1 2 3; do $kiln bench "$@" --batch 1 --iterations 300 >> $R/ab_b1.txt 2>&1; log ab$i $?; done
# The engines' outputs on the full-size input, bit for bit (both switches promise the same bits).
for b in T N W; do [ -f ${!b} ] && $kiln run ${!b} --input pixel_values=$work/full/r18vd/input.npy --output-dir $R/out_$b > $R/run_$b.log 2>&1; done
for b in N W; do cmp $R/out_$b/logits.npy $R/out_T/logits.npy && cmp $R/out_$b/pred_boxes.npy $R/out_T/pred_boxes.npy; log same_bits_$b $?; done
[ -f $T ] && $kiln bench $T --batch 1 --iterations 300 --trace 20 --json > $R/bench_T.json 2> $R/bench_T.err; log trace_T $?
[ -f $T ] && $kiln bench $T --batch 1 --iterations 300 --trace 20 > $R/bench_T.txt 2>&1
[ -f $N ] && $kiln bench $N --batch 1 --iterations 300 --trace 20 --json > $R/bench_N.json 2> $R/bench_N.err; log trace_N $?
[ -f $W ] && $kiln bench $W --batch 1 --iterations 300 --trace 20 --json > $R/bench_W.json 2> $R/bench_W.err; log trace_W $?
timeout 120 $B/kiln_gpu_tests --gtest_filter='Fixtures/CudaRtDetr.Fp16DetectionsMatchPyTorch/*:Fixtures/CudaRtDetr.Fp32MatchesPyTorch/*' > $R/rtdetr.log 2>&1; log rtdetr $?
# Nsight Compute (each kernel replayed alone): the decoder's attention (~8 us in the graph for 300 x 300 x 8 heads),
# the linked mlp_chain (~14 us for 5 small layers), top_k and the deformable core.
KILN_NCU_SECTIONS='--section SourceCounters' timeout 150 bash tools/gpu/ncu_kernels.sh $R r18vd 1 'attention_mma|mlp_chain|ms_deform|top_k' 12 > $R/ncu.log 2>&1; log ncu $?
tar -C $work -czf $OUT/res.tgz res
