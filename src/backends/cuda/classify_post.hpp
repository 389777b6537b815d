// Internal to the CUDA backend: classification's post-processing on the GPU
// (issue #11 part 4), so a task call copies out one small block instead of
// waiting on the host's softmax and sort.
#pragma once
#include <cuda_runtime.h>

namespace kiln::cuda {

// The most classes softmax_top_k ranks per row (larger k: the host post-processes).
inline constexpr int kMaxDeviceTopK = 32;

// Per row r of logits [rows, classes] (f32, device): the k largest logits'
// class ids (best first; equal logits: the lower id first, as the host's
// partial_sort orders them) into ids[r * k ...], and their softmax
// probabilities exp(l - max) / sum exp(l_j - max), computed in double and
// rounded once to f32 as the host does (the sum's order differs: a
// probability may differ from the host's in its last bit), into probs[r * k ...].
// One block per row; k in 1..kMaxDeviceTopK and k <= classes.
void softmax_top_k(const float* logits, int rows, int classes, int k, int* ids, float* probs, cudaStream_t stream);

}  // namespace kiln::cuda
