// sm90 INT8 GEMM, tile 128x64x128, cluster 1x1, ping-pong (fp8_gemm_sm90_kernel.cuh with i8
// codes): narrow INT8 layers (64 output channels) and small M.
#include "backends/cuda/fp8_gemm_sm90_kernel.cuh"

KILN_I8_SM90_CONFIG(kConfigI8x128x64, "cutlass sm90 i8 128x64x128 c1x1 pingpong", 128, 64, 128, 1, true)
