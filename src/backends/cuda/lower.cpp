// The dispatch from a node to its op's lowering, generated from ops.def, and
// the Lowering helpers every op's lowering uses. See lower.hpp.
#include "backends/cuda/lower.hpp"

#include "core/error.hpp"
#include "ir/quant_form.hpp"

namespace kiln::cuda {

void Lowering::step(const std::string& kernel, std::function<void(const Exec&)> fn) {
  p.steps.push_back(std::move(fn));
  p.step_names.push_back(node_name);
  p.step_nodes.push_back(node_index);
  p.step_kernels.push_back(kernel);
}

void Lowering::record(const std::string& node, const std::string& tactic, float us) {
  m.chosen[batch][node] = tactic;
  if (us >= 0) m.chosen_us[batch][node] = us;
}

int Lowering::add_check(const std::string& what) {
  p.checks.push_back(what);
  return static_cast<int>(p.checks.size()) - 1;
}

const void* Lowering::engine_buffer(const std::string& key, const std::function<DeviceBuffer()>& make) {
  auto it = m.extra.find(key);
  if (it == m.extra.end()) it = m.extra.emplace(key, make()).first;
  note_read(it->second.get(), it->second.size());
  return it->second.get();
}

const void* Lowering::engine_copy(const std::string& key, const void* data, size_t bytes) {
  return engine_buffer(key, [&] {
    DeviceBuffer b(bytes);
    KILN_CUDA_CHECK(cudaMemcpy(b.get(), data, bytes, cudaMemcpyHostToDevice));
    return b;
  });
}

// Ops of ops.def the CUDA backend does not lower yet: refused naming the
// node. The op harness keeps the same list (kNotLoweredOnCuda in
// tests/ops/op_harness.hpp) and checks this file declares exactly those.
namespace {
std::string no_lowering(const Node& n) {
  return cat(n.name, ": the CUDA backend has no lowering for op ", op_name(n.op), " yet (build with --backend cpu)");
}
std::vector<Op>& not_lowered() {
  static std::vector<Op> ops;
  return ops;
}
struct NotLowered {
  explicit NotLowered(Op op) { not_lowered().push_back(op); }
};
}  // namespace

#define KILN_CUDA_NOT_LOWERED(E)                                                        \
  void lower_##E(Lowering& L, size_t ni) { fail_input(no_lowering(L.g.nodes[ni])); } \
  static const NotLowered not_lowered_##E{Op::E};
// Every op of ops.def but these has its lowering; an op added to ops.def
// before its CUDA lowering is declared here as KILN_CUDA_NOT_LOWERED(Enum).
#undef KILN_CUDA_NOT_LOWERED

std::string lowering_refusal(const Graph& g) {
  for (const Node& n : g.nodes) {
    for (Op op : not_lowered())
      if (n.op == op) return no_lowering(n);
    // 8-bit nodes: INT8 and the FP8 layers with no CUDA path (quant.cpp).
    if (std::string why = quant_refusal(g, n); !why.empty()) return why;
  }
  return "";
}

void lower_node(Lowering& L, size_t ni) {
  const Node& n = L.g.nodes[ni];
  // The squeeze-excitation and window-conv plans take 16-bit convs; one that
  // caught a quantized layer would run its codes as f16, so it is refused.
  if (is_quantized_layer(L.g, n) &&
      (L.f.fused_away[ni] || L.f.se.mlp_at.count(ni) || L.f.wp.convs.count(ni) || L.f.wp.launches.count(ni)))
    fail_input(n.name, ": a quantized layer inside a fused squeeze-excitation or window-conv group is not supported on "
               "CUDA (keep it 16-bit in the recipe)");
  if (L.f.folded_cast[ni] || L.f.fused_away[ni]) return;
  L.node_name = n.name;
  L.node_index = static_cast<int>(ni);
  if (!L.f.reference.empty() && L.f.reference[ni]) return lower_reference(L, ni);
  if (L.f.se.scale_at.count(ni)) return lower_se_mlp_scale(L, ni);
  if (L.f.se.mlp_at.count(ni)) return lower_se_mlp(L, ni);
  switch (n.op) {
#define KILN_OP(E, ...) \
  case Op::E: return lower_##E(L, ni);
#include "ir/ops.def"
#undef KILN_OP
    default: break;
  }
  fail_input(n.name, ": the CUDA backend has no lowering for op ", op_name(n.op));
}

}  // namespace kiln::cuda
