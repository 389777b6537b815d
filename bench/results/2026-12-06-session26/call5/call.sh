#!/usr/bin/env bash
# Session 26, call 5: kiln's small linear (small_gemm.cu, not taken by any lowering yet) against the host reference and
# against cuBLASLt's LinearOp on RT-DETR's batch-1 shapes.
set -u
work=/tmp/kiln_prof; mkdir -p $work; rm -rf $work/bin; tar -C $work -xJf .gpu/payload.tar.xz
export LD_LIBRARY_PATH=$work/lib:/usr/lib/x86_64-linux-gnu:/usr/local/cuda-13.0/targets/x86_64-linux/lib
[ -d /work/main/tests/fixtures ] || { mkdir -p /work; ln -sfn "$PWD" /work/main; }
R=$work/res; rm -rf $R; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version --format=csv > $R/gpu.txt
timeout 90 $work/bin/kiln_gpu_tests --gtest_filter='*SmallGemm*' > $R/small_gemm.log 2>&1; echo "small_gemm rc=$?" >> $R/rc.txt
tar -C $work -czf $OUT/res.tgz res
