#!/usr/bin/env bash
# Session 26, call 4: kiln 1c52386 (mlp_chain st.async hand-off; top_k warp-aggregated, 1024 threads) — the op
# harness' top_k and mlp_chain cases, the RT-DETR kernel probes, then one batch-1 bundle benched by 1c52386 and by
# a9002cd (kiln-base) in turn, and its per-group trace. Ordered by importance: the device budget was nearly spent.
set -u
work=/tmp/kiln_prof; mkdir -p $work; rm -rf $work/bin; tar -C $work -xJf .gpu/payload.tar.xz
. tools/gpu/full_fixture.sh
[ -d /work/main/tests/fixtures ] || { mkdir -p /work; ln -sfn "$PWD" /work/main; }
R=$work/res; rm -rf $R; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version --format=csv > $R/gpu.txt
B=$work/bin; t0=$SECONDS
log() { echo "$1 rc=$2 t=$((SECONDS-t0))" >> $R/rc.txt; tar -C $work -czf $OUT/res.tgz res; }
timeout 60 stdbuf -oL $B/kiln_ops_tests --gtest_filter='*top_k*:*group_mlp_chain*f16*' > $R/ops.log 2>&1; log ops $?
timeout 40 $B/kiln_gpu_tests --gtest_filter='CudaRtDetrKernelsPerf.*:*SoftmaxTopK*' > $R/probes.log 2>&1; log probes $?
full_fixture r18vd $R/fixtures.log; log fixture $?
d1=$work/r18vd.b1.s26.bundle; rm -f $d1
timeout 170 $kiln build $work/full/r18vd -o $d1 --backend cuda --precision fp16 --batch 1 > $R/build_b1.log 2>&1; log build_b1 $?
for i in 1 2; do
  $kiln bench $d1 --batch 1 --iterations 300 >> $R/ab_b1.txt 2>&1
  $B/kiln-base bench $d1 --batch 1 --iterations 300 | sed 's/^/[a9002cd] /' >> $R/ab_b1.txt 2>&1
done; log ab $?
$kiln bench $d1 --batch 1 --iterations 50 --trace 20 --json > $R/trace_b1.json 2>&1
python3 tools/gpu/compare_rtdetr.py trace --bench $R/trace_b1.json > $R/groups_b1.txt 2>&1; log groups_b1 $?
tar -C $work -czf $OUT/res.tgz res
