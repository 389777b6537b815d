#include "ir/verifier.hpp"

#include <set>

#include "core/error.hpp"
#include "ir/fusion_marks.hpp"
#include "ir/quant_form.hpp"

namespace kiln {

void verify_graph(const Graph& g, const std::string& stage) {
  const int nv = static_cast<int>(g.values.size());
  auto bad = [&](const std::string& what) { fail_runtime("IR verifier after '", stage, "': ", what); };
  std::vector<char> available(g.values.size(), 0);
  for (int v : g.inputs) {
    if (v < 0 || v >= nv) bad("graph input id out of range");
    // Inputs get the batch dimension (0) at run time and are copied in from the caller.
    if (g.values[v].constant) bad(cat("graph input '", g.values[v].name, "' is a constant"));
    if (g.values[v].shape.empty()) bad(cat("graph input '", g.values[v].name, "' has no batch dimension (rank 0)"));
    if (available[v]) bad(cat("graph input '", g.values[v].name, "' is listed twice"));
    available[v] = 1;
  }
  for (int v = 0; v < nv; ++v) {
    const Value& val = g.values[v];
    if (val.shape.size() > kMaxRank) bad(cat("value '", val.name, "' has rank ", val.shape.size(), " (at most ", kMaxRank, ")"));
    for (int64_t d : val.shape)
      if (d < 0) bad(cat("value '", val.name, "' has a negative dimension in ", shape_str(val.shape)));
    if (val.quant) {
      const std::string why = quant_problem(val, *val.quant);
      if (!why.empty()) bad(cat("value '", val.name, "' ", why));
    }
    if (!val.constant) continue;
    available[v] = 1;
    if (val.constant->dtype != val.dtype || val.constant->shape != val.shape)
      bad(cat("constant '", val.name, "' data does not match its dtype/shape"));
    if (val.constant->blob.size < val.constant->nbytes()) bad(cat("constant '", val.name, "' has too few bytes"));
  }
  std::set<std::string> names;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    if (!names.insert(n.name).second) bad(cat("duplicate node name '", n.name, "'"));
    for (int in : n.inputs) {
      if (in < 0 || in >= nv) bad(cat(n.name, ": input id out of range"));
      if (!available[in]) bad(cat(n.name, ": input '", g.values[in].name, "' used before it is produced"));
    }
    // Outputs: as many as the op has (ops.def), each a fresh non-constant
    // value whose producer link names this node, typed as the rule says.
    if (const std::string why = output_count_problem(n.op, n.outputs.size()); !why.empty()) bad(cat(n.name, ": ", why));
    for (size_t k = 0; k < n.outputs.size(); ++k) {
      const int out = n.outputs[k];
      if (out < 0 || out >= nv) bad(cat(n.name, ": output ", k, " id out of range"));
      if (g.values[out].constant) bad(cat(n.name, ": output ", k, " '", g.values[out].name, "' is a constant"));
      if (available[out]) bad(cat(n.name, ": output '", g.values[out].name, "' produced twice"));
      if (g.values[out].producer != static_cast<int>(i))
        bad(cat(n.name, ": output ", k, " '", g.values[out].name, "' has a stale producer link (", g.values[out].producer,
                ", not node ", i, ")"));
      available[out] = 1;
    }
    const std::vector<ValueType> types = infer_outputs(g, n);
    if (const std::string why = quant_node_problem(g, n); !why.empty()) bad(why);
    if (types.size() != n.outputs.size())
      bad(cat(n.name, ": ", n.outputs.size(), " outputs but its op rule gives ", types.size()));
    for (size_t k = 0; k < types.size(); ++k) {
      const Value& out = g.values[n.outputs[k]];
      if (types[k].dtype != out.dtype || types[k].shape != out.shape)
        bad(cat(n.name, ": output ", k, " recorded ", dtype_name(out.dtype), shape_str(out.shape), " but op rule gives ",
                dtype_name(types[k].dtype), shape_str(types[k].shape)));
    }
  }
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const std::string why = fusion_mark_problem(g, i);
    if (!why.empty()) bad(why);
  }
  for (int v : g.outputs) {
    if (v < 0 || v >= nv) bad("graph output id out of range");
    if (!available[v]) bad(cat("graph output '", g.values[v].name, "' is never produced"));
  }
  if (!g.uses_are_current()) bad("stale use-list: node inputs were edited without Graph::invalidate_uses()");
}

}  // namespace kiln
