#include "backends/cuda/device_buffer.hpp"

#include <atomic>
#include <cstdint>

namespace kiln::cuda {

namespace {
std::atomic<size_t> g_bytes{0}, g_buffers{0}, g_peak{0};
// SIZE_MAX: no limit. A limit of 0 is a real one (nothing may be allocated).
std::atomic<size_t> g_limit{SIZE_MAX};
}  // namespace

namespace detail {

bool count_alloc(size_t bytes) {
  const size_t limit = g_limit.load();
  size_t now = g_bytes.load();
  do {
    if (bytes > limit || now > limit - bytes) return false;
  } while (!g_bytes.compare_exchange_weak(now, now + bytes));
  ++g_buffers;
  size_t peak = g_peak.load();
  while (now + bytes > peak && !g_peak.compare_exchange_weak(peak, now + bytes)) {
  }
  return true;
}

void count_free(size_t bytes) {
  g_bytes -= bytes;
  --g_buffers;
}

}  // namespace detail

DeviceMemoryStats device_memory_stats() { return {g_bytes.load(), g_buffers.load(), g_peak.load()}; }
void reset_device_memory_peak() { g_peak = g_bytes.load(); }

DeviceMemoryLimit::DeviceMemoryLimit(size_t bytes) : prev_(g_limit.exchange(bytes)) {}
DeviceMemoryLimit::~DeviceMemoryLimit() { g_limit = prev_; }

}  // namespace kiln::cuda
