#!/usr/bin/env bash
# Session 26, call 3: the mlp_chain probe (cluster 4/2/1, 8 or 16 warps, against the unfused GEMMs).
set -u
work=/tmp/kiln_prof; mkdir -p $work; rm -rf $work/bin; tar -C $work -xJf .gpu/payload.tar.xz
export LD_LIBRARY_PATH=$work/lib:/usr/lib/x86_64-linux-gnu:/usr/local/cuda-13.0/targets/x86_64-linux/lib
[ -d /work/main/tests/fixtures ] || { mkdir -p /work; ln -sfn "$PWD" /work/main; }
R=$work/res; rm -rf $R; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version --format=csv > $R/gpu.txt
timeout 120 $work/bin/kiln_gpu_tests --gtest_filter='CudaMlpChainPerf.*' > $R/mlp_perf.log 2>&1; echo "probe rc=$?" >> $R/rc.txt
tar -C $work -czf $OUT/res.tgz res
