// Errors carry a kind that maps onto the CLI exit codes of DESIGN.md §5
// (1 usage, 2 input, 3 runtime) and a message that names the file, tensor,
// layer or key at fault.
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace kiln {

enum class ErrorKind { Usage = 1, Input = 2, Runtime = 3 };

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& msg) : std::runtime_error(msg), kind_(kind) {}
  ErrorKind kind() const { return kind_; }
  int exit_code() const { return static_cast<int>(kind_); }

 private:
  ErrorKind kind_;
};

// Concatenates anything streamable; g++ 12 has no std::format.
template <typename... Args>
std::string cat(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}

template <typename... Args>
[[noreturn]] void fail_input(Args&&... args) {
  throw Error(ErrorKind::Input, cat(std::forward<Args>(args)...));
}
template <typename... Args>
[[noreturn]] void fail_usage(Args&&... args) {
  throw Error(ErrorKind::Usage, cat(std::forward<Args>(args)...));
}
template <typename... Args>
[[noreturn]] void fail_runtime(Args&&... args) {
  throw Error(ErrorKind::Runtime, cat(std::forward<Args>(args)...));
}

}  // namespace kiln
