#!/usr/bin/env bash
# call.sh cut to ~3 min after two lost starts (one refused, one taken back mid-call): the bit tests, batch 1
# T / W / L in five rounds with their bits and traces, batch 8 T / W / P in two rounds.
. tools/gpu/call_common.sh
timeout 150 $B/kiln_gpu_tests --gtest_filter='WeightPrefetchPlan.*:Fixtures/CudaRtDetr.WeightPrefetchChangesNoBit/*:Fixtures/CudaRtDetr.SideLaneChangesNoBit/*:CudaKernels.DeformWarp*:CudaRtDetrKernelsPerf.Deform' > $R/kernels.log 2>&1; log kernels $?
full_fixture r18vd $R/fixtures.log; log fixture $?
bb() { echo $work/r18vd.b$1.$2.bundle; }
rm -f $work/r18vd.b*.bundle
build() {  # BATCH NAME FLAGS...
  local b=$1 n=$2; shift 2
  timeout 200 $kiln build $work/full/r18vd -o $(bb $b $n) --backend cuda --precision fp16 --batch $b "$@" > $R/build_$n$b.log 2>&1; log build_$n$b $?
}
build 1 T; build 1 W --enable weight_prefetch; build 1 L --enable weight_prefetch,prefetch_evict_last
set --; for n in T W L; do [ -f $(bb 1 $n) ] && set -- "$@" $(bb 1 $n); done
for i in 1 2 3 4 5; do $kiln bench "$@" --batch 1 --iterations 300 >> $R/ab_b1.txt 2>&1; log ab$i $?; done
for n in T W L; do [ -f $(bb 1 $n) ] && $kiln run $(bb 1 $n) --input pixel_values=$work/full/r18vd/input.npy --output-dir $R/out_$n > $R/run_$n.log 2>&1; done
for n in W L; do cmp $R/out_$n/logits.npy $R/out_T/logits.npy && cmp $R/out_$n/pred_boxes.npy $R/out_T/pred_boxes.npy; log same_bits_$n $?; done
for n in T W L; do [ -f $(bb 1 $n) ] && $kiln bench $(bb 1 $n) --batch 1 --iterations 300 --trace 20 --json > $R/bench_$n.json 2> $R/bench_$n.err; log trace_$n $?; done
$kiln inspect $(bb 1 W) --plan > $R/inspect_W.txt 2>&1; log inspect_W $?
build 8 T; build 8 W --enable weight_prefetch; build 8 P --disable warp_deform
set --; for n in T W P; do [ -f $(bb 8 $n) ] && set -- "$@" $(bb 8 $n); done
for i in 1 2; do $kiln bench "$@" --batch 8 --iterations 200 >> $R/ab_b8.txt 2>&1; log ab8_$i $?; done
tar -C $work -czf $OUT/res.tgz res
