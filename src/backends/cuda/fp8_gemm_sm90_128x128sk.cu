// sm90 FP8 GEMM, tile 128x128x128, cluster 1x1, cooperative, stream-K (fp8_gemm_sm90_kernel.cuh
// TileConfig): the wider layers of batch 1 (layer4's 1x1s: 512 or 2048 outputs at 7x7).
#include "backends/cuda/fp8_gemm_sm90_kernel.cuh"

KILN_FP8_SM90_CONFIG(kConfig128x128StreamK, "cutlass sm90 fp8 128x128x128 c1x1 coop streamk", 128, 128, 128, 1, false,
                     cutlass::gemm::StreamKScheduler)
