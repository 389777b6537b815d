// sm90 conv, tile 128x128x64, cluster 1x1 (conv_sm90_kernel.cuh).
#include "backends/cuda/conv_sm90_kernel.cuh"

KILN_SM90_CONV_CONFIG(kConv128x128x64, 128, 128, 64)
