#!/usr/bin/env bash
# Session 35's device call 1 (~5 min; results as $OUT/res.tgz, tarred after every step, most useful first).
# `KILN_PACK_BUILD=build bash tools/gpu/pack.sh`, copy this file to .gpu/call1.sh, run `bash .gpu/call1.sh`
# with .gpu carried. New: switch weight_prefetch (off by default: one side-lane launch pulls the weights of the
# call's last steps, up to 6 M elements, into L2 before they run; weight_prefetch.hpp). Also session 34's call 2,
# which never ran: the warp deform form is session 33's first one again (warp_first_form.patch, applied), and the
# defaults late_side_fork (on) and memset_kernels (off) get their five-round check. Steps:
# - bit tests: the prefetch's placement and its engine bit test, the side lane's with the late fork, the warp
#   deform form's, and the deform probe (batch 1 and 8);
# - r18vd fp16 batch 1, interleaved, five rounds: T (default), W (--enable weight_prefetch), M (--enable
#   memset_kernels), A (both), E (--disable late_side_fork), L (--enable weight_prefetch,prefetch_evict_last);
#   every bundle's outputs against T's bit for bit; two-lane traces of T, W and L; W's per-group profile;
# - batch 8, three rounds: T8 (default: the warp form), W8 (+ weight_prefetch), P8 (--disable warp_deform);
# - the fixture tests (fp16 detections, fp32 against PyTorch) with the default forms.
. tools/gpu/call_common.sh
timeout 150 $B/kiln_gpu_tests --gtest_filter='WeightPrefetchPlan.*:Fixtures/CudaRtDetr.WeightPrefetchChangesNoBit/*:Fixtures/CudaRtDetr.SideLaneChangesNoBit/*:CudaKernels.DeformWarp*:CudaRtDetrKernelsPerf.Deform' > $R/kernels.log 2>&1; log kernels $?
full_fixture r18vd $R/fixtures.log; log fixture $?
bb() { echo $work/r18vd.b$1.$2.bundle; }
rm -f $work/r18vd.b*.bundle
build() {  # BATCH NAME FLAGS...
  local b=$1 n=$2; shift 2
  timeout 200 $kiln build $work/full/r18vd -o $(bb $b $n) --backend cuda --precision fp16 --batch $b "$@" > $R/build_$n$b.log 2>&1; log build_$n$b $?
}
build 1 T; build 1 W --enable weight_prefetch; build 1 M --enable memset_kernels
build 1 A --enable weight_prefetch,memset_kernels; build 1 E --disable late_side_fork
build 1 L --enable weight_prefetch,prefetch_evict_last
set --; for n in T W L M A E; do [ -f $(bb 1 $n) ] && set -- "$@" $(bb 1 $n); done
for i in 1 2 3 4 5; do $kiln bench "$@" --batch 1 --iterations 300 >> $R/ab_b1.txt 2>&1; log ab$i $?; done
for n in T W L M A E; do [ -f $(bb 1 $n) ] && $kiln run $(bb 1 $n) --input pixel_values=$work/full/r18vd/input.npy --output-dir $R/out_$n > $R/run_$n.log 2>&1; done
for n in W L M A E; do cmp $R/out_$n/logits.npy $R/out_T/logits.npy && cmp $R/out_$n/pred_boxes.npy $R/out_T/pred_boxes.npy; log same_bits_$n $?; done
for n in T W L; do [ -f $(bb 1 $n) ] && $kiln bench $(bb 1 $n) --batch 1 --iterations 300 --trace 20 --json > $R/bench_$n.json 2> $R/bench_$n.err; log trace_$n $?; done
$kiln inspect $(bb 1 W) --plan > $R/inspect_W.txt 2>&1; log inspect_W $?
$kiln bench $(bb 1 W) --batch 1 --iterations 300 --profile 20 --trace 20 > $R/profile_W.txt 2>&1; log profile_W $?
build 8 T; build 8 W --enable weight_prefetch; build 8 L --enable weight_prefetch,prefetch_evict_last
build 8 P --disable warp_deform
set --; for n in T W L P; do [ -f $(bb 8 $n) ] && set -- "$@" $(bb 8 $n); done
for i in 1 2 3; do $kiln bench "$@" --batch 8 --iterations 200 >> $R/ab_b8.txt 2>&1; log ab8_$i $?; done
timeout 150 $B/kiln_gpu_tests --gtest_filter='Fixtures/CudaRtDetr.Fp16DetectionsMatchPyTorch/*:Fixtures/CudaRtDetr.Fp32MatchesPyTorch/*' > $R/rtdetr.log 2>&1; log rtdetr $?
tar -C $work -czf $OUT/res.tgz res
