#!/usr/bin/env bash
# Session 33's device call 2 (~4 min, cut to what a timeout of 150 s reaches; results as $OUT/res.tgz, tarred after
# every step, most useful first). After call 1 (H100):
# cluster_top_k and wide_attention are on by default (same bits, faster in the probes and the in-graph trace);
# ms_deform_attn's warp form is rewritten (step 1 from shared memory, 2 warps a block, 8 loads in flight).
# - the bit tests of the three forms, the warp form's probe against the block form (batch 1 and 8);
# - r18vd fp16 batch 1, interleaved: O (--disable cluster_top_k,wide_attention: the old default), T (the new
#   default), D (T + --enable warp_deform); O's, T's and D's outputs bit for bit; T's two-lane trace;
# - the op harness' deform, top_k and attention cases; batch 8: T8 and D8 interleaved.
. tools/gpu/call_common.sh
timeout 60 $B/kiln_gpu_tests --gtest_filter='CudaKernels.TopKClusterFormMatchesOneBlock:CudaKernels.AttentionWide*:CudaKernels.DeformWarp*:CudaRtDetrKernelsPerf.Deform' > $R/kernels.log 2>&1; log kernels $?
full_fixture r18vd $R/fixtures.log; log fixture $?
O=$work/r18vd.b1.old.bundle T=$work/r18vd.b1.default.bundle D=$work/r18vd.b1.deform.bundle
rm -f $O $T $D
timeout 200 $kiln build $work/full/r18vd -o $T --backend cuda --precision fp16 --batch 1 > $R/build_T.log 2>&1; log build_T $?
timeout 60 $kiln build $work/full/r18vd -o $O --backend cuda --precision fp16 --batch 1 --disable cluster_top_k,wide_attention > $R/build_O.log 2>&1; log build_O $?
timeout 60 $kiln build $work/full/r18vd -o $D --backend cuda --precision fp16 --batch 1 --enable warp_deform > $R/build_D.log 2>&1; log build_D $?
set --; for b in $O $T $D; do [ -f $b ] && set -- "$@" $b; done
for i in 1 2 3; do $kiln bench "$@" --batch 1 --iterations 300 >> $R/ab_b1.txt 2>&1; log ab$i $?; done
for b in O T D; do [ -f ${!b} ] && $kiln run ${!b} --input pixel_values=$work/full/r18vd/input.npy --output-dir $R/out_$b > $R/run_$b.log 2>&1; done
for b in T D; do cmp $R/out_$b/logits.npy $R/out_O/logits.npy && cmp $R/out_$b/pred_boxes.npy $R/out_O/pred_boxes.npy; log same_bits_$b $?; done
[ -f $T ] && $kiln bench $T --batch 1 --iterations 300 --trace 20 --json > $R/bench_T.json 2> $R/bench_T.err; log trace_T $?
timeout 60 $B/kiln_ops_tests --gtest_filter='*deform*:*top_k*:*attention*' > $R/ops.log 2>&1; log ops $?
T8=$work/r18vd.b8.default.bundle D8=$work/r18vd.b8.deform.bundle
timeout 150 $kiln build $work/full/r18vd -o $T8 --backend cuda --precision fp16 --batch 8 > $R/build_T8.log 2>&1; log build_T8 $?
timeout 60 $kiln build $work/full/r18vd -o $D8 --backend cuda --precision fp16 --batch 8 --enable warp_deform > $R/build_D8.log 2>&1; log build_D8 $?
set --; for b in $T8 $D8; do [ -f $b ] && set -- "$@" $b; done
for i in 1 2; do $kiln bench "$@" --batch 8 --iterations 200 >> $R/ab_b8.txt 2>&1; log ab8_$i $?; done
tar -C $work -czf $OUT/res.tgz res
