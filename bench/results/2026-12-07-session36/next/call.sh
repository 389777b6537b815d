#!/usr/bin/env bash
# For a later device call (~4 min; written in session 36, not run): mlp_chain with split K
# (split_k_chain.patch: 16 warps a block, two warps a tile each summing half of the k pairs, the second's
# partial sums added by the first through shared memory behind a named barrier of the pair). The chains are
# latency bound at 2 warps a scheduler (Nsight Compute, session 26: ~2900 instructions a warp at ~11 cycles
# each); this gives each tile half the dependent mma chain and each scheduler 4 warps. ptxas: 90 registers,
# no spills (126 before). The f32 sums of a tile are added in another order, so the outputs are not the
# base's bits: compared by the op harness against the reference, by the fixture tests against PyTorch, and
# here by the largest difference of the full-size outputs.
# Here: build base = the current build, patched = + the patch, e.g.
#   cp build/kiln /work/wt/kiln-base
#   git apply bench/results/2026-12-07-session36/next/split_k_chain.patch && cmake --build build
#   KILN_BASE_KILN=/work/wt/kiln-base KILN_PACK_BUILD=build bash tools/gpu/pack.sh; git checkout src/backends/cuda/mlp_chain.cu
#   cp bench/results/2026-12-07-session36/next/call.sh .gpu/call3.sh      # device: bash .gpu/call3.sh, carry .gpu
. tools/gpu/call_common.sh
timeout 90 $B/kiln_ops_tests --gtest_brief=1 --gtest_filter='*mlp_chain*' > $R/ops.log 2>&1; log ops $?
full_fixture r18vd $R/fixtures.log; log fixture $?
b=$work/r18vd.b1.bundle
timeout 200 $B/kiln-base build $work/full/r18vd -o $b --backend cuda --precision fp16 --batch 1 > $R/build.log 2>&1; log build $?
for i in 1 2 3 4; do
  for k in kiln-base kiln; do echo "== $k" >> $R/ab_b1.txt; $B/$k bench $b --batch 1 --iterations 300 >> $R/ab_b1.txt 2>&1; done; log ab$i $?
done
for k in kiln-base kiln; do $B/$k run $b --input pixel_values=$work/full/r18vd/input.npy --output-dir $R/out_$k > $R/run_$k.log 2>&1; done
"${pyc[@]}" - $R > $R/diff.txt 2>&1 <<'PY'; log diff $?
import sys, numpy as np
r = sys.argv[1]
for f in ("logits", "pred_boxes"):
    a = np.load(f"{r}/out_kiln-base/{f}.npy").astype(np.float64); b = np.load(f"{r}/out_kiln/{f}.npy").astype(np.float64)
    print(f, "max|diff|", np.abs(a - b).max(), "max|base|", np.abs(a).max(), "finite", np.isfinite(b).all())
PY
$B/kiln bench $b --batch 1 --iterations 300 --trace 20 --json > $R/bench_patched.json 2> $R/bench_patched.err; log trace $?
timeout 150 $B/kiln_gpu_tests --gtest_filter='Fixtures/CudaRtDetr.Fp16DetectionsMatchPyTorch/*:Fixtures/CudaRtDetr.SideLaneChangesNoBit/basic_1l:CudaRtDetrKernelsPerf.MlpChains' > $R/rtdetr.log 2>&1; log rtdetr $?
tar -C $work -czf $OUT/res.tgz res
