#pragma once
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace kiln {

enum class Op : unsigned char {
#define KILN_OP(e, name, min_in, max_in, min_out, max_out) e,
#include "ir/ops.def"
#undef KILN_OP
};

inline constexpr size_t kOpCount = 0
#define KILN_OP(e, name, min_in, max_in, min_out, max_out) +1
#include "ir/ops.def"
#undef KILN_OP
    ;

struct OpInfo {
  Op op;
  const char* name;
  int min_inputs;
  int max_inputs;
  int min_outputs;
  int max_outputs;
};

const OpInfo& op_info(Op op);
inline const char* op_name(Op op) { return op_info(op).name; }
std::optional<Op> op_from_name(std::string_view name);

// "" when a node of `op` may have `count` inputs (outputs), else why, e.g.
// "top_k has 2 outputs, got 1": the verifier, the graph.json reader and
// shape inference share the wording.
std::string input_count_problem(Op op, size_t count);
std::string output_count_problem(Op op, size_t count);

}  // namespace kiln
