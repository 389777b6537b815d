// sm90 conv, tile 64x64x64, cluster 1x1 (conv_sm90_kernel.cuh).
#include "backends/cuda/conv_sm90_kernel.cuh"

KILN_SM90_CONV_CONFIG(kConv64x64x64, 64, 64, 64)
