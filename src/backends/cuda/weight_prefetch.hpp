// Switch weight_prefetch: the weights of a call's last steps pulled into L2 by
// one launch on the side lane, before those steps run.
//
// Why: an engine call streams more bytes than L2 holds (RT-DETR r18vd at
// batch 1: ~40 MB of fp16 weights and tens of MB of activations against the
// H100's and H200's 50 MB), so each call finds most weights back in device
// memory. The decoder's launches are short (2-5 us) and their weight reads sit
// on the critical path: a cuBLASLt GEMM (no PDL) reads its panel after the
// launch before it ends, and mlp_chain's L2 prefetch before its PDL wait gets
// only the kernel before it (~2 us) of lead. In-graph, the linked chain took
// 16-18 us against 12.8 us in the probe, which replays it with its weights
// hot (H100, sessions 26 and 34). One side-lane kernel that issues
// prefetch.global.L2 over the weights of the steps at the end of the call,
// forked where those steps begin, costs the main lane nothing and changes no
// bit (it reads constants and writes nothing).
//
// Which steps: walking back from the last step, every step whose graph
// constants still fit in kWeightPrefetchElements (12 MiB at 16 bits: a quarter
// of the H100's and H200's L2, so the activations written meanwhile leave them
// there) with those of the steps after it. The rule reads the graph (each
// launch's constants, GraphFacts' launch positions), so a build and a load
// place the step alike; what the step prefetches is the device ranges the
// covered steps' lowering took (Lowering::weight_reads: the weights, or the
// re-laid-out copies a kernel reads instead). A bundle records that it uses
// the prefetch (plan key `weight_prefetch`); its step and side run are in the
// plan's step list and side lane.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <utility>
#include <vector>

namespace kiln::cuda {

struct DeviceRange {
  const void* ptr = nullptr;
  size_t bytes = 0;
};

inline constexpr int64_t kWeightPrefetchElements = int64_t(6) << 20;

// The first step of the longest tail of steps whose constants fit in `budget`
// elements: `step_nodes` the node each step runs (launch order), `constants`
// per launch node the graph constants its launch reads (value id, elements;
// a constant read by several launches counts once). None when the tail holds
// no constant, or when not even the last step's fit.
std::optional<size_t> weight_prefetch_start(const std::vector<int>& step_nodes,
                                            const std::map<int, std::vector<std::pair<int, int64_t>>>& constants,
                                            int64_t budget);

// The distinct ranges (by address, first read first) that `reads` lists for
// the nodes of steps from `start` on.
std::vector<DeviceRange> weight_prefetch_ranges(const std::vector<int>& step_nodes, size_t start,
                                                const std::map<int, std::vector<DeviceRange>>& reads);

// The launch: prefetch.global.L2 over every 128-byte line of `count` ranges
// (`ranges`: a device copy of {address, bytes} pairs as uint64_t), with the
// evict-last priority when `evict_last` (switch prefetch_evict_last: the lines
// are the last L2 gives up to the activations streaming past; without it they
// are ordinary lines). Reads nothing into registers, writes nothing.
void l2_prefetch(const void* ranges, int count, bool evict_last, cudaStream_t stream);

}  // namespace kiln::cuda
