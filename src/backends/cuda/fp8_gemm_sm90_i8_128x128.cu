// sm90 INT8 GEMM, tile 128x128x128, cluster 1x1, cooperative (fp8_gemm_sm90_kernel.cuh with
// i8 codes): an INT8 layer in one kernel, exact int32 sums and the layer's epilogue before the
// one store, where cuBLASLt's i8 GEMM needs kiln's quant_epilogue_i32 over an int32 scratch.
#include "backends/cuda/fp8_gemm_sm90_kernel.cuh"

KILN_I8_SM90_CONFIG(kConfigI8x128x128, "cutlass sm90 i8 128x128x128 c1x1 coop", 128, 128, 128, 1, false)
