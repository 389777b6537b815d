#!/usr/bin/env bash
# Session 36's device call 2 (~4 min): does the side lane's launch beside each mlp_chain slow the chain?
# Call 1 ruled out the next kernel's early launch (chain_late_trigger: the chains took 13.6 / 16.6 / 16.7 / 9.0 us
# against 15.2 / 17.0 / 17.3 / 9.2 and the engine was ~3 us slower). In the two-lane trace each decoder layer's
# v_proj (small_gemm, 5 us) runs on the side lane while the chain before it runs (12.8 us alone in the probe,
# 17 in the graph). New switch chain_side_fork (off by default): a side run whose window holds a main-lane
# mlp_chain launch forks right after the chain (not the run whose window holds the query selection's top_k).
# Here: `KILN_PACK_BUILD=build bash tools/gpu/pack.sh`, `cp bench/results/2026-12-07-session36/call2/call.sh
# .gpu/call2.sh`; device: `bash .gpu/call2.sh` with .gpu carried.
# Bundles (one binary): X (--enable chain_side_fork), T (default), S
# (--disable side_lane: the chains with nothing beside them); interleaved in one process, three rounds (cut to fit the
# device time left after six lost starts: no batch 8). Not run: the device time ran out. Added after: an Nsight
# Compute pass over the linked chain (last step).
. tools/gpu/call_common.sh
# With a payload packed for next/call.sh too (bin/kiln = + split_k_chain.patch), this call uses the base binary.
[ -x $B/kiln-base ] && kiln=$B/kiln-base
full_fixture r18vd $R/fixtures.log; log fixture $?
bb() { echo $work/r18vd.b$1.$2.bundle; }
build() {  # BATCH NAME FLAGS...
  local b=$1 n=$2; shift 2
  [ -f $(bb $b $n) ] || timeout 200 $kiln build $work/full/r18vd -o $(bb $b $n) --backend cuda --precision fp16 --batch $b "$@" > $R/build_$n$b.log 2>&1; log build_$n$b $?
}
build 1 X --enable chain_side_fork; build 1 T; build 1 S --disable side_lane
set --; for n in T X S; do [ -f $(bb 1 $n) ] && set -- "$@" $(bb 1 $n); done
for i in 1 2 3; do $kiln bench "$@" --batch 1 --iterations 300 >> $R/ab_b1.txt 2>&1; log ab$i $?; done
for n in T X S; do $kiln run $(bb 1 $n) --input pixel_values=$work/full/r18vd/input.npy --output-dir $R/out_$n > $R/run_$n.log 2>&1; done
for n in X S; do cmp $R/out_$n/logits.npy $R/out_T/logits.npy && cmp $R/out_$n/pred_boxes.npy $R/out_T/pred_boxes.npy; log same_bits_$n $?; done
for n in X T S; do $kiln bench $(bb 1 $n) --batch 1 --iterations 300 --trace 20 --json > $R/bench_$n.json 2> $R/bench_$n.err; log trace_$n $?; done
$kiln inspect $(bb 1 X) --plan > $R/inspect_X.txt 2>&1; log inspect_X $?
timeout 120 $B/kiln_gpu_tests --gtest_filter='SideLanePlan.*:Fixtures/CudaRtDetr.ChainSideForkChangesNoBit/*' > $R/side.log 2>&1; log side $?
# Last, where the chain's warps stall now (session 26's Nsight Compute data predates the st.async hand-off):
# the linked chain of one call, full set with source-level sampling (each kernel replayed alone).
ncu=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
timeout 150 $ncu --clock-control none --kernel-name-base demangled -k 'regex:mlp_chain' -s 1 -c 2 --set full \
  --import-source no -o $work/chain_rep -f $kiln bench $(bb 1 T) --batch 1 --iterations 3 --warmup 0 --no-task > $R/ncu_run.log 2>&1; log ncu $?
$ncu --import $work/chain_rep.ncu-rep --page details > $R/ncu_details.txt 2>&1
$ncu --import $work/chain_rep.ncu-rep --page source --csv --print-source sass > $R/ncu_source_sass.csv 2>&1; xz -9 $R/ncu_source_sass.csv
tar -C $work -czf $OUT/res.tgz res
