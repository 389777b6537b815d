#!/usr/bin/env bash
# Session 34's device call (~6 min; results as $OUT/res.tgz, tarred after every step, most useful first).
# `KILN_PACK_BUILD=build bash tools/gpu/pack.sh`, copy this file to .gpu/call1.sh, run `bash .gpu/call1.sh`
# with .gpu carried. It takes over session 33's call 2 (never ran) and adds two new switches:
# - memset_kernels: the captured call's memset nodes (cuDNN's split-K stem conv zeroes with one) become kiln
#   fill kernels (graph_memsets.hpp); the same bytes;
# - late_side_fork: the merged decoder value projection forks right before the query selection's top_k
#   instead of after the encoder's memory (side_lane.cpp); the same kernels, another order.
# Steps:
# - bit tests: memset rewrite (GraphMemsets.*), the three same-bits forms, the engine's two-lane trace test;
#   the ms_deform_attn warp form's rewrite (probe, batch 1 and 8);
# - r18vd fp16 batch 1, interleaved, three rounds: O (--disable cluster_top_k,wide_attention: session 32's
#   default), T (default), D (--enable warp_deform), M (--enable memset_kernels), L (--enable late_side_fork),
#   A (--enable memset_kernels,late_side_fork); every bundle's outputs against T's bit for bit; traces of T, M, L;
# - the op harness' deform, top_k and attention cases; batch 8: T8, D8, A8 interleaved;
# - the fixture tests (fp16 detections, fp32 against PyTorch) with the default forms.
. tools/gpu/call_common.sh
timeout 90 $B/kiln_gpu_tests --gtest_filter='GraphMemsets.*:CudaKernels.TopKClusterFormMatchesOneBlock:CudaKernels.AttentionWide*:CudaKernels.DeformWarp*:KernelTrace.EngineCallTracedWithBothLanes:CudaRtDetrKernelsPerf.Deform' > $R/kernels.log 2>&1; log kernels $?
full_fixture r18vd $R/fixtures.log; log fixture $?
b1() { echo $work/r18vd.b1.$1.bundle; }
rm -f $work/r18vd.b*.bundle
timeout 200 $kiln build $work/full/r18vd -o $(b1 T) --backend cuda --precision fp16 --batch 1 > $R/build_T.log 2>&1; log build_T $?
build() {  # NAME FLAGS...
  local n=$1; shift
  timeout 90 $kiln build $work/full/r18vd -o $(b1 $n) --backend cuda --precision fp16 --batch 1 "$@" > $R/build_$n.log 2>&1; log build_$n $?
}
build O --disable cluster_top_k,wide_attention
build D --enable warp_deform
build M --enable memset_kernels
build L --enable late_side_fork
build A --enable memset_kernels,late_side_fork
set --; for n in O T D M L A; do [ -f $(b1 $n) ] && set -- "$@" $(b1 $n); done
for i in 1 2 3; do $kiln bench "$@" --batch 1 --iterations 300 >> $R/ab_b1.txt 2>&1; log ab$i $?; done
for n in O T D M L A; do [ -f $(b1 $n) ] && $kiln run $(b1 $n) --input pixel_values=$work/full/r18vd/input.npy --output-dir $R/out_$n > $R/run_$n.log 2>&1; done
for n in O D M L A; do cmp $R/out_$n/logits.npy $R/out_T/logits.npy && cmp $R/out_$n/pred_boxes.npy $R/out_T/pred_boxes.npy; log same_bits_$n $?; done
for n in T M L A; do [ -f $(b1 $n) ] && $kiln bench $(b1 $n) --batch 1 --iterations 300 --trace 20 --json > $R/bench_$n.json 2> $R/bench_$n.err; log trace_$n $?; done
timeout 90 $B/kiln_ops_tests --gtest_filter='*deform*:*top_k*:*attention*' > $R/ops.log 2>&1; log ops $?
b8() { echo $work/r18vd.b8.$1.bundle; }
timeout 150 $kiln build $work/full/r18vd -o $(b8 T) --backend cuda --precision fp16 --batch 8 > $R/build_T8.log 2>&1; log build_T8 $?
timeout 60 $kiln build $work/full/r18vd -o $(b8 D) --backend cuda --precision fp16 --batch 8 --enable warp_deform > $R/build_D8.log 2>&1; log build_D8 $?
timeout 60 $kiln build $work/full/r18vd -o $(b8 A) --backend cuda --precision fp16 --batch 8 --enable memset_kernels,late_side_fork > $R/build_A8.log 2>&1; log build_A8 $?
set --; for n in T D A; do [ -f $(b8 $n) ] && set -- "$@" $(b8 $n); done
for i in 1 2; do $kiln bench "$@" --batch 8 --iterations 200 >> $R/ab_b8.txt 2>&1; log ab8_$i $?; done
timeout 150 $B/kiln_gpu_tests --gtest_filter='Fixtures/CudaRtDetr.Fp16DetectionsMatchPyTorch/*:Fixtures/CudaRtDetr.Fp32MatchesPyTorch/*' > $R/rtdetr.log 2>&1; log rtdetr $?
tar -C $work -czf $OUT/res.tgz res
