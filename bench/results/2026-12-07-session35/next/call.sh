#!/usr/bin/env bash
# For session 36's first device call (~2.5 min): does mlp_chain's early PDL trigger cost the chain time?
# Session 35 found the four chain launches take 14-17 us in the graph (12.8 in the probe) with or without
# their weights prefetched into L2 (weight_prefetch), so their weights' latency is not it. Another difference
# from the probe: the kernel after a chain (a decoder layer's q/k small_gemm, 76 blocks staging 32 KiB of
# weights each) launches as soon as the chain passes its PDL wait, and its blocks share the chain's SMs while
# the chain's latency-bound layers run (the side lane's v_proj too). chain_late_trigger.patch makes the chain
# wait without triggering, so the next kernel launches when the chain ends. The same bits (no arithmetic change).
# Here: build base = HEAD, patched = HEAD + the patch, e.g.
#   git worktree add /work/wt/base HEAD && (cd /work/wt/base && cp -r /work/main/third_party . &&
#     cmake -S . -B build-cuda -G Ninja -DCMAKE_BUILD_TYPE=Release && cmake --build build-cuda --target kiln)
#   git apply bench/results/2026-12-07-session35/next/chain_late_trigger.patch && cmake --build build
#   KILN_BASE_KILN=/work/wt/base/build-cuda/kiln KILN_PACK_BUILD=build bash tools/gpu/pack.sh
#   cp bench/results/2026-12-07-session35/next/call.sh .gpu/call1.sh      # device: bash .gpu/call1.sh, carry .gpu
# One bundle (built by the base binary: the plan is the same), benched by each binary in turn, four rounds;
# the outputs of both binaries compared bit for bit; the patched binary's two-lane trace.
. tools/gpu/call_common.sh
full_fixture r18vd $R/fixtures.log; log fixture $?
b=$work/r18vd.b1.bundle
timeout 200 $B/kiln-base build $work/full/r18vd -o $b --backend cuda --precision fp16 --batch 1 > $R/build.log 2>&1; log build $?
for i in 1 2 3 4; do
  for k in kiln-base kiln; do echo "== $k" >> $R/ab_b1.txt; $B/$k bench $b --batch 1 --iterations 300 >> $R/ab_b1.txt 2>&1; done; log ab$i $?
done
for k in kiln-base kiln; do $B/$k run $b --input pixel_values=$work/full/r18vd/input.npy --output-dir $R/out_$k > $R/run_$k.log 2>&1; done
cmp $R/out_kiln/logits.npy $R/out_kiln-base/logits.npy && cmp $R/out_kiln/pred_boxes.npy $R/out_kiln-base/pred_boxes.npy; log same_bits $?
$B/kiln bench $b --batch 1 --iterations 300 --trace 20 --json > $R/bench_patched.json 2> $R/bench_patched.err; log trace $?
timeout 90 $B/kiln_ops_tests --gtest_filter='*mlp_chain*' > $R/ops.log 2>&1; log ops $?
tar -C $work -czf $OUT/res.tgz res
