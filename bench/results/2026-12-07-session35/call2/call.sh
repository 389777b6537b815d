#!/usr/bin/env bash
# Session 35's device call 2 (same warm H100 right after call 1, same payload): what call 1's short form left
# out. Batch 1, three interleaved rounds: T (default), M (--enable memset_kernels), E (--disable late_side_fork),
# outputs bit for bit; T's per-group profile; the op harness' deform cases (the warp form restored); the fixture
# tests against PyTorch (fp16 detections, fp32).
. tools/gpu/call_common.sh
full_fixture r18vd $R/fixtures.log; log fixture $?
bb() { echo $work/r18vd.b$1.$2.bundle; }
build() {  # BATCH NAME FLAGS...
  local b=$1 n=$2; shift 2
  [ -f $(bb $b $n) ] || timeout 200 $kiln build $work/full/r18vd -o $(bb $b $n) --backend cuda --precision fp16 --batch $b "$@" > $R/build_$n$b.log 2>&1; log build_$n$b $?
}
build 1 T; build 1 M --enable memset_kernels; build 1 E --disable late_side_fork
set --; for n in T M E; do [ -f $(bb 1 $n) ] && set -- "$@" $(bb 1 $n); done
for i in 1 2 3; do $kiln bench "$@" --batch 1 --iterations 300 >> $R/ab_b1.txt 2>&1; log ab$i $?; done
for n in T M E; do [ -f $(bb 1 $n) ] && $kiln run $(bb 1 $n) --input pixel_values=$work/full/r18vd/input.npy --output-dir $R/out_$n > $R/run_$n.log 2>&1; done
for n in M E; do cmp $R/out_$n/logits.npy $R/out_T/logits.npy && cmp $R/out_$n/pred_boxes.npy $R/out_T/pred_boxes.npy; log same_bits_$n $?; done
$kiln bench $(bb 1 T) --batch 1 --iterations 300 --profile 20 > $R/profile_T.txt 2>&1; log profile_T $?
timeout 60 $B/kiln_ops_tests --gtest_filter='*deform*' > $R/ops.log 2>&1; log ops $?
timeout 150 $B/kiln_gpu_tests --gtest_filter='Fixtures/CudaRtDetr.Fp16DetectionsMatchPyTorch/*:Fixtures/CudaRtDetr.Fp32MatchesPyTorch/*' > $R/rtdetr.log 2>&1; log rtdetr $?
tar -C $work -czf $OUT/res.tgz res
