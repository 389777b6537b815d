// Linear's CUDA lowering: cuBLASLt (cublaslt_linear.hpp), its algorithms
// handed to the one tactic selector (tactics.hpp).
#include <algorithm>
#include <limits>

#include "backends/cuda/cuda_check.hpp"
#include "backends/cuda/lower.hpp"
#include "core/error.hpp"
#include "ir/quant_form.hpp"

namespace kiln::cuda {

void plan_wide_linears(const Graph& g, GraphFacts& f) {
  for (size_t ni = 0; ni < g.nodes.size(); ++ni) {
    const Node& n = g.nodes[ni];
    if (n.op != Op::Linear || f.fused_away[ni] || is_quantized_layer(g, n)) continue;
    const int v = n.inputs[0];
    const Value& xv = g.values[v];
    if (xv.dtype != DType::F32 || g.values[n.outputs[0]].dtype != DType::F32 || xv.producer < 0) continue;
    const auto ci = static_cast<size_t>(xv.producer);
    const Node& c = g.nodes[ci];
    if (c.op != Op::Cast || f.fused_away[ci] || f.folded_cast[ci]) continue;
    const int u = c.inputs[0];
    const Value& uv = g.values[u];
    if ((uv.dtype != DType::F16 && uv.dtype != DType::BF16) || uv.constant || stored_nhwc(uv) || f.viewed(u)) continue;
    bool weights_f32 = true;
    for (size_t k = 1; k < n.inputs.size(); ++k) weights_f32 &= g.is_constant(n.inputs[k]) && g.values[n.inputs[k]].dtype == DType::F32;
    if (!weights_f32 || g.consumers(v).size() != 1 || g.is_graph_output(v)) continue;
    f.fused_away[ci] = 1;
    f.wide_linears[ni] = u;
    f.alias[v] = u;  // never written: no arena bytes of its own
    f.live_through(u, static_cast<int>(ni));
  }
}

namespace {

// A linear plan_mlp_chains may take: float weights (and bias) as constants, no
// activation but ReLU or GELU, a 16-bit row-major input and output of one type, no
// width over kMaxMlpWidth, rows few enough that every block reading all the
// weights stays cheap (RT-DETR's decoder: 300 rows per image).
constexpr int64_t kMaxMlpRows = 4096;

bool chain_linear(const Graph& g, const GraphFacts& f, size_t ni) {
  const Node& n = g.nodes[ni];
  if (n.op != Op::Linear || f.fused_away[ni] || f.wide_linears.count(ni) || is_quantized_layer(g, n)) return false;
  if (n.inputs.size() < 2 || n.inputs.size() > 3) return false;
  const Activation a = n.activation();
  if (a != Activation::None && a != Activation::Relu && a != Activation::Gelu) return false;
  for (size_t k = 1; k < n.inputs.size(); ++k)
    if (!g.is_constant(n.inputs[k]) || !dtype_is_float(g.values[n.inputs[k]].dtype)) return false;
  const Value &x = g.values[n.inputs[0]], &y = g.values[n.outputs[0]], &w = g.values[n.inputs[1]];
  if ((x.dtype != DType::F16 && x.dtype != DType::BF16) || y.dtype != x.dtype || x.constant) return false;
  if (stored_nhwc(x) || stored_nhwc(y) || f.viewed(n.inputs[0]) || f.viewed(n.outputs[0]) || f.windows.count(n.inputs[0]))
    return false;
  if (w.shape.size() != 2 || w.shape[0] > kMaxMlpWidth || w.shape[1] > kMaxMlpWidth || code_out(g, n.outputs[0]).on())
    return false;
  return shape_numel(x.shape) / w.shape[1] <= kMaxMlpRows;
}

// The linear reading v as its input, when v is read by it alone; else kNoNode.
size_t next_in_chain(const Graph& g, const GraphFacts& f, int v) {
  const auto readers = g.consumers(v);
  if (readers.size() != 1 || g.is_graph_output(v)) return kNoNode;
  const auto r = static_cast<size_t>(readers[0]);
  return g.nodes[r].inputs[0] == v && chain_linear(g, f, r) ? r : kNoNode;
}

// w [n, k] in mma fragment order (kernels.hpp, mlp_chain.cu): for output tile
// t (8 rows of w) and k pair p (32 columns), lane L = 4 gid + tig holds row
// 8 t + gid at columns 32 p + 8 q + 2 tig + {0, 1}, q = 0..3; zero past n, k.
std::vector<float> pack_mlp_weights(const std::vector<float>& w, int64_t n, int64_t k, int n_pad, int k_pad) {
  std::vector<float> out(static_cast<size_t>(n_pad) * static_cast<size_t>(k_pad), 0.f);
  const int pairs = k_pad / 32;
  for (int t = 0; t < n_pad / 8; ++t)
    for (int p = 0; p < pairs; ++p)
      for (int lane = 0; lane < 32; ++lane) {
        const int64_t row = t * 8 + lane / 4;
        const size_t base = (static_cast<size_t>(t * pairs + p) * 32 + static_cast<size_t>(lane)) * 8;
        for (int q = 0; q < 4; ++q)
          for (int e = 0; e < 2; ++e) {
            const int64_t col = p * 32 + q * 8 + (lane % 4) * 2 + e;
            if (row < n && col < k) out[base + static_cast<size_t>(q * 2 + e)] = w[static_cast<size_t>(row * k + col)];
          }
      }
  return out;
}

int round_up(int64_t v, int to) { return static_cast<int>((v + to - 1) / to * to); }

}  // namespace

// The fused step of plan_mlp_chains' chain launched at node `at`: its last
// linear, or the layer norm that reads the last one through its residual add.
void lower_mlp_chain(Lowering& L, size_t at, const std::vector<size_t>& planned) {
  const Graph& g = L.g;
  // A link (plan_mlp_chains): the refinement and the second chain run here too.
  const auto link = L.f.mlp_chain_links.find(at);
  std::vector<size_t> chain = planned;
  if (link != L.f.mlp_chain_links.end()) chain.insert(chain.end(), link->second.next.begin(), link->second.next.end());
  const size_t tail = link != L.f.mlp_chain_links.end() ? chain.back() : at;  // the node whose output y is
  const int x = g.nodes[chain.front()].inputs[0], y = g.nodes[tail].outputs[0];
  const DType dt = g.values[x].dtype;
  const int64_t k0 = g.values[g.nodes[chain.front()].inputs[1]].shape[1];
  const int64_t rows = shape_numel(g.values[x].shape) / k0;
  const ValuePtr ptr = L.ptr;
  const int k = as_int(k0);
  const Node& ln = g.nodes[at];
  // A chain inside a layer norm's launch reads the norm's operands there:
  // plan_norm_adds' residual, position add and f32 copy.
  const bool in_norm = ln.op == Op::LayerNorm;
  const NormAdds adds = in_norm ? L.f.norm_adds.at(at) : NormAdds{};
  const Operand res = in_norm ? operand(L, other_input(g.nodes[adds.residual], g.nodes[chain.back()].outputs[0])) : Operand{};
  const NormOperands o = in_norm ? norm_operands(L, at, &adds) : NormOperands{};
  if (L.f.linear_norms.count(at)) {
    // small_gemm_norm (switch linear_norm): one plain block per 16 rows, the
    // weights as the graph holds them (the engine's copy in dt).
    const Node& lin = g.nodes[chain.front()];
    const Shape ws = g.values[lin.inputs[1]].shape;
    const int n = as_int(ws[0]), m = as_int(rows);
    const Activation act = lin.activation();
    if (const std::string why = small_gemm_norm_unsupported(dt, rows, n, k, act); !why.empty())
      fail_input(ln.name, ": the bundle runs ", lin.name, " inside it as small_gemm_norm, which does not take it here: ", why);
    const void* w = L.weight(lin.inputs[1]);
    const void* b = lin.inputs.size() > 2 ? L.weight(lin.inputs[2]) : nullptr;
    L.record(lin.name, cat("inside ", ln.name, " (small_gemm_norm, no launch of its own)"));
    L.record(ln.name, cat("kiln small_gemm_norm: ", lin.name, " with the residual layer norm"));
    L.step("kiln small_gemm_norm", [=](const Exec& e) {
      LayerNormIo io;
      io.x2 = res(e);
      o.fill(e, io);
      io.y = ptr(e, y);
      small_gemm_norm(ptr(e, x), w, b, dt, m, n, k, act, io, o.eps, e.stream);
    });
    return;
  }
  std::vector<MlpChainLayer> layers(chain.size());
  for (size_t l = 0; l < chain.size(); ++l) {
    const Node& n = g.nodes[chain[l]];
    const Shape ws = g.values[n.inputs[1]].shape;
    const bool is_last = l + 1 == chain.size();
    MlpChainLayer& m = layers[l];
    m.n = as_int(ws[0]);
    m.k_pad = round_up(ws[1], 32);
    m.n_pad = round_up(ws[0], is_last ? 8 : 32);
    m.act = n.activation();
    // Weights and bias rounded to the storage type as the unfused GEMM's are;
    // the bias is added in f32, as cuBLASLt's epilogue does.
    const HostTensor wq = HostTensor::from_f32_as(dt, ws, g.values[n.inputs[1]].constant->to_f32());
    const std::vector<float> packed = pack_mlp_weights(wq.to_f32(), ws[0], ws[1], m.n_pad, m.k_pad);
    const HostTensor wp = HostTensor::from_f32_as(dt, {static_cast<int64_t>(packed.size())}, packed);
    m.w = L.engine_copy(n.name + "#mlp_chain_weight", wp.blob.data, wp.nbytes());
    std::vector<float> bias(static_cast<size_t>(m.n_pad), 0.f);
    if (n.inputs.size() > 2) {
      const HostTensor bq = HostTensor::from_f32_as(dt, {ws[0]}, g.values[n.inputs[2]].constant->to_f32());
      const std::vector<float> bf = bq.to_f32();
      std::copy(bf.begin(), bf.end(), bias.begin());
    }
    m.b = static_cast<const float*>(L.engine_copy(n.name + "#mlp_chain_bias", bias.data(), bias.size() * sizeof(float)));
    if (chain[l] != at) L.record(n.name, cat("inside ", g.nodes[at].name, " (mlp_chain, no launch of its own)"));
  }
  const int cluster = mlp_chain_cluster(rows, device_sm_count());
  if (!in_norm) {
    std::string what = cat("mlp_chain of ", chain.size(), " linears"), kernel = "mlp_chain";
    // plan_mlp_chains' box refinement between linked chains, written by this launch.
    bool has_refine = false;
    int ref = -1, refine_y = -1, refine_narrow = -1;
    MlpChainRefine rf;
    if (link != L.f.mlp_chain_links.end()) {
      const BoxRefine& r = L.f.box_refines.at(link->second.refine);
      const Node& radd = g.nodes[link->second.refine];
      has_refine = true;
      ref = r.ref, refine_y = radd.outputs[0], refine_narrow = g.nodes[r.narrow].outputs[0];
      rf.layer = static_cast<int>(planned.size()) - 1;
      rf.eps = r.inverse == kNoNode ? -1.f : static_cast<float>(g.nodes[r.inverse].attr_float("eps", 1e-5));
      rf.act = radd.activation();
      for (size_t kn : {r.widen, r.inverse, link->second.refine, r.narrow})
        if (kn != kNoNode) L.record(g.nodes[kn].name, cat("inside ", ln.name, " (mlp_chain's box refinement, no launch of its own)"));
      what += cat(" with the box refinement ", radd.name);
      kernel += "_refine";
    }
    // plan_mlp_chains' add of the output and an earlier value, written by this launch.
    const auto fused = L.f.mlp_chain_sums.find(tail);
    const bool has_sum = fused != L.f.mlp_chain_sums.end();
    Operand other;
    int y_sum = -1;
    if (has_sum) {
      const Node& add = g.nodes[fused->second];
      other = operand(L, other_input(add, y));
      y_sum = add.outputs[0];
      L.record(add.name, cat("inside ", ln.name, " (mlp_chain's sum output, no launch of its own)"));
      what += cat(" with the sum ", add.name);
      kernel += "_sum";
    }
    L.record(ln.name, cat(what, ", cluster ", cluster));
    L.step(cat(kernel, " x", cluster), [=](const Exec& e) {
      MlpChainSum sum;
      if (has_sum) sum.add_to = other(e), sum.y = ptr(e, y_sum);
      MlpChainRefine r = rf;
      if (has_refine) {
        r.ref = static_cast<const float*>(ptr(e, ref));
        r.y = static_cast<float*>(ptr(e, refine_y));
        r.y_narrow = ptr(e, refine_narrow);
      }
      mlp_chain(ptr(e, x), ptr(e, y), dt, rows, k, layers.data(), static_cast<int>(layers.size()), cluster, e.stream, nullptr,
                has_sum ? &sum : nullptr, has_refine ? &r : nullptr);
    });
    return;
  }
  // The layer norm's launch takes the chain in.
  L.record(ln.name, cat("mlp_chain of ", chain.size(), " linears with the residual layer norm, cluster ", cluster));
  L.step(cat("mlp_chain_layer_norm x", cluster), [=](const Exec& e) {
    MlpChainNorm nm;
    nm.io.x2 = res(e), nm.eps = o.eps;
    o.fill(e, nm.io);
    mlp_chain(ptr(e, x), ptr(e, y), dt, rows, k, layers.data(), static_cast<int>(layers.size()), cluster, e.stream, &nm);
  });
}

namespace {

// A chain's weights each SM reads, at most: the per-block weight stream
// bounds a chain (mlp_chain.cu). H200, RT-DETR r18vd fp16 (session 21): at
// batch 1 (cluster 4) the box head's 64 KiB a block beat its three GEMMs
// and the FFN's 256 KiB lost to two GEMMs and a norm; at batch 8 (cluster
// 1: the whole 128-266 KiB a block) every chain lost. So: up to 96 KiB.
// Session 26 (the st.async hand-off, H100): with a 256 KiB cap for chains
// ending in a post-norm, the FFN's chain took ~18 us in the graph against
// ~10 us for its GEMMs and norm, and --enable fuse_mlp lost 0.653 -> 0.691 ms.
constexpr int64_t kMaxMlpBytesPerBlock = 96 * 1024;
constexpr size_t kMaxPlannedChain = 4;  // linears in one planned chain (links join two: kMaxMlpChain)

// The layer norm reading v through its fused residual add (plan_norm_adds), or kNoNode.
size_t norm_reading(const Graph& g, const GraphFacts& f, int v) {
  const auto readers = g.consumers(v);
  if (readers.size() != 1 || g.is_graph_output(v)) return kNoNode;
  for (const auto& [ln, adds] : f.norm_adds)
    if (adds.residual == static_cast<size_t>(readers[0])) {
      const Value& y = g.values[g.nodes[ln].outputs[0]];
      const Value& d = g.values[v];
      return y.dtype == d.dtype && y.shape == d.shape ? ln : kNoNode;
    }
  return kNoNode;
}

// RT-DETR's decoder between two layers (and before the first): box head
// chain -> box refinement (plan_box_refines: widen, inverse_sigmoid or the
// picked anchors, add + sigmoid, narrowing cast) -> query position head chain
// on the narrowed reference. Row by row these are one computation, so one
// launch runs them: the first chain's launch writes the refinement's f32
// result, its narrowed copy (the deformable attention reads it too), the
// second chain's result and its sum output (all live from that launch).
// The delta (the first chain's result) must have no other reader; the last
// decoder layer's refinement (the pred_boxes output, no narrowing) is left to
// its own launch.
void link_mlp_chains(const Graph& g, GraphFacts& f) {
  std::map<int, size_t> chain_by_input;  // first linear's input -> launch node, for plain chains
  for (const auto& [at, chain] : f.mlp_chains)
    if (g.nodes[at].op == Op::Linear) chain_by_input[g.nodes[chain.front()].inputs[0]] = at;
  for (auto& [b, r] : f.box_refines) {
    if (r.widen == kNoNode || r.narrow == kNoNode || r.ref < 0) continue;
    const int d = r.delta, y = g.nodes[b].outputs[0], nv = g.nodes[r.narrow].outputs[0];
    const int pa = g.values[d].producer;
    if (pa < 0 || g.consumers(d).size() != 1 || g.is_graph_output(d) || g.is_graph_output(y)) continue;
    const auto a = static_cast<size_t>(pa);
    const auto first = f.mlp_chains.find(a);
    const auto second = chain_by_input.find(nv);
    if (first == f.mlp_chains.end() || second == chain_by_input.end() || f.mlp_chain_sums.count(a) ||
        f.mlp_chain_links.count(a) || f.mlp_chain_links.count(second->second) || second->second <= b)
      continue;
    const size_t c = second->second;
    const std::vector<size_t>& next = f.mlp_chains.at(c);
    const Node& last_a = g.nodes[first->second.back()];
    if (first->second.size() + next.size() > static_cast<size_t>(kMaxMlpChain) || last_a.activation() != Activation::None ||
        g.values[r.ref].producer >= static_cast<int>(a) || g.values[d].shape != g.values[y].shape ||
        g.values[nv].dtype != g.values[d].dtype)
      continue;
    const auto sum = f.mlp_chain_sums.find(c);
    if (sum != f.mlp_chain_sums.end() &&
        g.values[other_input(g.nodes[sum->second], g.nodes[c].outputs[0])].producer >= static_cast<int>(a))
      continue;  // the sum's operand must exist at a
    // Written by the launch at a, before their own nodes.
    write_early(g, f, b, a);
    write_early(g, f, r.narrow, a);
    for (size_t k : next) f.fused_away[k] = 1;
    write_early(g, f, c, a);
    f.live_through(r.ref, static_cast<int>(a));
    if (sum != f.mlp_chain_sums.end()) write_early(g, f, sum->second, a);
    f.mlp_chain_links[a] = {b, next};
    chain_by_input.erase(second);
  }
  for (const auto& entry : f.mlp_chain_links) f.mlp_chains.erase(entry.second.next.back());
}

}  // namespace

// A one-linear chain ending in the post-norm `ln`: whether small_gemm_norm
// runs it (LinearNormRule).
bool linear_norm_takes(const Graph& g, const Node& lin, size_t ln, const LinearNormRule& rule) {
  if (rule.recorded) return rule.recorded->count(g.nodes[ln].name) > 0;
  if (!rule.on) return false;
  const Value& x = g.values[lin.inputs[0]];
  const Shape& ws = g.values[lin.inputs[1]].shape;
  const int64_t rows = shape_numel(x.shape) / ws[1];
  if (rows > rule.max_rows || ws[0] > INT32_MAX || ws[1] > INT32_MAX) return false;
  // The linear's and the norm's weights and biases of the rows' type (uploaded as the graph holds them).
  for (const Node* n : {&lin, &g.nodes[ln]})
    for (size_t k = 1; k < n->inputs.size(); ++k)
      if (g.values[n->inputs[k]].dtype != x.dtype) return false;
  return small_gemm_norm_unsupported(x.dtype, rows, as_int(ws[0]), as_int(ws[1]), lin.activation()).empty();
}

void plan_mlp_chains(const Graph& g, GraphFacts& f, int sms, bool chains, bool norms, const LinearNormRule& rule) {
  for (size_t ni = 0; ni < g.nodes.size(); ++ni) {
    // (A chain's last linear is its launch: planned already, not a new chain's start.)
    if (!chain_linear(g, f, ni) || f.mlp_chains.count(ni)) continue;
    // Chains start where the input does not come from a chain linear read by this one alone.
    const int in = g.nodes[ni].inputs[0];
    const int p = g.values[in].producer;
    if (p >= 0 && chain_linear(g, f, static_cast<size_t>(p)) && next_in_chain(g, f, in) == ni) continue;
    std::vector<size_t> chain = {ni};
    for (size_t nx = next_in_chain(g, f, g.nodes[ni].outputs[0]); nx != kNoNode && chain.size() < kMaxPlannedChain;
         nx = next_in_chain(g, f, g.nodes[chain.back()].outputs[0]))
      chain.push_back(nx);
    const size_t post = norm_reading(g, f, g.nodes[chain.back()].outputs[0]);
    if (chain.size() == 1 && post != kNoNode && linear_norm_takes(g, g.nodes[ni], post, rule)) {
      // small_gemm_norm: the linear runs inside the norm's launch (lower_mlp_chain).
      f.fused_away[ni] = 1;
      f.live_through(in, static_cast<int>(post));
      f.mlp_chains[post] = chain;
      f.linear_norms.insert(post);
      continue;
    }
    if (!chains) continue;
    const size_t ln = norms ? post : kNoNode;
    if (chain.size() < 2 && ln == kNoNode) continue;
    int64_t bytes = 0;
    for (size_t c : chain) bytes += shape_numel(g.values[g.nodes[c].inputs[1]].shape) * dtype_size(g.values[in].dtype);
    const int64_t rows = shape_numel(g.values[in].shape) / g.values[g.nodes[ni].inputs[1]].shape[1];
    if (bytes / mlp_chain_cluster(rows, sms) > kMaxMlpBytesPerBlock) continue;
    const size_t at = ln == kNoNode ? chain.back() : ln;
    for (size_t c : chain)
      if (c != at) f.fused_away[c] = 1;
    f.live_through(in, static_cast<int>(at));
    f.mlp_chains[at] = chain;
    const int y = g.nodes[at].outputs[0];
    if (ln == kNoNode)
      if (const size_t add = earlier_sum_reader(g, f, y, at); add != kNoNode) {
        write_early(g, f, add, at);
        f.live_through(other_input(g.nodes[add], y), static_cast<int>(at));
        f.mlp_chain_sums[at] = add;
      }
  }
  link_mlp_chains(g, f);
}

void lower_Linear(Lowering& L, size_t ni) {
  if (is_quantized_layer(L.g, L.g.nodes[ni])) return lower_quantized_linear(L, ni);
  if (const auto chain = L.f.mlp_chains.find(ni); chain != L.f.mlp_chains.end()) return lower_mlp_chain(L, ni, chain->second);
  const Graph& g = L.g;
  const Node& n = g.nodes[ni];
  // plan_wide_linears: the 16-bit value behind the widening cast, its type the product's.
  const auto wide = L.f.wide_linears.find(ni);
  const int in0 = wide != L.f.wide_linears.end() ? wide->second : n.inputs[0], out = n.outputs[0];
  const Shape xs = g.values[in0].shape, ws = g.values[n.inputs[1]].shape;
  const DType dt = g.values[out].dtype, xdt = g.values[in0].dtype;
  const bool has_bias = n.inputs.size() > 2;
  // x[..., K] is numel / K rows of K in row-major order: a 4-D x and y
  // (stored NHWC, lower.hpp) go through the workspace (RowMajorIo), and
  // cuBLASLt's workspace follows that scratch.
  const RowMajorIo io(L, {in0}, {out});
  const size_t scratch = io.scratch_bytes();
  const int64_t rows = shape_numel(xs) / ws[1];
  // Switch small_gemm: kiln's small linear with PDL (small_gemm.cu says why)
  // instead of cuBLASLt's timed algorithms; on: every 16-bit linear it takes;
  // auto: those of the shapes where it won in the graph (small_gemm_preferred)
  // at build, and at load what the bundle recorded (a bundle built before the
  // auto setting took it keeps its cuBLASLt algorithms).
  const std::optional<bool> small = L.m.opts.switches.get(Switch::SmallGemm);
  const int nn = as_int(ws[0]), k = as_int(ws[1]);
  const Activation act = n.activation();
  const auto small_auto = [&] {
    const std::string rec = L.tactics.recorded(n.name);
    return rec.empty() ? small_gemm_preferred(rows, nn, k, act) : rec == "kiln small_gemm";
  };
  if (small.value_or(true) && xdt == dt && small_gemm_unsupported(dt, rows, nn, k, act).empty() &&
      (small.has_value() || small_auto())) {
    const void* w = L.weight(n.inputs[1]);
    const void* b = has_bias ? L.weight(n.inputs[2]) : nullptr;
    const int m = as_int(rows);
    L.record(n.name, "kiln small_gemm");
    L.reserve_workspace(scratch);
    L.step(io.kernel("kiln small_gemm"), [=](const Exec& x) {
      io.load(x);
      small_gemm(io.in(x, 0), w, b, io.out(x, 0), dt, m, nn, k, act, x.stream);
      io.store(x);
    });
    return;
  }
  auto owned = std::make_unique<LinearOp>(L.m.lt.h, xdt, as_int(rows), k, nn, has_bias, act,
                                          L.m.opts.allow_tf32, dt);
  LinearOp* op = owned.get();
  L.p.linears.push_back(std::move(owned));
  const void* w = L.weight(n.inputs[1]);
  if (xdt != dt) {  // the f32 weights rounded once (RNE) to the input's type
    const HostTensor& wt = *g.values[n.inputs[1]].constant;
    const HostTensor narrow = HostTensor::from_f32_as(xdt, wt.shape, wt.to_f32());
    w = L.engine_copy(n.name + "#" + dtype_name(xdt) + "_weight", narrow.blob.data, narrow.nbytes());
    L.record(g.nodes[static_cast<size_t>(g.values[n.inputs[0]].producer)].name,
             cat("inside ", n.name, " (", dtype_name(xdt), " product with f32 output, no launch of its own)"));
  }
  const void* b = has_bias ? L.weight(n.inputs[2]) : nullptr;
  DeviceBuffer xb, yb;  // timing scratch, allocated when first timed
  std::vector<Candidate> cands;
  for (int t = 0; t < op->tactic_count(); ++t)
    cands.push_back({op->tactic_name(t), [op, t] { return op->select(t), true; },
                     [&, op](cudaStream_t s, void* wsp, size_t cap) {
                       if (op->workspace_bytes() > cap) return false;
                       if (!xb.get()) {
                         xb = DeviceBuffer(value_bytes(g.values[in0])), yb = DeviceBuffer(value_bytes(g.values[out]));
                         KILN_CUDA_CHECK(cudaMemsetAsync(xb.get(), 0, xb.size(), s));
                       }
                       op->run(xb.get(), w, b, yb.get(), wsp, cap, s);
                       return true;
                     }});
  LayerSignature sig{"linear", dt, {xs, ws}, {}};
  if (xdt != dt) sig.attr("x_dtype", static_cast<int64_t>(xdt));  // the mixed product (plan_wide_linears)
  sig.attr("bias", has_bias).attr("act", static_cast<int64_t>(n.activation())).attr("tf32", L.m.opts.allow_tf32);
  const TacticChoice c = L.tactics.choose(n.name, sig, cands, 0);
  L.tactics.finish();
  L.record(n.name, cands[c.index].name, c.us);
  L.reserve_workspace(scratch + op->workspace_bytes());
  L.step(io.kernel(cands[c.index].name), [op, w, b, io, scratch](const Exec& x) {
    io.load(x);
    op->run(io.in(x, 0), w, b, io.out(x, 0), static_cast<char*>(x.workspace) + scratch, x.workspace_bytes - scratch,
            x.stream);
    io.store(x);
  });
}

}  // namespace kiln::cuda
