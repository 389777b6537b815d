// A one-line progress bar for long CLI work (eval over a data set, tactic
// timing in a build): count, percentage, rate and ETA, redrawn in place with
// '\r'. It draws only when enabled; the CLI enables it when stderr is a
// terminal and neither --json nor --quiet was given, so logs and pipes never
// see control characters.
#pragma once
#include <chrono>
#include <cstdint>
#include <ostream>
#include <string>

namespace kiln {

class ProgressBar {
 public:
  ProgressBar(std::string label, int64_t total, bool enabled, std::ostream& out, std::string unit = "it");
  ~ProgressBar();  // finishes the line if the caller did not
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  // Sets the count done so far; redraws at most every 100 ms (and always on
  // the last item) so a fast loop does not spend its time printing.
  void update(int64_t done);
  void set_total(int64_t total) { total_ = total; }
  // Draws the final state and ends the line.
  void finish();
  bool enabled() const { return enabled_; }

  // The line itself, for tests: "eval [#####     ] 120/360 33% 45.1 img/s ETA 0:05".
  static std::string format(const std::string& label, int64_t done, int64_t total, double seconds,
                            const std::string& unit, int bar_width = 24);

 private:
  void draw(bool force);
  std::string label_, unit_;
  int64_t total_, done_ = 0, drawn_ = -1;
  bool enabled_, finished_ = false;
  std::ostream& out_;
  std::chrono::steady_clock::time_point start_, last_draw_;
  size_t last_len_ = 0;
};

// Whether file descriptor 2 is a terminal (the usual `enabled` test).
bool stderr_is_tty();

}  // namespace kiln
