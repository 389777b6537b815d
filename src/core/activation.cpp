#include "core/activation.hpp"

#include "core/error.hpp"

namespace kiln {

void fail_unknown_activation(Activation a, const char* where) {
  fail_runtime(where, ": unknown activation (enum value ", static_cast<int>(a), ")");
}

}  // namespace kiln
