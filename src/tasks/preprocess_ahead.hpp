// Decodes and pre-processes images on worker threads ahead of the engine, in
// a bounded window, and hands them out strictly in input order, so results
// are identical to doing it on one thread (pre-processing is deterministic
// and batches are formed in the same order). T is what a worker makes of one
// item: CHW floats by default, a decoded image for engines that pre-process
// on their device (Classifier::prepare_file).
#pragma once
#include <algorithm>
#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "core/error.hpp"

namespace kiln {

template <class T = std::vector<float>>
class PreprocessAhead {
 public:
  using Work = std::function<T(size_t index)>;
  struct Item {
    T pixels{};         // empty when `error` is set
    std::string error;  // an input error of this item (kiln::Error kind Input)
  };

  // `work(i)` runs for i = 0..count-1 on `threads` workers, at most `window`
  // items ahead of the consumer (memory stays window x one image).
  PreprocessAhead(size_t count, std::type_identity_t<Work> work, int threads, size_t window)
      : count_(count), window_(std::max<size_t>(1, window)), work_(std::move(work)), slots_(count) {
    const int n = std::max(1, std::min<int>(threads, static_cast<int>(std::max<size_t>(1, count))));
    for (int i = 0; i < n; ++i) threads_.emplace_back([this] { worker(); });
  }
  ~PreprocessAhead() {  // stops and joins the workers, even mid-way
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }
  PreprocessAhead(const PreprocessAhead&) = delete;
  PreprocessAhead& operator=(const PreprocessAhead&) = delete;

  // Item i (call with 0, 1, 2, ... in order). Errors other than input errors
  // (out of memory, runtime faults) are rethrown here, on the caller's thread.
  Item take(size_t index) {
    if (index >= count_ || index != consumed_) fail_runtime("PreprocessAhead::take(", index, ") out of order");
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return slots_[index].ready; });
    Slot slot = std::move(slots_[index]);
    slots_[index] = Slot{};
    ++consumed_;
    lock.unlock();
    cv_.notify_all();  // the window moved: a waiting worker may start the next item
    if (slot.fatal) std::rethrow_exception(slot.fatal);
    return std::move(slot.item);
  }

 private:
  struct Slot {
    Item item;
    std::exception_ptr fatal;
    bool ready = false;
  };
  void worker() {
    for (;;) {
      size_t i;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || next_ >= count_ || next_ < consumed_ + window_; });
        if (stop_ || next_ >= count_) return;
        i = next_++;
      }
      Slot done;
      try {
        done.item.pixels = work_(i);
      } catch (const Error& e) {
        if (e.kind() == ErrorKind::Input) done.item.error = e.what();
        else done.fatal = std::current_exception();
      } catch (...) {
        done.fatal = std::current_exception();
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        slots_[i].item = std::move(done.item);
        slots_[i].fatal = done.fatal;
        slots_[i].ready = true;
      }
      cv_.notify_all();
    }
  }
  size_t count_, window_;
  Work work_;
  std::vector<Slot> slots_;
  size_t next_ = 0, consumed_ = 0;
  bool stop_ = false;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::thread> threads_;
};

}  // namespace kiln
