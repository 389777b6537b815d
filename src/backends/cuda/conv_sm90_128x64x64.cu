// sm90 conv, tile 128x64x64, cluster 1x1 (conv_sm90_kernel.cuh).
#include "backends/cuda/conv_sm90_kernel.cuh"

KILN_SM90_CONV_CONFIG(kConv128x64x64, 128, 64, 64)
