// sm90 FP8 GEMM, tile 128x256x64, cluster 1x1, cooperative (fp8_gemm_sm90_kernel.cuh): wide
// outputs (256+ channels) from 64-channel inputs over many pixels (ResNet layer1's conv3 and
// downsample at large batch).
#include "backends/cuda/fp8_gemm_sm90_kernel.cuh"

KILN_FP8_SM90_CONFIG(kConfig128x256k64, "cutlass sm90 fp8 128x256x64 c1x1 coop", 128, 256, 64, 1, false)
