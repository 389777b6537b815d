#include "core/activation.hpp"

#include "core/error.hpp"

namespace kiln {

void fail_unknown_activation(Activation a, const char* where) {
  // Not activation_name: its own default calls here. In enum order.
  static const char* const kNames[] = {"none", "relu", "relu6", "silu", "sigmoid", "gelu"};
  const int v = static_cast<int>(a);
  if (v >= 0 && v < static_cast<int>(sizeof(kNames) / sizeof(kNames[0])))
    fail_runtime(where, ": activation ", kNames[v], " is not supported here");
  fail_runtime(where, ": unknown activation (enum value ", v, ")");
}

}  // namespace kiln
