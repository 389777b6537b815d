#!/usr/bin/env bash
# Session 36's device call 1 (~4 min; $OUT/res.tgz tarred after every step, most useful first). Payload:
# bin/kiln = HEAD d33510c + session 35's next/chain_late_trigger.patch (mlp_chain waits for the kernel
# before it but does not trigger the kernel after it early), bin/kiln-base = HEAD d33510c unpatched; the
# test binaries are the patched build. Here:
#   cp build/kiln /work/wt/kiln-base; git apply bench/results/2026-12-07-session35/next/chain_late_trigger.patch
#   KILN_BASE_KILN=/work/wt/kiln-base KILN_PACK_BUILD=build bash tools/gpu/pack.sh; git checkout src/backends/cuda/mlp_chain.cu
#   cp bench/results/2026-12-07-session36/call1/call.sh .gpu/call1.sh     # device: bash .gpu/call1.sh, carry .gpu
# Steps:
# - r18vd fp16 batch 1: one bundle T (built by kiln-base), benched by kiln-base and kiln in turn, four rounds;
#   both binaries' outputs bit for bit; the patched binary's two-lane trace, the base's too (same card);
# - the op harness' mlp_chain cases with the patch; the GPU tests whose helpers changed in 841fbcf (not yet run
#   on a GPU): WeightPrefetchChangesNoBit, PostNormProjectionsAndMemoryMaskChangeNoBit, SideLaneChangesNoBit;
# - the defaults on whatever card came (the H200 figure is from session 31): M (--enable memset_kernels)
#   interleaved with T, three rounds; T's per-group profile; batch 8 T8, two rounds.
. tools/gpu/call_common.sh
full_fixture r18vd $R/fixtures.log; log fixture $?
bb() { echo $work/r18vd.b$1.$2.bundle; }
build() {  # BATCH NAME FLAGS...
  local b=$1 n=$2; shift 2
  [ -f $(bb $b $n) ] || timeout 200 $B/kiln-base build $work/full/r18vd -o $(bb $b $n) --backend cuda --precision fp16 --batch $b "$@" > $R/build_$n$b.log 2>&1; log build_$n$b $?
}
build 1 T
for i in 1 2 3 4; do
  for k in kiln-base kiln; do echo "== $k" >> $R/ab_chain.txt; $B/$k bench $(bb 1 T) --batch 1 --iterations 300 >> $R/ab_chain.txt 2>&1; done; log ab_chain$i $?
done
for k in kiln-base kiln; do $B/$k run $(bb 1 T) --input pixel_values=$work/full/r18vd/input.npy --output-dir $R/out_$k > $R/run_$k.log 2>&1; done
cmp $R/out_kiln/logits.npy $R/out_kiln-base/logits.npy && cmp $R/out_kiln/pred_boxes.npy $R/out_kiln-base/pred_boxes.npy; log same_bits_chain $?
for k in kiln kiln-base; do $B/$k bench $(bb 1 T) --batch 1 --iterations 300 --trace 20 --json > $R/bench_$k.json 2> $R/bench_$k.err; log trace_$k $?; done
timeout 90 $B/kiln_ops_tests --gtest_brief=1 --gtest_filter='*mlp_chain*' > $R/ops.log 2>&1; log ops $?
timeout 150 $B/kiln_gpu_tests --gtest_filter='Fixtures/CudaRtDetr.WeightPrefetchChangesNoBit/*:Fixtures/CudaRtDetr.PostNormProjectionsAndMemoryMaskChangeNoBit/*:Fixtures/CudaRtDetr.SideLaneChangesNoBit/*' > $R/helpers.log 2>&1; log helpers $?
build 1 M --enable memset_kernels
set -- $(bb 1 T); [ -f $(bb 1 M) ] && set -- "$@" $(bb 1 M)
for i in 1 2 3; do $B/kiln-base bench "$@" --batch 1 --iterations 300 >> $R/ab_b1.txt 2>&1; log ab$i $?; done
$B/kiln-base run $(bb 1 M) --input pixel_values=$work/full/r18vd/input.npy --output-dir $R/out_M > $R/run_M.log 2>&1
cmp $R/out_M/logits.npy $R/out_kiln-base/logits.npy && cmp $R/out_M/pred_boxes.npy $R/out_kiln-base/pred_boxes.npy; log same_bits_M $?
$B/kiln-base bench $(bb 1 T) --batch 1 --iterations 300 --profile 20 > $R/profile_T.txt 2>&1; log profile_T $?
build 8 T
for i in 1 2; do $B/kiln-base bench $(bb 8 T) --batch 8 --iterations 200 >> $R/ab_b8.txt 2>&1; log ab8_$i $?; done
tar -C $work -czf $OUT/res.tgz res
