// A small persistent thread pool for the CPU backend's kernels. Threads are
// created once and reused because kernels are called thousands of times per
// inference and thread start-up would dominate small ops.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace kiln::cpu {

class ThreadPool {
 public:
  // threads == 0 means std::thread::hardware_concurrency(). The calling
  // thread takes part in every parallel_for, so threads-1 workers are spawned.
  explicit ThreadPool(int threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int threads() const { return threads_; }

  // Splits [0, n) into at most threads() contiguous chunks of at least
  // `grain` items and calls fn(begin, end) on each. Runs the same chunks
  // inline, one after another, when called from inside one of this pool's
  // workers (nesting would deadlock) or while another thread is using the
  // pool (better to run serially than to block): the chunk boundaries never
  // depend on contention. The first exception thrown by any chunk is
  // rethrown here (after every chunk has finished, when run in parallel).
  void parallel_for(int64_t n, const std::function<void(int64_t begin, int64_t end)>& fn, int64_t grain = 1);

 private:
  struct Job;
  void worker_loop();

  int threads_ = 1;
  std::vector<std::thread> workers_;
  std::mutex mutex_;              // guards job_, generation_, stop_
  std::condition_variable wake_;  // signals a new job or stop
  std::shared_ptr<Job> job_;
  uint64_t generation_ = 0;
  bool stop_ = false;
  std::mutex submit_mutex_;  // one parallel_for in flight at a time
};

// Process-wide pool sized to the hardware; what the CPU backend uses unless
// the caller brings its own.
ThreadPool& default_pool();

}  // namespace kiln::cpu
