// sm90 FP8 GEMM, tile 128x128x64, cluster 1x1, cooperative (fp8_gemm_sm90_kernel.cuh): layers
// with 64 input channels (ResNet layer1's 1x1 convs), where a 128-deep k tile would run half on
// TMA's zero fill.
#include "backends/cuda/fp8_gemm_sm90_kernel.cuh"

KILN_FP8_SM90_CONFIG(kConfig128x128k64, "cutlass sm90 fp8 128x128x64 c1x1 coop", 128, 128, 64, 1, false)
