#!/usr/bin/env bash
# Session 34's call 2, cut to the device time left (~3.5 min): the restored warp form's bit test and probe; r18vd
# fp16 batch 1 T (default) / M (+ memset_kernels) / E (--disable late_side_fork), three rounds, bits against T;
# batch 8 T8 (default: late fork, warp form) / P8 (--disable late_side_fork,warp_deform), two rounds.
. tools/gpu/call_common.sh
timeout 60 $B/kiln_gpu_tests --gtest_filter='CudaKernels.DeformWarp*:CudaRtDetrKernelsPerf.Deform' > $R/kernels.log 2>&1; log kernels $?
full_fixture r18vd $R/fixtures.log; log fixture $?
bb() { echo $work/r18vd.b$1.$2.bundle; }
rm -f $work/r18vd.b*.bundle
build() {  # BATCH NAME FLAGS...
  local b=$1 n=$2; shift 2
  timeout 120 $kiln build $work/full/r18vd -o $(bb $b $n) --backend cuda --precision fp16 --batch $b "$@" > $R/build_$n$b.log 2>&1; log build_$n$b $?
}
build 1 T; build 1 M --enable memset_kernels; build 1 E --disable late_side_fork
set --; for n in T M E; do [ -f $(bb 1 $n) ] && set -- "$@" $(bb 1 $n); done
for i in 1 2 3; do $kiln bench "$@" --batch 1 --iterations 300 >> $R/ab_b1.txt 2>&1; log ab$i $?; done
for n in T M E; do [ -f $(bb 1 $n) ] && $kiln run $(bb 1 $n) --input pixel_values=$work/full/r18vd/input.npy --output-dir $R/out_$n > $R/run_$n.log 2>&1; done
for n in M E; do cmp $R/out_$n/logits.npy $R/out_T/logits.npy && cmp $R/out_$n/pred_boxes.npy $R/out_T/pred_boxes.npy; log same_bits_$n $?; done
build 8 T; build 8 P --disable late_side_fork,warp_deform
set --; for n in T P; do [ -f $(bb 8 $n) ] && set -- "$@" $(bb 8 $n); done
for i in 1 2; do $kiln bench "$@" --batch 8 --iterations 200 >> $R/ab_b8.txt 2>&1; log ab8_$i $?; done
tar -C $work -czf $OUT/res.tgz res
