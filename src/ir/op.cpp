#include "ir/op.hpp"

#include "core/error.hpp"

namespace kiln {

namespace {
constexpr OpInfo kOps[] = {
#define KILN_OP(e, name, min_in, max_in) {Op::e, name, min_in, max_in},
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
}  // namespace

const OpInfo& op_info(Op op) {
  // An Op outside the table (a corrupt value) must not index past it: every
  // switch's default names the op through here.
  if (static_cast<size_t>(op) >= kOpCount) fail_runtime("unknown op (enum value ", static_cast<int>(op), ")");
  return kOps[static_cast<size_t>(op)];
}

std::optional<Op> op_from_name(std::string_view name) {
  for (const auto& o : kOps)
    if (name == o.name) return o.op;
  return std::nullopt;
}

}  // namespace kiln
