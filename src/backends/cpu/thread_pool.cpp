#include "backends/cpu/thread_pool.hpp"

#include <algorithm>
#include <atomic>
#include <exception>

namespace kiln::cpu {

namespace {
// Set in worker threads so a kernel that calls parallel_for from inside a
// chunk runs inline instead of waiting on workers that are all busy.
thread_local const ThreadPool* t_worker_of = nullptr;

int64_t chunk_begin(int64_t n, int64_t chunks, int64_t i);
}  // namespace

// Start of chunk i of [0, n) split evenly into `chunks` (the first n % chunks
// chunks get one extra item); chunk_begin(n, chunks, chunks) == n.
namespace {
int64_t chunk_begin(int64_t n, int64_t chunks, int64_t i) {
  const int64_t base = n / chunks, extra = n % chunks;
  return i * base + std::min(i, extra);
}
}  // namespace

// Each parallel_for gets a fresh Job so a worker that wakes late and still
// holds the previous job only sees its exhausted chunk counter; it can never
// pick up a chunk of a newer job with stale data.
struct ThreadPool::Job {
  const std::function<void(int64_t, int64_t)>* fn = nullptr;
  int64_t n = 0;
  int64_t chunks = 0;
  std::atomic<int64_t> next{0};
  std::mutex mutex;
  std::condition_variable done_cv;
  int64_t done = 0;  // guarded by mutex
  std::exception_ptr error;  // guarded by mutex; first failure wins

  // Takes chunks until none are left; returns once this thread has no more.
  void run_chunks() {
    for (;;) {
      const int64_t i = next.fetch_add(1, std::memory_order_relaxed);
      if (i >= chunks) return;
      const int64_t begin = chunk_begin(n, chunks, i), end = chunk_begin(n, chunks, i + 1);
      std::exception_ptr err;
      try {
        (*fn)(begin, end);
      } catch (...) {
        err = std::current_exception();
      }
      std::lock_guard<std::mutex> lock(mutex);
      if (err && !error) error = err;
      if (++done == chunks) done_cv.notify_all();
    }
  }
};

ThreadPool::ThreadPool(int threads) {
  if (threads <= 0) threads = static_cast<int>(std::thread::hardware_concurrency());
  threads_ = std::max(1, threads);
  workers_.reserve(threads_ - 1);
  for (int i = 1; i < threads_; ++i) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::worker_loop() {
  t_worker_of = this;
  uint64_t seen = 0;
  for (;;) {
    std::shared_ptr<Job> job;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      job = job_;
    }
    if (job) job->run_chunks();
  }
}

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn, int64_t grain) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  const int64_t chunks = std::min<int64_t>(threads_, (n + grain - 1) / grain);
  // Serial fallbacks walk the very chunks the workers would get, so a kernel
  // whose arithmetic follows its chunk boundaries (a GEMM split by rows) gives
  // the same bits whether or not another context is using the pool.
  auto serial = [&] {
    for (int64_t i = 0; i < chunks; ++i) fn(chunk_begin(n, chunks, i), chunk_begin(n, chunks, i + 1));
  };
  if (chunks <= 1 || t_worker_of == this) {
    serial();
    return;
  }
  std::unique_lock<std::mutex> submit(submit_mutex_, std::try_to_lock);
  if (!submit.owns_lock()) {
    serial();
    return;
  }
  auto job = std::make_shared<Job>();
  job->fn = &fn;
  job->n = n;
  job->chunks = chunks;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    job_ = job;
    ++generation_;
  }
  wake_.notify_all();
  job->run_chunks();
  std::exception_ptr error;
  {
    std::unique_lock<std::mutex> lock(job->mutex);
    job->done_cv.wait(lock, [&] { return job->done == job->chunks; });
    error = job->error;
  }
  {
    // Drop the pool's reference so the job (and the pointer to fn) does not
    // outlive this call in the pool's state.
    std::lock_guard<std::mutex> lock(mutex_);
    if (job_ == job) job_.reset();
  }
  if (error) std::rethrow_exception(error);
}

ThreadPool& default_pool() {
  static ThreadPool pool(0);
  return pool;
}

}  // namespace kiln::cpu
