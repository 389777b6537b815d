#!/usr/bin/env bash
# Session 34's device call 2 (~6.5 min; results as $OUT/res.tgz, tarred after every step). After call 1 (H100):
# late_side_fork is on by default (r18vd batch 1 0.633 -> 0.628 ms), warp_deform's auto takes the warp form from
# 2400 queries a launch (batch 8: 2.051 -> 2.006 ms; batch 1 loses) and the warp form is session 33's first one
# again (faster at batch 8 than the rewrite), memset_kernels stays off (alone 0.631 against 0.633, but nothing on
# top of late_side_fork). This call checks the new defaults and settles memset_kernels:
# - the side lane's fixture bit test with the late fork (CudaRtDetr.SideLaneChangesNoBit); the warp form's bit
#   test and probe;
# - r18vd fp16 batch 1, five interleaved rounds: T (the new default), M (+ memset_kernels), E (--disable
#   late_side_fork); outputs bit for bit; T's two-lane trace and per-group profile;
# - batch 8, three rounds: T8 (default: late fork, warp form), M8 (+ memset_kernels), P8 (--disable
#   late_side_fork,warp_deform: session 33's default); T8's profile.
. tools/gpu/call_common.sh
timeout 150 $B/kiln_gpu_tests --gtest_filter='Fixtures/CudaRtDetr.SideLaneChangesNoBit/*:CudaKernels.DeformWarp*:CudaRtDetrKernelsPerf.Deform:GraphMemsets.*' > $R/kernels.log 2>&1; log kernels $?
full_fixture r18vd $R/fixtures.log; log fixture $?
bb() { echo $work/r18vd.b$1.$2.bundle; }
rm -f $work/r18vd.b*.bundle
build() {  # BATCH NAME FLAGS...
  local b=$1 n=$2; shift 2
  timeout 200 $kiln build $work/full/r18vd -o $(bb $b $n) --backend cuda --precision fp16 --batch $b "$@" > $R/build_$n$b.log 2>&1; log build_$n$b $?
}
build 1 T; build 1 M --enable memset_kernels; build 1 E --disable late_side_fork
set --; for n in T M E; do [ -f $(bb 1 $n) ] && set -- "$@" $(bb 1 $n); done
for i in 1 2 3 4 5; do $kiln bench "$@" --batch 1 --iterations 300 >> $R/ab_b1.txt 2>&1; log ab$i $?; done
for n in T M E; do [ -f $(bb 1 $n) ] && $kiln run $(bb 1 $n) --input pixel_values=$work/full/r18vd/input.npy --output-dir $R/out_$n > $R/run_$n.log 2>&1; done
for n in M E; do cmp $R/out_$n/logits.npy $R/out_T/logits.npy && cmp $R/out_$n/pred_boxes.npy $R/out_T/pred_boxes.npy; log same_bits_$n $?; done
$kiln bench $(bb 1 T) --batch 1 --iterations 300 --trace 20 --json > $R/bench_T.json 2> $R/bench_T.err; log trace_T $?
$kiln bench $(bb 1 T) --batch 1 --iterations 300 --profile 20 --trace 20 > $R/profile_T.txt 2>&1; log profile_T $?
build 8 T; build 8 M --enable memset_kernels; build 8 P --disable late_side_fork,warp_deform
set --; for n in T M P; do [ -f $(bb 8 $n) ] && set -- "$@" $(bb 8 $n); done
for i in 1 2 3; do $kiln bench "$@" --batch 8 --iterations 200 >> $R/ab_b8.txt 2>&1; log ab8_$i $?; done
$kiln bench $(bb 8 T) --batch 8 --iterations 200 --profile 20 --trace 20 > $R/profile_T8.txt 2>&1; log profile_T8 $?
tar -C $work -czf $OUT/res.tgz res
