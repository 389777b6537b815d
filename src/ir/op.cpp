#include "ir/op.hpp"

#include "core/error.hpp"

namespace kiln {

namespace {
constexpr OpInfo kOps[] = {
#define KILN_OP(e, name, min_in, max_in, min_out, max_out) {Op::e, name, min_in, max_in, min_out, max_out},
#include "ir/ops.def"
#undef KILN_OP
};
static_assert(sizeof(kOps) / sizeof(kOps[0]) == kOpCount, "op table and enum disagree");
constexpr bool ops_in_enum_order() {
  for (size_t i = 0; i < kOpCount; ++i)
    if (static_cast<size_t>(kOps[i].op) != i) return false;
  return true;
}
static_assert(ops_in_enum_order(), "op table must list ops in enum order");
constexpr bool counts_are_sane() {
  for (const auto& o : kOps)
    if (o.min_inputs < 0 || o.min_inputs > o.max_inputs || o.min_outputs < 1 || o.min_outputs > o.max_outputs) return false;
  return true;
}
static_assert(counts_are_sane(), "op table: every op needs 0 <= min_inputs <= max_inputs and 1 <= min_outputs <= max_outputs");

std::string count_problem(Op op, size_t count, int lo, int hi, const char* verb, const char* what) {
  if (count >= static_cast<size_t>(lo) && count <= static_cast<size_t>(hi)) return "";
  const std::string want = lo == hi ? std::to_string(lo) : cat(lo, "..", hi);
  return cat(op_info(op).name, " ", verb, " ", want, " ", what, hi == 1 ? "" : "s", ", got ", count);
}
}  // namespace

const OpInfo& op_info(Op op) {
  // An Op outside the table (a corrupt value) must not index past it: every
  // switch's default names the op through here.
  if (static_cast<size_t>(op) >= kOpCount) fail_runtime("unknown op (enum value ", static_cast<int>(op), ")");
  return kOps[static_cast<size_t>(op)];
}

std::string input_count_problem(Op op, size_t count) {
  return count_problem(op, count, op_info(op).min_inputs, op_info(op).max_inputs, "takes", "input");
}
std::string output_count_problem(Op op, size_t count) {
  return count_problem(op, count, op_info(op).min_outputs, op_info(op).max_outputs, "has", "output");
}

std::optional<Op> op_from_name(std::string_view name) {
  for (const auto& o : kOps)
    if (name == o.name) return o.op;
  return std::nullopt;
}

}  // namespace kiln
