#!/usr/bin/env bash
# Session 26, call 2: mlp_chain with st.async layer hand-off and one-tile-ahead weight fetch (kiln, working
# tree after a9002cd) against a9002cd (kiln-base) on the same bundle; the fuse_mlp "on" form (post-norm
# chains, FFN included) A/B; the op harness' mlp_chain cases; Nsight Compute of the new kernel; RT-DETR fixtures.
set -u
work=/tmp/kiln_prof; mkdir -p $work; rm -rf $work/bin; tar -C $work -xJf .gpu/payload.tar.xz
. tools/gpu/full_fixture.sh
[ -d /work/main/tests/fixtures ] || { mkdir -p /work; ln -sfn "$PWD" /work/main; }
R=$work/res; rm -rf $R; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version --format=csv > $R/gpu.txt
B=$work/bin; t0=$SECONDS
log() { echo "$1 rc=$2 t=$((SECONDS-t0))" >> $R/rc.txt; tar -C $work -czf $OUT/res.tgz res; }
full_fixture r18vd $R/fixtures.log; log fixture $?
d=$work/r18vd.b1.s26.bundle m=$work/r18vd.b1.s26mlp.bundle; rm -f $d $m
timeout 200 $kiln build $work/full/r18vd -o $d --backend cuda --precision fp16 --batch 1 > $R/build_default.log 2>&1; log build_default $?
timeout 100 stdbuf -oL $B/kiln_ops_tests --gtest_filter='*group_mlp_chain*f16*' > $R/ops_mlp.log 2>&1; log ops_mlp $?
for i in 1 2; do
  $kiln bench $d --batch 1 --iterations 300 >> $R/ab_kernel.txt 2>&1
  $B/kiln-base bench $d --batch 1 --iterations 300 | sed 's/^/[a9002cd] /' >> $R/ab_kernel.txt 2>&1
done; log ab_kernel $?
$kiln bench $d --batch 1 --iterations 50 --trace 20 --json > $R/trace_default.json 2>&1
python3 tools/gpu/compare_rtdetr.py trace --bench $R/trace_default.json > $R/groups_default.txt 2>&1; log trace_default $?
timeout 200 $kiln build $work/full/r18vd -o $m --backend cuda --precision fp16 --batch 1 --enable fuse_mlp > $R/build_mlp.log 2>&1; log build_mlp $?
$kiln bench $d $m --batch 1 --iterations 300 > $R/ab_fuse_mlp.txt 2>&1; log ab_fuse_mlp $?
$kiln bench $m --batch 1 --iterations 50 --trace 20 --json > $R/trace_mlp.json 2>&1
python3 tools/gpu/compare_rtdetr.py trace --bench $R/trace_mlp.json > $R/groups_mlp.txt 2>&1; log trace_mlp $?
ncu=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
timeout 90 $ncu --clock-control none --kernel-name-base demangled -k 'regex:mlp_chain' -c 4 --set full --import-source no \
  -o $work/mlp_rep -f $kiln bench $d --batch 1 --iterations 10 --warmup 0 --no-task > $R/ncu_run.log 2>&1; log ncu $?
$ncu --import $work/mlp_rep.ncu-rep --page details > $R/ncu_details.txt 2>&1
$ncu --import $work/mlp_rep.ncu-rep --page source --csv --print-source sass 2>&1 | xz -9 > $R/ncu_source_sass.csv.xz; log ncu_pages $?
left=$((560 - (SECONDS - t0)))
[ $left -gt 30 ] && timeout $left stdbuf -oL $B/kiln_gpu_tests --gtest_filter='Fixtures/CudaRtDetr.Fp16*:Fixtures/CudaRtDetr.SideLane*' > $R/rtdetr_tests.log 2>&1; log rtdetr_tests $?
tar -C $work -czf $OUT/res.tgz res
