// sm90 FP8 GEMM, tile 128x128x128, cluster 1x1, cooperative (fp8_gemm_sm90_kernel.cuh).
#include "backends/cuda/fp8_gemm_sm90_kernel.cuh"

KILN_FP8_SM90_CONFIG(kConfig128x128, "cutlass sm90 fp8 128x128x128 c1x1 coop", 128, 128, 128, 1, false)
