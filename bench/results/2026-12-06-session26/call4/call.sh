#!/usr/bin/env bash
# Session 26, call 4 (asked for an H200): kiln 1c52386 (mlp_chain st.async hand-off, top_k warp-aggregated, 1024
# threads) against a9002cd (kiln-base) on the same bundles, batch 1 and 8; the per-group table at batch 1; the op
# harness' top_k and mlp_chain cases; the RT-DETR kernel probes.
set -u
work=/tmp/kiln_prof; mkdir -p $work; rm -rf $work/bin; tar -C $work -xJf .gpu/payload.tar.xz
. tools/gpu/full_fixture.sh
[ -d /work/main/tests/fixtures ] || { mkdir -p /work; ln -sfn "$PWD" /work/main; }
R=$work/res; rm -rf $R; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version --format=csv > $R/gpu.txt
B=$work/bin; t0=$SECONDS
log() { echo "$1 rc=$2 t=$((SECONDS-t0))" >> $R/rc.txt; tar -C $work -czf $OUT/res.tgz res; }
full_fixture r18vd $R/fixtures.log; log fixture $?
d1=$work/r18vd.b1.s26.bundle d8=$work/r18vd.b8.s26.bundle; rm -f $d1 $d8
timeout 240 $kiln build $work/full/r18vd -o $d1 --backend cuda --precision fp16 --batch 1 > $R/build_b1.log 2>&1; log build_b1 $?
timeout 60 $kiln build $work/full/r18vd -o $d8 --backend cuda --precision fp16 --batch 8 > $R/build_b8.log 2>&1; log build_b8 $?
for i in 1 2; do
  for b in 1 8; do
    f=$d1; [ $b = 8 ] && f=$d8
    $kiln bench $f --batch $b --iterations 300 >> $R/ab_b$b.txt 2>&1
    $B/kiln-base bench $f --batch $b --iterations 300 | sed 's/^/[a9002cd] /' >> $R/ab_b$b.txt 2>&1
  done
done; log ab $?
$kiln bench $d1 --batch 1 --iterations 50 --profile 20 --trace 20 > $R/kernels_b1.txt 2>&1
$kiln bench $d1 --batch 1 --iterations 50 --trace 20 --json > $R/trace_b1.json 2>&1
python3 tools/gpu/compare_rtdetr.py trace --bench $R/trace_b1.json > $R/groups_b1.txt 2>&1; log groups_b1 $?
$kiln bench $d8 --batch 8 --iterations 50 --trace 20 --json > $R/trace_b8.json 2>&1
python3 tools/gpu/compare_rtdetr.py trace --bench $R/trace_b8.json > $R/groups_b8.txt 2>&1; log groups_b8 $?
timeout 60 $B/kiln_gpu_tests --gtest_filter='CudaRtDetrKernelsPerf.*' > $R/probes.log 2>&1; log probes $?
timeout 90 stdbuf -oL $B/kiln_ops_tests --gtest_filter='*top_k*:*group_mlp_chain*f16*' > $R/ops.log 2>&1; log ops $?
left=$((400 - (SECONDS - t0)))
[ $left -gt 20 ] && timeout $left stdbuf -oL $B/kiln_gpu_tests --gtest_filter='*SoftmaxTopK*:Fixtures/CudaRtDetr.Fp16*' > $R/gpu_tests.log 2>&1; log gpu_tests $?
tar -C $work -czf $OUT/res.tgz res
