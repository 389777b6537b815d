#pragma once
#include <cstddef>
#include <optional>
#include <string_view>

namespace kiln {

enum class Op : unsigned char {
#define KILN_OP(e, name, min_in, max_in) e,
#include "ir/ops.def"
#undef KILN_OP
};

inline constexpr size_t kOpCount = 0
#define KILN_OP(e, name, min_in, max_in) +1
#include "ir/ops.def"
#undef KILN_OP
    ;

struct OpInfo {
  Op op;
  const char* name;
  int min_inputs;
  int max_inputs;
};

const OpInfo& op_info(Op op);
inline const char* op_name(Op op) { return op_info(op).name; }
std::optional<Op> op_from_name(std::string_view name);

}  // namespace kiln
