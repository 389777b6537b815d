// Errors carry a kind that maps onto the CLI exit codes of DESIGN.md §5
// (1 usage, 2 input, 3 runtime) and a message that names the file, tensor,
// layer or key at fault.
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

#include "../../include/kiln/kiln.hpp"  // Error and ErrorKind are public API

namespace kiln {


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
