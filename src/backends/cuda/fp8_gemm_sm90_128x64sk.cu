// sm90 FP8 GEMM, tile 128x64x128, cluster 1x1, cooperative, stream-K (fp8_gemm_sm90_kernel.cuh
// TileConfig): small-M layers (batch 1) whose few output tiles would leave most SMs idle; the
// K loop spread over the SMs, one epilogue per tile after the partial sums meet.
#include "backends/cuda/fp8_gemm_sm90_kernel.cuh"

KILN_FP8_SM90_CONFIG(kConfig128x64StreamK, "cutlass sm90 fp8 128x64x128 c1x1 coop streamk", 128, 64, 128, 1, false,
                     cutlass::gemm::StreamKScheduler)
