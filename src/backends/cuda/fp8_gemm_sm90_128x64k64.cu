// sm90 FP8 GEMM, tile 128x64x64, cluster 1x1, ping-pong (fp8_gemm_sm90_kernel.cuh): narrow
// layers with a short reduction (64 channels in and out).
#include "backends/cuda/fp8_gemm_sm90_kernel.cuh"

KILN_FP8_SM90_CONFIG(kConfig128x64k64, "cutlass sm90 fp8 128x64x64 c1x1 pingpong", 128, 64, 64, 1, true)
