// sm90 FP8 GEMM, tile 128x256x128, cluster 1x1, cooperative (fp8_gemm_sm90_kernel.cuh): wide
// layers (256+ output channels) over many pixels.
#include "backends/cuda/fp8_gemm_sm90_kernel.cuh"

KILN_FP8_SM90_CONFIG(kConfig128x256, "cutlass sm90 fp8 128x256x128 c1x1 coop", 128, 256, 128, 1, false)
