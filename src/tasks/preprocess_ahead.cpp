#include "tasks/preprocess_ahead.hpp"

#include <algorithm>

#include "core/error.hpp"

namespace kiln {

PreprocessAhead::PreprocessAhead(size_t count, Work work, int threads, size_t window)
    : count_(count), window_(std::max<size_t>(1, window)), work_(std::move(work)), slots_(count) {
  const int n = std::max(1, std::min<int>(threads, static_cast<int>(std::max<size_t>(1, count))));
  for (int i = 0; i < n; ++i) threads_.emplace_back([this] { worker(); });
}

PreprocessAhead::~PreprocessAhead() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
}

void PreprocessAhead::worker() {
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

PreprocessAhead::Item PreprocessAhead::take(size_t index) {
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

}  // namespace kiln
