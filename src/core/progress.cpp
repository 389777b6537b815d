#include "core/progress.hpp"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace kiln {

namespace {

std::string clock_time(double seconds) {
  const long s = std::lround(std::max(0.0, seconds));
  char buf[32];
  if (s >= 3600) std::snprintf(buf, sizeof(buf), "%ld:%02ld:%02ld", s / 3600, s / 60 % 60, s % 60);
  else std::snprintf(buf, sizeof(buf), "%ld:%02ld", s / 60, s % 60);
  return buf;
}

}  // namespace

bool stderr_is_tty() { return isatty(2) == 1; }

ProgressBar::ProgressBar(std::string label, int64_t total, bool enabled, std::ostream& out, std::string unit)
    : label_(std::move(label)), unit_(std::move(unit)), total_(total), enabled_(enabled), out_(out),
      start_(std::chrono::steady_clock::now()), last_draw_(start_) {}

ProgressBar::~ProgressBar() {
  if (enabled_ && !finished_ && done_ > 0) finish();
}

std::string ProgressBar::format(const std::string& label, int64_t done, int64_t total, double seconds,
                                const std::string& unit, int bar_width) {
  std::string line = label + " ";
  const double frac = total > 0 ? std::clamp(static_cast<double>(done) / total, 0.0, 1.0) : 0.0;
  if (total > 0) {
    const int filled = static_cast<int>(frac * bar_width);
    line += "[" + std::string(filled, '#') + std::string(bar_width - filled, ' ') + "] ";
  }
  char buf[96];
  if (total > 0) std::snprintf(buf, sizeof(buf), "%lld/%lld %d%%", static_cast<long long>(done),
                               static_cast<long long>(total), static_cast<int>(frac * 100));
  else std::snprintf(buf, sizeof(buf), "%lld", static_cast<long long>(done));
  line += buf;
  // Rate and ETA only once there is something to estimate from.
  if (done > 0 && seconds > 0) {
    const double rate = done / seconds;
    std::snprintf(buf, sizeof(buf), rate >= 100 ? " %.0f %s/s" : " %.1f %s/s", rate, unit.c_str());
    line += buf;
    if (total > done) line += " ETA " + clock_time((total - done) / rate);
    else if (total > 0) line += " in " + clock_time(seconds);
  }
  return line;
}

void ProgressBar::update(int64_t done) {
  done_ = done;
  draw(total_ > 0 && done_ >= total_);
}

void ProgressBar::finish() {
  if (finished_) return;
  finished_ = true;
  if (!enabled_ || (done_ == 0 && last_len_ == 0)) return;  // never started: no empty line
  if (drawn_ != done_) draw(true);
  out_ << "\n" << std::flush;
}

void ProgressBar::draw(bool force) {
  if (!enabled_) return;
  const auto now = std::chrono::steady_clock::now();
  if (!force && now - last_draw_ < std::chrono::milliseconds(100)) return;
  last_draw_ = now;
  const std::string line = format(label_, done_, total_, std::chrono::duration<double>(now - start_).count(), unit_);
  // Pad with spaces so a shorter line fully covers the previous one.
  out_ << "\r" << line << std::string(last_len_ > line.size() ? last_len_ - line.size() : 0, ' ') << std::flush;
  last_len_ = line.size();
  drawn_ = done_;
}

}  // namespace kiln
