#!/usr/bin/env bash
# Session 26, call 1: where mlp_chain, top_k and the stem pool spend their time (Nsight Compute,
# full set with source-level stall sampling), and the batch-1 in-graph trace, on kiln a9002cd.
set -u
work=/tmp/kiln_prof; mkdir -p $work; tar -C $work -xJf .gpu/payload.tar.xz
export LD_LIBRARY_PATH=$work/lib:/usr/lib/x86_64-linux-gnu:/usr/local/cuda-13.0/targets/x86_64-linux/lib
[ -d /work/main/tests/fixtures ] || { mkdir -p /work; ln -sfn "$PWD" /work/main; }
R=$work/res; rm -rf $R; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version --format=csv > $R/gpu.txt
B=$work/bin; t0=$SECONDS
log() { echo "$1 rc=$2 t=$((SECONDS-t0))" >> $R/rc.txt; tar -C $work -czf $OUT/res.tgz res; }
[ -f $work/r18vd.b1.default.bundle ] || { timeout 280 tools/gpu/profile_kernels.sh $R/p1 r18vd 1 > $R/prof1.log 2>&1; log prof1 $?; }
ncu=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
bundle=$work/r18vd.b1.default.bundle
timeout 200 $ncu --clock-control none --kernel-name-base demangled -k 'regex:mlp_chain|top_k_kernel|pool_kernel|gather_kernel' \
  -c 12 --set full --import-source no -o $work/full_rep -f \
  $B/kiln bench $bundle --batch 1 --iterations 10 --warmup 0 --no-task > $R/ncu_run.log 2>&1; log ncu $?
$ncu --import $work/full_rep.ncu-rep --page details > $R/ncu_details.txt 2>&1
$ncu --import $work/full_rep.ncu-rep --page source --csv --print-source sass > $R/ncu_source_sass.csv 2>&1 || \
  $ncu --import $work/full_rep.ncu-rep --page source --csv > $R/ncu_source.csv 2>&1
log ncu_pages $?
xz -9 $R/ncu_source_sass.csv 2>/dev/null
tar -C $work -czf $OUT/res.tgz res
