// Decodes and pre-processes images on worker threads ahead of the engine, in
// a bounded window, and hands them out strictly in input order, so results
// are identical to doing it on one thread (pre-processing is deterministic
// and batches are formed in the same order).
#pragma once
#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace kiln {

class PreprocessAhead {
 public:
  using Work = std::function<std::vector<float>(size_t index)>;
  struct Item {
    std::vector<float> pixels;  // empty when `error` is set
    std::string error;          // an input error of this item (kiln::Error kind Input)
  };

  // `work(i)` runs for i = 0..count-1 on `threads` workers, at most `window`
  // items ahead of the consumer (memory stays window x one image).
  PreprocessAhead(size_t count, Work work, int threads, size_t window);
  ~PreprocessAhead();  // stops and joins the workers, even mid-way
  PreprocessAhead(const PreprocessAhead&) = delete;
  PreprocessAhead& operator=(const PreprocessAhead&) = delete;

  // Item i (call with 0, 1, 2, ... in order). Errors other than input errors
  // (out of memory, runtime faults) are rethrown here, on the caller's thread.
  Item take(size_t index);

 private:
  void worker();
  struct Slot {
    Item item;
    std::exception_ptr fatal;
    bool ready = false;
  };
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
