// sm90 FP8 GEMM, tile 128x64x128, cluster 1x1, ping-pong (fp8_gemm_sm90_kernel.cuh): narrow
// layers (64 output channels) and small M, where the ping-pong overlap of one
// consumer's epilogue with the other's mainloop matters most.
#include "backends/cuda/fp8_gemm_sm90_kernel.cuh"

KILN_FP8_SM90_CONFIG(kConfig128x64, "cutlass sm90 fp8 128x64x128 c1x1 pingpong", 128, 64, 128, 1, true)
