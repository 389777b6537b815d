// Internal to the CUDA backend: pre-processing on the GPU (issue #11 part 4).
// Applies a PreprocessPlan (image/image.hpp: PIL's fixed-point resampling
// passes as tables, the crop origin and fill, the 3x256 float table of torch's
// ToTensor + Normalize) to a decoded 8-bit RGB image, writing the CHW float32
// tensor the engine takes. The GPU performs only what the tables say: the same
// int32 sums in PIL's tap order, the same shift and clip, table lookups for
// the floats; so its output is bit for bit the CPU's run_preprocess_plan
// (GPU test CudaPreprocess.BitIdenticalToTheCpuPlan).
#pragma once
#include <cstddef>
#include <cstdint>

#include "image/image.hpp"

namespace kiln::cuda {

class GpuPreprocessor {
 public:
  GpuPreprocessor();
  ~GpuPreprocessor();
  GpuPreprocessor(const GpuPreprocessor&) = delete;
  GpuPreprocessor& operator=(const GpuPreprocessor&) = delete;
  // Enqueues on `stream` (a cudaStream_t; null: the legacy default stream):
  // `rgb` is device (or pinned host) memory of plan.resize.in_h x in_w x 3
  // bytes, `chw` device memory of 3 x plan.out_h x plan.out_w floats. The
  // tables and intermediate images live in grow-only buffers of this object,
  // reused by the next call on the same stream without waiting; a call waits
  // for the previous one only when a buffer must grow or the stream changes.
  // `tables`: the device copy of write_tables' bytes for this plan (16-byte
  // aligned; a caller staging a batch copies them up with its images in one
  // transfer), or null: this call uploads them itself (one copy).
  void run(const PreprocessPlan& plan, const uint8_t* rgb, float* chw, void* stream, const void* tables = nullptr);
  // Bytes of the plan's tables (resampling indices and weights, the float
  // table) as write_tables lays them out, and their layout at `host`.
  static size_t table_bytes(const PreprocessPlan& plan);
  static void write_tables(const PreprocessPlan& plan, void* host);

 private:
  struct Impl;
  Impl* impl_;
};

}  // namespace kiln::cuda
