// l2_prefetch (weight_prefetch.hpp).
#include <cstdint>

#include "backends/cuda/cuda_check.hpp"
#include "backends/cuda/device_common.cuh"
#include "backends/cuda/kernels.hpp"
#include "backends/cuda/weight_prefetch.hpp"

namespace kiln::cuda {
namespace {

constexpr unsigned kLine = 128;       // an L2 line
constexpr unsigned kBlocksPerRange = 4;  // blocks sharing one range's lines

// Block (r, s): range r's lines s, s + kBlocksPerRange, ... a thread each. The
// prefetches are fire-and-forget: the kernel ends once they are issued.
// kLast: with the evict-last priority (switch prefetch_evict_last).
template <bool kLast>
__global__ void l2_prefetch_kernel(const uint64_t* __restrict__ ranges) {
  dev::enter_grid();
  const uint64_t base = ranges[2 * blockIdx.x], bytes = ranges[2 * blockIdx.x + 1];
  const uint64_t lines = (bytes + kLine - 1) / kLine;
  const uint64_t step = uint64_t(kBlocksPerRange) * blockDim.x;
  for (uint64_t l = uint64_t(blockIdx.y) * blockDim.x + threadIdx.x; l < lines; l += step) {
    if constexpr (kLast) asm volatile("prefetch.global.L2::evict_last [%0];" ::"l"(base + l * kLine));
    else asm volatile("prefetch.global.L2 [%0];" ::"l"(base + l * kLine));
  }
}

}  // namespace

void l2_prefetch(const void* ranges, int count, bool evict_last, cudaStream_t stream) {
  if (count <= 0) return;
  detail::launch("l2_prefetch", evict_last ? l2_prefetch_kernel<true> : l2_prefetch_kernel<false>,
                 dim3(unsigned(count), kBlocksPerRange), detail::kThreads, 0, stream, static_cast<const uint64_t*>(ranges));
}

}  // namespace kiln::cuda
