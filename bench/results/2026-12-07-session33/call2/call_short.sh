#!/usr/bin/env bash
# Session 33's last device minute: call 2's first step alone (the device had ~60 s left after a machine's start):
# the three same-bits forms' bit tests and the rewritten warp form's probe against the block form.
. tools/gpu/call_common.sh
timeout 40 $B/kiln_gpu_tests --gtest_filter='CudaKernels.DeformWarp*:CudaRtDetrKernelsPerf.Deform:CudaKernels.TopKClusterFormMatchesOneBlock:CudaKernels.AttentionWide*' > $R/kernels.log 2>&1; log kernels $?
tar -C $work -czf $OUT/res.tgz res
