// The CUDA lowering of the shape ops (kernels in shape_ops.cu): transpose,
// reshape, upsample_nearest, gather, and RowMajorIo, which gives kernels that
// compute on row-major data their operands in that order (lower.hpp).
//
// Layout: each op is lowered in terms of the stored layouts. A relayout is a
// permutation, so transpose is one strided copy from x's stored order to y's
// stored order whatever they are (NHWC for 4-D floats, row-major otherwise);
// reshape is a byte alias when both sides are row-major (planned in
// cuda_program.cpp), else one or two strided copies through row-major order.
#include <algorithm>
#include <numeric>

#include "backends/cuda/cuda_check.hpp"
#include "backends/cuda/lower.hpp"
#include "core/error.hpp"
#include "ir/attrs.hpp"

namespace kiln::cuda {

namespace {

// The storage stride of each logical axis of a value of shape s.
std::vector<int64_t> logical_strides(const Shape& s, bool nhwc) {
  std::vector<int64_t> st(s.size(), 1);
  if (nhwc) {  // [N, C, H, W] stored [N, H, W, C]
    st = {s[1] * s[2] * s[3], 1, s[3] * s[1], s[1]};
    return st;
  }
  for (size_t d = s.size(); d-- > 1;) st[d - 1] = st[d] * s[d];
  return st;
}

std::vector<int64_t> identity(size_t rank) {
  std::vector<int64_t> p(rank);
  std::iota(p.begin(), p.end(), int64_t{0});
  return p;
}

}  // namespace

StridedCopy permute_copy(const Shape& x, bool x_nhwc, const std::vector<int64_t>& perm, bool y_nhwc) {
  if (perm.size() != x.size() || x.empty() || x.size() > size_t(kMaxStridedRank))
    fail_runtime("cuda permute_copy: perm of ", perm.size(), " axes for ", shape_str(x));
  const std::vector<int64_t> xs = logical_strides(x, x_nhwc);
  // y's stored axes, as logical axes of y: NHWC stores axes 0, 2, 3, 1.
  const std::vector<int64_t> order = y_nhwc ? std::vector<int64_t>{0, 2, 3, 1} : identity(x.size());
  StridedCopy c;
  c.rank = static_cast<int>(x.size());
  for (size_t j = 0; j < order.size(); ++j) {
    const int64_t axis = perm[static_cast<size_t>(order[j])];  // y's logical axis order[j] is x's axis perm[order[j]]
    c.shape[j] = x[static_cast<size_t>(axis)];
    c.x_strides[j] = xs[static_cast<size_t>(axis)];
  }
  return c;
}

RowMajorIo::RowMajorIo(const Lowering& L, const std::vector<int>& ins, const std::vector<int>& outs) {
  auto make = [&](int v) {
    const Value& val = L.g.values[v];
    Io io{operand(L, v), val.shape, dtype_size(val.dtype), stored_nhwc(val), 0};
    if (io.nhwc) {
      io.off = scratch_;
      scratch_ = align256(scratch_ + value_bytes(val));
    }
    return io;
  };
  for (int v : ins) ins_.push_back(make(v));
  for (int v : outs) outs_.push_back(make(v));
}

void* RowMajorIo::at(const Exec& x, const Io& io) const {
  return io.nhwc ? static_cast<char*>(x.workspace) + io.off : io.where(x);
}

void RowMajorIo::load(const Exec& x) const {
  for (const Io& io : ins_)
    if (io.nhwc) strided_copy(io.where(x), at(x, io), io.elem_bytes, permute_copy(io.shape, true, identity(4), false), x.stream);
}

void RowMajorIo::store(const Exec& x) const {
  for (const Io& io : outs_)
    if (io.nhwc) strided_copy(at(x, io), io.where(x), io.elem_bytes, permute_copy(io.shape, false, identity(4), true), x.stream);
}

std::string RowMajorIo::kernel(const std::string& name) const {
  int n = 0;
  for (const auto* side : {&ins_, &outs_})
    for (const Io& io : *side) n += io.nhwc;
  return n ? cat(name, " +", n, " nhwc relayout", n > 1 ? "s" : "") : name;
}

void plan_token_rows(const Graph& g, GraphFacts& f) {
  // The one reader of v, when it is op `op` and v is no graph output (else -1).
  auto only_reader = [&](int v, Op op) {
    const auto readers = g.consumers(v);
    return readers.size() == 1 && g.nodes[readers[0]].op == op && !g.is_graph_output(v) ? static_cast<int>(readers[0]) : -1;
  };
  auto swaps_last_two = [&](const Node& t) { return t.attr_ints("perm") == std::vector<int64_t>{0, 2, 1}; };
  auto flat = [](const Shape& m) { return Shape{m[0], m[1], m[2] * m[3]}; };  // [N, C, H*W] of a map
  auto plain = [&](int v) { return !g.values[v].constant && !f.viewed(v); };
  for (size_t ni = 0; ni < g.nodes.size(); ++ni) {
    const Node& n = g.nodes[ni];
    if (n.op != Op::Reshape || f.fused_away[ni]) continue;
    const int x = n.inputs[0], r = n.outputs[0];
    const Value &xv = g.values[x], &rv = g.values[r];
    if (!plain(x)) continue;
    if (stored_nhwc(xv) && rv.shape == flat(xv.shape)) {  // map -> tokens: reshape, then transpose
      const int ti = only_reader(r, Op::Transpose);
      if (ti < 0 || !swaps_last_two(g.nodes[ti])) continue;
      f.fused_away[ni] = 1, f.fused_away[static_cast<size_t>(ti)] = 1;
      f.alias[r] = x;  // never read: no bytes of its own
      f.alias[g.nodes[ti].outputs[0]] = x;
    } else if (stored_nhwc(rv) && n.op == Op::Reshape && xv.producer >= 0) {  // tokens -> map: transpose, then reshape
      const Node& t = g.nodes[xv.producer];
      const int tokens = t.inputs[0];
      if (t.op != Op::Transpose || !swaps_last_two(t) || xv.shape != flat(rv.shape) || only_reader(x, Op::Reshape) < 0 ||
          stored_nhwc(g.values[tokens]) || !plain(tokens))
        continue;
      f.fused_away[ni] = 1, f.fused_away[static_cast<size_t>(xv.producer)] = 1;
      f.alias[x] = tokens;
      f.alias[r] = tokens;
    }
  }
}

namespace {

// The value a reshape output v aliases (the reshape's input), or -1.
int reshape_alias_source(const Graph& g, const GraphFacts& f, int v) {
  const int p = g.values[v].producer;
  if (p < 0 || g.nodes[p].op != Op::Reshape || f.alias[v] != g.nodes[p].inputs[0]) return -1;
  return g.nodes[p].inputs[0];
}

}  // namespace

void plan_row_windows(const Graph& g, GraphFacts& f) {
  for (size_t ni = 0; ni < g.nodes.size(); ++ni) {
    const Node& n = g.nodes[ni];
    if (n.op != Op::Slice || f.fused_away[ni]) continue;
    const int x = n.inputs[0], y = n.outputs[0];
    const Value &xv = g.values[x], &yv = g.values[y];
    const int64_t axis = axis_attr(n, xv.shape.size(), 1);
    if (stored_nhwc(xv) || xv.constant || axis + 1 != static_cast<int64_t>(xv.shape.size()) || g.is_graph_output(y) ||
        code_out(g, y).on() || xv.dtype != yv.dtype || f.alias[y] >= 0)
      continue;
    // Every reader reads windows: attention directly, ms_deform_attn's value
    // (0), offsets (2) and logits (3) through a reshape aliasing y.
    int last = -1;
    bool ok = !g.consumers(y).empty();
    for (int c : g.consumers(y)) {
      const Node& r = g.nodes[c];
      if (r.op == Op::Attention) {
        last = std::max(last, c);
        continue;
      }
      const int ro = r.outputs[0];
      ok = ok && r.op == Op::Reshape && reshape_alias_source(g, f, ro) == y && !g.is_graph_output(ro) && !g.consumers(ro).empty();
      for (int d : ok ? g.consumers(ro) : std::vector<int>{}) {
        const Node& dn = g.nodes[d];
        ok = ok && dn.op == Op::MsDeformAttn && dn.inputs[1] != ro;  // value, offsets or logits; not ref
        last = std::max(last, d);
      }
      if (!ok) break;
    }
    if (!ok || last < 0) continue;
    f.fused_away[ni] = 1;
    f.windows[y] = RowWindow{x, n.attr_int("start"), xv.shape.back(), ni};
    f.alias[y] = x;  // no bytes of its own (never written): x lives as long as y's readers
    f.live_through(x, last);
  }
}

const RowWindow* row_window(const Lowering& L, int v) {
  if (const int src = reshape_alias_source(L.g, L.f, v); src >= 0) v = src;
  const auto it = L.f.windows.find(v);
  return it == L.f.windows.end() ? nullptr : &it->second;
}

WindowRead window_read(Lowering& L, const Node& reader, size_t k) {
  const RowWindow* rw = row_window(L, reader.inputs[k]);
  if (!rw) return {};
  L.record(L.g.nodes[rw->slice].name, cat("read in place by ", reader.name, " (a window of each row, no copy)"));
  const size_t elem = dtype_size(L.g.values[rw->src].dtype);
  return {true, operand(L, rw->src), static_cast<size_t>(rw->offset) * elem, rw->ld};
}

void lower_Transpose(Lowering& L, size_t ni) {
  const Node& n = L.g.nodes[ni];
  const Value &xv = L.g.values[n.inputs[0]], &yv = L.g.values[n.outputs[0]];
  const StridedCopy c = permute_copy(xv.shape, stored_nhwc(xv), n.attr_ints("perm"), stored_nhwc(yv));
  const Operand x_at = operand(L, n.inputs[0]), y_at = operand(L, n.outputs[0]);
  const size_t es = dtype_size(yv.dtype);
  L.step("strided_copy", [=](const Exec& x) { strided_copy(x_at(x), y_at(x), es, c, x.stream); });
}

// Row-major on both sides: an alias, no step (cuda_program.cpp plans it,
// reshape_is_alias). Otherwise through row-major order: an NHWC x is
// transposed into y (row-major) or into the workspace (y NHWC too), and an
// NHWC y is written from those row-major bytes.
void lower_Reshape(Lowering& L, size_t ni) {
  const Node& n = L.g.nodes[ni];
  if (reshape_is_alias(L.g, n)) return;
  const Value &xv = L.g.values[n.inputs[0]], &yv = L.g.values[n.outputs[0]];
  const bool x_nhwc = stored_nhwc(xv), y_nhwc = stored_nhwc(yv);
  const Operand x_at = operand(L, n.inputs[0]), y_at = operand(L, n.outputs[0]);
  const size_t es = dtype_size(yv.dtype), bytes = value_bytes(yv);
  // x's NHWC bytes to row-major, and row-major bytes of y's shape to y's NHWC (where they apply).
  const StridedCopy from_x = x_nhwc ? permute_copy(xv.shape, true, identity(4), false) : StridedCopy{};
  const StridedCopy to_y = y_nhwc ? permute_copy(yv.shape, false, identity(4), true) : StridedCopy{};
  if (!x_nhwc && !y_nhwc) {  // a constant input: copied
    L.step("copy", [=](const Exec& x) {
      KILN_CUDA_CHECK(cudaMemcpyAsync(y_at(x), x_at(x), bytes, cudaMemcpyDeviceToDevice, x.stream));
    });
    return;
  }
  if (x_nhwc && y_nhwc) L.reserve_workspace(bytes);
  L.step(x_nhwc && y_nhwc ? "strided_copy x2" : "strided_copy", [=](const Exec& x) {
    if (!x_nhwc) return strided_copy(x_at(x), y_at(x), es, to_y, x.stream);
    if (!y_nhwc) return strided_copy(x_at(x), y_at(x), es, from_x, x.stream);
    strided_copy(x_at(x), x.workspace, es, from_x, x.stream);
    strided_copy(x.workspace, y_at(x), es, to_y, x.stream);
  });
}

// NHWC y[n, i, j, c] = x[n, i / sh, j / sw, c]: y seen as [N, H, sh, W, sw, C]
// reads x with strides [HWC, WC, 0, C, 0, 1] (one strided copy).
void lower_UpsampleNearest(Lowering& L, size_t ni) {
  const Node& n = L.g.nodes[ni];
  const Value &xv = L.g.values[n.inputs[0]], &yv = L.g.values[n.outputs[0]];
  if (!stored_nhwc(xv) || !stored_nhwc(yv))
    fail_input(n.name, ": CUDA upsample_nearest takes a 4-D float map stored NHWC, not a constant or ", dtype_name(xv.dtype));
  const UpsampleAttrs a = upsample_attrs(n);
  const Shape& s = xv.shape;  // N, C, H, W
  StridedCopy c;
  c.rank = 6;
  const int64_t shape[6] = {s[0], s[2], a.sh, s[3], a.sw, s[1]};
  const int64_t strides[6] = {s[2] * s[3] * s[1], s[3] * s[1], 0, s[1], 0, 1};
  for (int d = 0; d < 6; ++d) c.shape[d] = shape[d], c.x_strides[d] = strides[d];
  const Operand x_at = operand(L, n.inputs[0]), y_at = operand(L, n.outputs[0]);
  const size_t es = dtype_size(yv.dtype);
  L.step("strided_copy", [=](const Exec& x) { strided_copy(x_at(x), y_at(x), es, c, x.stream); });
}

// Index check: an index outside [0, extent) (or a float engine input that is
// not an integer, cast to the type's minimum) sets the step's flag; the
// context fails the run naming the node (cuda_context.cpp).
void lower_Gather(Lowering& L, size_t ni) {
  const Node& n = L.g.nodes[ni];
  const GatherDims d = gather_dims(L.g, n);
  const DType index_dt = L.g.values[n.inputs[1]].dtype;
  if (index_dt != DType::I64 && index_dt != DType::I32)
    fail_input(n.name, ": CUDA gather takes an i64 or i32 index, not ", dtype_name(index_dt));
  const RowMajorIo io(L, {n.inputs[0], n.inputs[1]}, {n.outputs[0]});
  L.reserve_workspace(io.scratch_bytes());
  const int check = L.add_check(cat(n.name, ": gather index out of [0, ", d.extent, ")"));
  const size_t es = dtype_size(L.g.values[n.outputs[0]].dtype);
  L.step(io.kernel("gather_rows"), [=](const Exec& x) {
    int64_t* flag = x.checks + 3 * check;
    io.load(x);
    gather_rows(io.in(x, 0), io.in(x, 1), index_dt, io.out(x, 0), es, d.outer, d.extent, d.inner, d.k, d.shared_x(),
                flag, x.stream);
    io.store(x);
  });
}

}  // namespace kiln::cuda
