#!/usr/bin/env bash
# Session 27, call 3: kiln with small_gemm's 16x64 tile (b0b08e6 + tile) — its tests and the graph-timed probe;
# one seeded r18vd bundle at batches 1,8 (default) and one at batch 1 with --enable small_gemm, benched
# interleaved; the small_gemm bundle's trace; the default bundle's engine time, --profile and --trace (kiln's own
# RT-DETR groups) at batches 1 and 8; last, small_gemm's fixture test on basic_1l.
set -u
work=/tmp/kiln_prof; mkdir -p $work; rm -rf $work/bin; tar -C $work -xJf .gpu/payload.tar.xz
. tools/gpu/full_fixture.sh
[ -d /work/main/tests/fixtures ] || { mkdir -p /work; ln -sfn "$PWD" /work/main; }
R=$work/res; rm -rf $R; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > $R/gpu.txt
B=$work/bin; t0=$SECONDS
log() { echo "$1 rc=$2 t=$((SECONDS-t0))" >> $R/rc.txt; tar -C $work -czf $OUT/res.tgz res; }
timeout 60 $B/kiln_gpu_tests --gtest_filter='CudaSmallGemm*' > $R/small_gemm.log 2>&1; log small_gemm $?
full_fixture r18vd $R/fixtures.log; log fixture $?
A=$work/r18vd.b18.s27.bundle S=$work/r18vd.b1.sg16.s27.bundle
rm -f $A $S
timeout 200 $kiln build $work/full/r18vd -o $A --backend cuda --precision fp16 --batch 1,8 > $R/build_A.log 2>&1; log build_A $?
timeout 100 $kiln build $work/full/r18vd -o $S --backend cuda --precision fp16 --batch 1 --enable small_gemm > $R/build_S.log 2>&1; log build_S $?
for i in 1 2 3; do $kiln bench $A $S --batch 1 --iterations 300 >> $R/ab_b1.txt 2>&1; done; log ab $?
$kiln bench $S --batch 1 --iterations 50 --trace 20 --json > $R/trace_S_b1.json 2>&1; log trace_S $?
for b in 1 8; do
  $kiln bench $A --batch $b --iterations 300 --profile 20 --trace 20 --json > $R/bench_b$b.json 2>&1
  $kiln bench $A --batch $b --iterations 300 --profile 20 --trace 20 > $R/bench_b$b.txt 2>&1
  python3 tools/gpu/compare_rtdetr.py profile --bench $R/bench_b$b.json > $R/groups_b$b.txt 2>&1
  python3 tools/gpu/compare_rtdetr.py trace --bench $R/bench_b$b.json >> $R/groups_b$b.txt 2>&1; log bench_b$b $?
done
timeout 90 $B/kiln_gpu_tests --gtest_filter='*SmallGemmDetections*basic_1l*' > $R/small_gemm_fixture.log 2>&1; log sg_fixture $?
# Where small_gemm won the A/B (lower median in at least two of the three rounds): the full-size PyTorch check with it on.
wins=$(python3 - $R/ab_b1.txt <<'PY'
import re, sys
ms = [float(m) for m in re.findall(r"engine median ([0-9.]+) ms", open(sys.argv[1]).read())]
print(sum(1 for i in range(0, len(ms) - 1, 2) if ms[i + 1] < ms[i]))
PY
)
echo "small_gemm won $wins of 3 rounds" >> $R/rc.txt
if [ "${wins:-0}" -ge 2 ]; then
  KILN_SKIP_BENCH=1 KILN_BUILD_FLAGS="--enable small_gemm" timeout 300 tools/gpu/check_rtdetr.sh $R/check_sg > $R/check_sg.log 2>&1; log check_sg $?
fi
tar -C $work -czf $OUT/res.tgz res
