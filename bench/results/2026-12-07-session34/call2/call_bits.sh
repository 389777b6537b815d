#!/usr/bin/env bash
# Session 34's last device minutes: the restored warp form's bit test and probe alone.
. tools/gpu/call_common.sh
timeout 60 $B/kiln_gpu_tests --gtest_filter='CudaKernels.DeformWarp*:CudaRtDetrKernelsPerf.Deform' > $R/kernels.log 2>&1; log kernels $?
tar -C $work -czf $OUT/res.tgz res
