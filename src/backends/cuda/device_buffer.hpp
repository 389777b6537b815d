// RAII device memory and library handles, so an exception half-way through
// loading an engine frees everything it had taken. Every device allocation
// kiln makes goes through DeviceBuffer, which keeps a process-wide count of
// live bytes and buffers: tests check that loads, runs and failed loads give
// everything back by this count (device-wide free memory is shared with other
// processes, and cuDNN/cuBLASLt keep caches of their own). A limit on that
// count (DeviceMemoryLimit) provokes out-of-memory at any point of a load.
#pragma once
#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <cstddef>
#include <utility>

#include "backends/cuda/cuda_check.hpp"

namespace kiln::cuda {

struct DeviceMemoryStats {
  size_t bytes = 0;    // live bytes allocated through DeviceBuffer
  size_t buffers = 0;  // live DeviceBuffers holding memory
  size_t peak = 0;     // largest `bytes` since the process started (or reset_peak)
};
DeviceMemoryStats device_memory_stats();
void reset_device_memory_peak();

// While one lives, an allocation that would take kiln's live bytes above
// `bytes` fails as out of device memory (for tests of out-of-memory paths);
// 0 refuses every allocation.
class DeviceMemoryLimit {
 public:
  explicit DeviceMemoryLimit(size_t bytes);
  ~DeviceMemoryLimit();
  DeviceMemoryLimit(const DeviceMemoryLimit&) = delete;
  DeviceMemoryLimit& operator=(const DeviceMemoryLimit&) = delete;

 private:
  size_t prev_;
};

namespace detail {
// Reserve `bytes` in the count (false: over the limit) / give them back.
bool count_alloc(size_t bytes);
void count_free(size_t bytes);
}  // namespace detail

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    if (bytes) {
      if (!detail::count_alloc(bytes)) {
        bytes_ = 0;
        fail_runtime("out of device memory: cannot allocate ", bytes, " bytes (kiln's device memory limit reached: ",
                     device_memory_stats().bytes, " bytes in use)");
      }
      cudaError_t e = cudaMalloc(&ptr_, bytes);
      if (e != cudaSuccess) {
        cudaGetLastError();
        ptr_ = nullptr;
        detail::count_free(bytes);
        bytes_ = 0;
        fail_runtime("out of device memory: cannot allocate ", bytes, " bytes (", cudaGetErrorString(e), ")");
      }
    }
  }
  ~DeviceBuffer() { release(); }
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      release();
      ptr_ = std::exchange(o.ptr_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* get() const { return ptr_; }
  size_t size() const { return bytes_; }

 private:
  void release() {
    if (ptr_) {
      cudaFree(ptr_);
      detail::count_free(bytes_);
      ptr_ = nullptr;
    }
  }
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// Page-locked host memory (cudaMallocHost): what async copies to and from the
// host need, inside CUDA graphs too. Not counted in the device memory limit.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  explicit PinnedBuffer(size_t bytes) : bytes_(bytes) {
    if (bytes && cudaMallocHost(&ptr_, bytes) != cudaSuccess) {
      cudaGetLastError();
      ptr_ = nullptr;
      bytes_ = 0;
      fail_runtime("out of pinned host memory: cannot allocate ", bytes, " bytes");
    }
  }
  ~PinnedBuffer() {
    if (ptr_) cudaFreeHost(ptr_);
  }
  PinnedBuffer(PinnedBuffer&& o) noexcept : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  PinnedBuffer& operator=(PinnedBuffer&& o) noexcept {
    if (this != &o) {
      if (ptr_) cudaFreeHost(ptr_);
      ptr_ = std::exchange(o.ptr_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
    }
    return *this;
  }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  char* get() const { return static_cast<char*>(ptr_); }
  size_t size() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

struct CudnnHandle {
  cudnnHandle_t h = nullptr;
  CudnnHandle() { KILN_CUDNN_CHECK(cudnnCreate(&h)); }
  ~CudnnHandle() {
    if (h) cudnnDestroy(h);
  }
  CudnnHandle(const CudnnHandle&) = delete;
  CudnnHandle& operator=(const CudnnHandle&) = delete;
};

struct CublasLtHandle {
  cublasLtHandle_t h = nullptr;
  CublasLtHandle() { KILN_CUBLAS_CHECK(cublasLtCreate(&h)); }
  ~CublasLtHandle() {
    if (h) cublasLtDestroy(h);
  }
  CublasLtHandle(const CublasLtHandle&) = delete;
  CublasLtHandle& operator=(const CublasLtHandle&) = delete;
};

struct Stream {
  cudaStream_t s = nullptr;
  Stream() { KILN_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)); }
  ~Stream() {
    if (s) cudaStreamDestroy(s);
  }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
};

struct Event {
  cudaEvent_t e = nullptr;
  Event() { KILN_CUDA_CHECK(cudaEventCreate(&e)); }
  ~Event() {
    if (e) cudaEventDestroy(e);
  }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
};

}  // namespace kiln::cuda
