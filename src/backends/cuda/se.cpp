// The CUDA lowering of the squeeze-excitation group (se_plan.hpp; kernels in se.cu).
#include "backends/cuda/lower.hpp"

namespace kiln::cuda {

namespace {

// The two 1x1 convs of an SE block: first conv node a, second conv node b.
struct SeMlp {
  int pooled;
  const void *w1, *b1, *w2, *b2;
  int batch_n, c, cr;
  Activation act1, act2;
};

SeMlp se_mlp_of(Lowering& L, const Node& a, const Node& b) {
  const int pooled = a.inputs[0];
  return {pooled, L.weight(a.inputs[1]), L.weight(a.inputs[2]), L.weight(b.inputs[1]), L.weight(b.inputs[2]),
          as_int(L.g.values[pooled].shape[0]), as_int(L.g.values[pooled].shape[1]), as_int(L.g.values[a.outputs[0]].shape[1]),
          a.activation(), b.activation()};
}

}  // namespace

void lower_se_mlp(Lowering& L, size_t ni) {
  const Node& a = L.g.nodes[L.f.se.mlp_at.at(ni).reduce];
  const Node& b = L.g.nodes[ni];
  const SeMlp s = se_mlp_of(L, a, b);
  const int out = b.outputs[0];
  const DType dt = L.g.values[out].dtype;
  L.p.workspace_bytes = std::max(L.p.workspace_bytes, se_mlp_workspace_bytes(s.batch_n, s.cr));
  const ValuePtr ptr = L.ptr;
  L.node_name = a.name + "+" + b.name;
  L.step("se_mlp", [=](const Exec& x) {
    se_mlp(ptr(x, s.pooled), s.w1, s.b1, s.w2, s.b2, ptr(x, out), dt, s.batch_n, s.c, s.cr, s.act1, s.act2, x.workspace,
           x.workspace_bytes, x.stream);
  });
  L.record(a.name, "kiln se_mlp");
  L.record(b.name, "kiln se_mlp");
}

void lower_se_mlp_scale(Lowering& L, size_t ni) {
  const SqueezeExcitation& se = L.f.se.scale_at.at(ni);
  const Node& a = L.g.nodes[se.reduce];
  const Node& b = L.g.nodes[se.expand];
  const Node& mul = L.g.nodes[ni];
  const SeMlp s = se_mlp_of(L, a, b);
  const int xin = mul.inputs[0], out = mul.outputs[0];
  const Shape xs = L.g.values[xin].shape;
  const DType dt = L.g.values[out].dtype;
  const int hw = as_int(xs[2] * xs[3]);
  L.p.workspace_bytes = std::max(L.p.workspace_bytes, se_mlp_workspace_bytes(s.batch_n, s.cr));
  const ValuePtr ptr = L.ptr;
  L.node_name = a.name + "+" + b.name + "+" + mul.name;
  L.step("se_mlp_scale", [=](const Exec& x) {
    se_mlp_scale(ptr(x, s.pooled), s.w1, s.b1, s.w2, s.b2, ptr(x, xin), ptr(x, out), dt, s.batch_n, hw, s.c, s.cr, s.act1,
                 s.act2, x.workspace, x.workspace_bytes, x.stream);
  });
  L.record(a.name, "kiln se_mlp_scale");
  L.record(b.name, "kiln se_mlp_scale");
}

}  // namespace kiln::cuda
