#!/usr/bin/env bash
# Session 36's device call 2 (~4 min): does the side lane's launch beside each mlp_chain slow the chain?
# Call 1 ruled out the next kernel's early launch (chain_late_trigger: the chains took 13.6 / 16.6 / 16.7 / 9.0 us
# against 15.2 / 17.0 / 17.3 / 9.2 and the engine was ~3 us slower). In the two-lane trace each decoder layer's
# v_proj (small_gemm, 5 us) runs on the side lane while the chain before it runs (12.8 us alone in the probe,
# 17 in the graph). Payload: bin/kiln = HEAD + chain_fork.patch (a side run whose window holds a main-lane
# mlp_chain launch forks right after the chain, except the run whose window holds the query selection's top_k),
# bin/kiln-base = HEAD. Here:
#   git apply bench/results/2026-12-07-session36/call2/chain_fork.patch
#   KILN_BASE_KILN=/work/wt/kiln-base KILN_PACK_BUILD=build bash tools/gpu/pack.sh
#   cp bench/results/2026-12-07-session36/call2/call.sh .gpu/call2.sh     # device: bash .gpu/call2.sh, carry .gpu
# Bundles: T (kiln-base, default), X (kiln, the patch), S (kiln-base, --disable side_lane: the chains with
# nothing beside them). Each bundle is benched by the binary that built it, interleaved, four rounds.
. tools/gpu/call_common.sh
full_fixture r18vd $R/fixtures.log; log fixture $?
bb() { echo $work/r18vd.b$1.$2.bundle; }
build() {  # BIN BATCH NAME FLAGS...
  local k=$1 b=$2 n=$3; shift 3
  [ -f $(bb $b $n) ] || timeout 200 $B/$k build $work/full/r18vd -o $(bb $b $n) --backend cuda --precision fp16 --batch $b "$@" > $R/build_$n$b.log 2>&1; log build_$n$b $?
}
build kiln-base 1 T; build kiln 1 X; build kiln-base 1 S --disable side_lane
bench() { echo "== $1 $2" >> $R/ab_b1.txt; $B/$1 bench $(bb 1 $2) --batch 1 --iterations 300 >> $R/ab_b1.txt 2>&1; }
for i in 1 2 3 4; do bench kiln-base T; bench kiln X; bench kiln-base S; log ab$i $?; done
for n in T S; do $B/kiln-base run $(bb 1 $n) --input pixel_values=$work/full/r18vd/input.npy --output-dir $R/out_$n > $R/run_$n.log 2>&1; done
$B/kiln run $(bb 1 X) --input pixel_values=$work/full/r18vd/input.npy --output-dir $R/out_X > $R/run_X.log 2>&1
for n in X S; do cmp $R/out_$n/logits.npy $R/out_T/logits.npy && cmp $R/out_$n/pred_boxes.npy $R/out_T/pred_boxes.npy; log same_bits_$n $?; done
$B/kiln-base bench $(bb 1 T) --batch 1 --iterations 300 --trace 20 --json > $R/bench_T.json 2> $R/bench_T.err; log trace_T $?
$B/kiln bench $(bb 1 X) --batch 1 --iterations 300 --trace 20 --json > $R/bench_X.json 2> $R/bench_X.err; log trace_X $?
$B/kiln-base bench $(bb 1 S) --batch 1 --iterations 300 --trace 20 --json > $R/bench_S.json 2> $R/bench_S.err; log trace_S $?
$B/kiln inspect $(bb 1 X) --plan > $R/inspect_X.txt 2>&1; log inspect_X $?
timeout 120 $B/kiln_gpu_tests --gtest_filter='SideLanePlan.*:Fixtures/CudaRtDetr.SideLaneChangesNoBit/*' > $R/side.log 2>&1; log side $?
build kiln-base 8 T; build kiln 8 X
for i in 1 2; do for k in T X; do [ $k = T ] && bin=kiln-base || bin=kiln; echo "== $k" >> $R/ab_b8.txt; $B/$bin bench $(bb 8 $k) --batch 8 --iterations 200 >> $R/ab_b8.txt 2>&1; done; log ab8_$i $?; done
tar -C $work -czf $OUT/res.tgz res
