// The CUDA lowering of the layout ops (kernels in layout.cu): engine inputs
// (NCHW f32 -> NHWC), Flatten, Concat and Slice with channel views and
// split runs.
#include <cstdint>

#include "backends/cuda/lower.hpp"
#include "ir/attrs.hpp"
#include "core/error.hpp"
#include "ir/fusion_marks.hpp"

namespace kiln::cuda {

namespace {

// Consecutive slices of one input as one launch: worth it where the copies
// are small and launch-bound. Measured on the H200 (res2net50_26w_4s fp16):
// batch 1 0.736 ms with one launch vs 0.801 ms with a copy per slice; batch
// 32 2.43 vs 2.17 ms the other way round (split_channels_nhwc moves one
// element per thread, copy_channels_nhwc 16-byte vectors). So: one launch
// when the run moves at most kSplitFuseBytes (all of batch 1's Res2Net
// splits, none of batch 32's); switch fuse_split off: never (no runs
// marked), on: always.
constexpr size_t kSplitFuseBytes = size_t(1) << 20;

}  // namespace

void plan_upsample_concats(const Graph& g, GraphFacts& f) {
  for (size_t ni = 0; ni < g.nodes.size(); ++ni) {
    const Node& n = g.nodes[ni];
    if (n.op != Op::Concat || f.fused_away[ni]) continue;
    const int out = n.outputs[0];
    const Value& ov = g.values[out];
    if (!stored_nhwc(ov) || ov.shape.size() != 4 || n.attr_int("axis") != 1 || code_out(g, out).on() || f.viewed(out) ||
        n.inputs.size() > size_t(kMaxConcatInputs))
      continue;
    bool plain = true;
    for (size_t k = 0; k < n.inputs.size(); ++k) plain &= !f.viewed(n.inputs[k]) && !f.wp.copied_inputs.count({ni, k});
    if (!plain) continue;
    for (size_t k = 0; k < n.inputs.size(); ++k) {
      const int in = n.inputs[k];
      const Value& iv = g.values[in];
      if (iv.producer < 0) continue;
      const auto ui = static_cast<size_t>(iv.producer);
      const Node& u = g.nodes[ui];
      if (u.op != Op::UpsampleNearest || f.fused_away[ui] || g.consumers(in).size() != 1 || g.is_graph_output(in)) continue;
      const int src = u.inputs[0];
      const Value& sv = g.values[src];
      const UpsampleAttrs a = upsample_attrs(u);
      if (!stored_nhwc(sv) || sv.dtype != iv.dtype || f.viewed(src) || a.sh < 1 || a.sw < 1 || sv.shape[2] * a.sh != iv.shape[2] ||
          sv.shape[3] * a.sw != iv.shape[3])
        continue;
      f.fused_away[ui] = 1;
      f.upsample_reads[{ni, k}] = UpsampleRead{src, static_cast<int>(a.sh), static_cast<int>(a.sw), ui};
      f.alias[in] = src;  // never written: no bytes of its own
      f.live_through(src, static_cast<int>(ni));
    }
  }
}

void plan_concat_masks(const Graph& g, GraphFacts& f, const std::set<std::string>* recorded) {
  for (size_t ni = 0; ni < g.nodes.size(); ++ni) {
    const Node& n = g.nodes[ni];
    if (n.op != Op::Concat || f.fused_away[ni] || n.inputs.size() > size_t(kMaxConcatInputs)) continue;
    const int out = n.outputs[0];
    const Value& ov = g.values[out];
    const DType dt = ov.dtype;
    if (stored_nhwc(ov) || ov.shape.size() != 3 || axis_attr(n, 3, 1) != 1 || code_out(g, out).on() || f.viewed(out) ||
        (dt != DType::F16 && dt != DType::BF16 && dt != DType::F32))
      continue;
    bool plain = true;
    for (int in : n.inputs) plain &= g.values[in].dtype == dt && !f.viewed(in);
    if (!plain) continue;
    for (int r : g.consumers(out)) {
      const auto mi = static_cast<size_t>(r);
      const Node& m = g.nodes[mi];
      if (m.op != Op::Mul || f.fused_away[mi] || m.inputs[0] != out || m.activation() != Activation::None ||
          (recorded && !recorded->count(m.name)))
        continue;
      const Value& c = g.values[m.inputs[1]];
      const Value& mv = g.values[m.outputs[0]];
      if (!c.constant || c.dtype != dt || c.shape != Shape{1, ov.shape[1], 1} || mv.dtype != dt || mv.shape != ov.shape ||
          code_out(g, m.outputs[0]).on())
        continue;
      write_early(g, f, mi, ni);
      f.concat_masks[ni] = mi;
      break;
    }
  }
}

void lower_engine_inputs(Lowering& L) {
  const Graph& g = L.g;
  const ValuePtr ptr = L.ptr;
  for (size_t k = 0; k < g.inputs.size(); ++k) {
    const int v = g.inputs[k];
    const Shape s = g.values[v].shape;
    // When the only reader is a cast (f16/bf16 engines), it is folded into this copy.
    int target = v;
    auto readers = g.consumers(v);
    // Not a cast a plan fused away (its reader reads the input itself: box_refine, wide linears).
    if (readers.size() == 1 && g.nodes[readers[0]].op == Op::Cast && !L.f.fused_away[readers[0]]) {
      L.f.folded_cast[readers[0]] = 1;
      target = g.nodes[readers[0]].outputs[0];
    }
    const DType dt = g.values[target].dtype;
    if (!stored_nhwc(g.values[v])) {  // row-major already: only the storage type changes
      const int64_t count = shape_numel(s);
      L.node_name = g.values[v].name + ".to_storage";
      L.step("cast", [k, target, dt, count, ptr](const Exec& x) {
        cast(x.staging_in[k], DType::F32, ptr(x, target), dt, count, x.stream);
      });
      continue;
    }
    L.node_name = g.values[v].name + ".to_nhwc";
    L.step("nchw_f32_to_nhwc", [k, target, dt, s, ptr](const Exec& x) {
      nchw_f32_to_nhwc(x.staging_in[k], ptr(x, target), dt, as_int(s[0]), as_int(s[1]), as_int(s[2]), as_int(s[3]), x.stream);
    });
  }
}

// A byte alias where the NHWC bytes are already in logical order (planned
// with the facts); otherwise the NHWC -> NCHW transpose (lower.hpp).
void lower_Flatten(Lowering& L, size_t ni) {
  const Node& n = L.g.nodes[ni];
  if (flatten_is_alias(L.g, n)) return;
  const int in0 = n.inputs[0], out = n.outputs[0];
  const Shape s = L.g.values[in0].shape;
  const DType dt = L.g.values[out].dtype;
  const ValuePtr ptr = L.ptr;
  L.step("nhwc_to_nchw", [=](const Exec& x) {
    nhwc_to_nchw(ptr(x, in0), ptr(x, out), dt, as_int(s[0]), as_int(s[1]), as_int(s[2]), as_int(s[3]), x.stream);
  });
}

void lower_Concat(Lowering& L, size_t ni) {
  const Graph& g = L.g;
  const Node& n = g.nodes[ni];
  const int out = n.outputs[0];
  const Value& ov = g.values[out];
  const DType dt = ov.dtype;
  if (!stored_nhwc(ov)) {  // row-major values (RT-DETR's token rows): along any axis, one launch
    if (n.inputs.size() > size_t(kMaxConcatInputs))
      fail_input(n.name, ": CUDA concat of row-major values takes up to ", kMaxConcatInputs, " inputs, not ", n.inputs.size());
    const int64_t rows = split_at(ov.shape, axis_attr(n, ov.shape.size(), 1)).outer;
    std::vector<Operand> ins;
    std::vector<int64_t> chunks;
    for (int in : n.inputs) {
      ins.push_back(operand(L, in));
      chunks.push_back(rows ? shape_numel(g.values[in].shape) / rows * static_cast<int64_t>(dtype_size(dt)) : 0);
    }
    const ValuePtr ptr = L.ptr;
    if (const auto masked = L.f.concat_masks.find(ni); masked != L.f.concat_masks.end()) {
      // plan_concat_masks: the mul by the per-token constant, written by this launch too.
      const Node& m = g.nodes[masked->second];
      const int y2 = m.outputs[0];
      const int64_t c = ov.shape[2];
      std::vector<int64_t> elems;
      for (int64_t bytes : chunks) elems.push_back(bytes / static_cast<int64_t>(dtype_size(dt)));
      const HostTensor mask = HostTensor::from_f32_as(dt, {ov.shape[1]}, g.values[m.inputs[1]].constant->to_f32());
      const void* mk = L.engine_copy(m.name + "#mask", mask.blob.data, mask.nbytes());
      L.record(m.name, cat("inside ", n.name, " (its second output, no launch of its own)"));
      L.step("concat_rows_masked", [=](const Exec& x) {
        std::vector<const void*> srcs;
        for (const Operand& in : ins) srcs.push_back(in(x));
        concat_rows_masked(srcs, elems, ptr(x, out), ptr(x, y2), mk, rows, c, dt, x.stream);
      });
      return;
    }
    if (const CodeOut code = code_out(g, out); code.on()) {
      // Codes from wide inputs (RT-DETR's memory read by 8-bit linears): each
      // row of y is [rows, sum of chunks] as a channel concat's pixel is, so
      // the channel kernel writes it with each input's chunk as its channels.
      const DType xdt = g.values[n.inputs[0]].dtype;
      std::vector<int> cs;
      for (int in : n.inputs) {
        if (g.values[in].dtype != xdt) fail_input(n.name, ": CUDA concat writing codes reads inputs of one type");
        const int64_t c = rows ? shape_numel(g.values[in].shape) / rows : 0;
        if (c > INT32_MAX) fail_input(n.name, ": CUDA concat writing codes: ", c, " elements per row is too many");
        cs.push_back(static_cast<int>(c));
      }
      L.step("concat_to_codes_rows", [=](const Exec& x) {
        std::vector<const void*> srcs;
        for (const Operand& in : ins) srcs.push_back(in(x));
        concat_to_codes_nhwc(srcs, cs, cs, xdt, ptr(x, out), rows, code, x.stream);
      });
      return;
    }
    L.step("concat_rows", [=](const Exec& x) {
      std::vector<const void*> srcs;
      for (const Operand& in : ins) srcs.push_back(in(x));
      concat_rows(srcs, chunks, ptr(x, out), rows, x.stream);
    });
    return;
  }
  if (n.attr_int("axis") != 1 || ov.shape.size() != 4) fail_input(n.name, ": CUDA concat supports the channel axis of 4-D tensors");
  const int64_t rows = ov.shape[0] * ov.shape[2] * ov.shape[3];
  std::vector<int> ins = n.inputs, cs;
  for (int in : ins) cs.push_back(as_int(g.values[in].shape[1]));
  const ValuePtr ptr = L.ptr;
  if (const CodeOut code = code_out(g, out); code.on()) {
    // Writes codes from wide inputs (no input is in place: they differ in type), each at its pixel stride.
    if (L.strided(out)) fail_input(n.name, ": a concat writing codes into a channel view");
    std::vector<int> strides;
    for (size_t k = 0; k < ins.size(); ++k) strides.push_back(L.strided(ins[k]) ? L.pixel_stride(ins[k]) : cs[k]);
    const DType xdt = g.values[ins[0]].dtype;
    L.step("concat_to_codes_nhwc", [=](const Exec& x) {
      std::vector<const void*> srcs;
      for (int in : ins) srcs.push_back(ptr(x, in));
      concat_to_codes_nhwc(srcs, strides, cs, xdt, ptr(x, out), rows, code, x.stream);
    });
    return;
  }
  // A concat of a view block on cuDNN convs (its views cleared) copies all
  // its inputs: one launch, as without views.
  bool views_here = L.strided(out);
  for (size_t k = 0; k < ins.size(); ++k) views_here |= L.strided(ins[k]) || L.f.wp.copied_inputs.count({ni, k});
  if (views_here) {
    // Inputs written in place by their producers are already there; copy the others.
    const int yc = L.strided(out) ? L.pixel_stride(out) : as_int(ov.shape[1]);
    int begin = 0;
    for (size_t k = 0; k < ins.size(); ++k) {
      const int in = ins[k], ck = cs[k], xc = L.strided(in) ? L.pixel_stride(in) : ck, at = begin;
      begin += ck;
      if (L.f.cv.parent[in] == out || L.f.wp.copied_inputs.count({ni, k})) continue;  // in place, or copied by a window conv
      L.step("copy_channels_nhwc", [=](const Exec& x) {
        copy_channels_nhwc(ptr(x, in), xc, 0, ptr(x, out), yc, at, ck, rows, dt, x.stream);
      });
    }
    return;
  }
  // Inputs read through their upsample (plan_upsample_concats).
  ConcatUpsample up{as_int(ov.shape[2]), as_int(ov.shape[3]), std::vector<std::pair<int, int>>(ins.size(), {0, 0})};
  bool upsampled = false;
  for (size_t k = 0; k < ins.size(); ++k) {
    const auto it = L.f.upsample_reads.find({ni, k});
    if (it == L.f.upsample_reads.end()) continue;
    upsampled = true;
    ins[k] = it->second.src;
    up.factors[k] = {it->second.sh, it->second.sw};
    L.record(g.nodes[it->second.upsample].name, cat("inside ", n.name, " (read at ", it->second.sh, "x", it->second.sw,
                                                    " nearest by the concat, no launch of its own)"));
  }
  L.step(upsampled ? "concat_channels_nhwc +upsample" : "concat_channels_nhwc", [=](const Exec& x) {
    std::vector<const void*> srcs;
    for (int in : ins) srcs.push_back(ptr(x, in));
    concat_channels_nhwc(srcs, cs, ptr(x, out), rows, dt, x.stream, upsampled ? &up : nullptr);
  });
}

void lower_Slice(Lowering& L, size_t ni) {
  const Graph& g = L.g;
  const Node& n = g.nodes[ni];
  const int in0 = n.inputs[0], out = n.outputs[0];
  const Shape xs = g.values[in0].shape;
  const DType dt = g.values[out].dtype;
  if (!stored_nhwc(g.values[in0])) {  // row-major (RT-DETR's token rows): any axis, each row's window copied
    if (g.is_constant(in0)) fail_input(n.name, ": CUDA slice of a constant is not supported (constants are not activations)");
    if (code_out(g, out).on()) fail_input(n.name, ": CUDA slice writes codes only as a channel slice of 4-D maps");
    const AxisSplit a = split_at(xs, axis_attr(n, xs.size(), 1));
    const int64_t rows = a.outer, xc = a.extent * a.inner, begin = n.attr_int("start") * a.inner,
                  c = (n.attr_int("end") - n.attr_int("start")) * a.inner;
    if (xc > int64_t(0x7fffffff)) fail_input(n.name, ": CUDA slice rows of ", xc, " elements (at most 2^31 - 1)");
    const ValuePtr ptr = L.ptr;
    L.step("copy_rows", [=](const Exec& x) {
      copy_channels_nhwc(ptr(x, in0), as_int(xc), as_int(begin), ptr(x, out), as_int(c), 0, as_int(c), rows, dt, x.stream);
    });
    return;
  }
  if (n.attr_int("axis") != 1 || xs.size() != 4) fail_input(n.name, ": CUDA slice supports the channel axis of 4-D tensors");
  // A window of its input, or copied by the first slice of its run. A slice
  // whose output is written in place into a concat (a view of the concat, not
  // of its input) copies into that window.
  const bool window_of_input = L.strided(out) && L.f.cv.parent[out] == in0;
  if (window_of_input || L.f.split_done[ni]) return;
  if (g.is_constant(in0)) fail_input(n.name, ": CUDA slice of a constant is not supported (constants are not activations)");
  const int yc = L.strided(out) ? L.pixel_stride(out) : as_int(g.values[out].shape[1]);
  const int xc = L.strided(in0) ? L.pixel_stride(in0) : as_int(xs[1]), start = as_int(n.attr_int("start"));
  const int c = as_int(g.values[out].shape[1]);
  const int64_t rows = g.values[out].shape[0] * g.values[out].shape[2] * g.values[out].shape[3];
  const ValuePtr ptr = L.ptr;
  const DType xdt = g.values[in0].dtype;  // the output's, unless the slice writes codes
  // A split run the graph marks (fuse_split_runs; Res2Net's chunks) is one
  // launch, up to the first slice that is a view and kMaxSplitOutputs.
  // Safe for the memory plan: the nodes in between are those slices, which read only
  // the input, and the input stays alive through the last of them.
  std::vector<size_t> run = {ni};
  // Dense (--reference) or an in-place output: one slice each.
  for (size_t nj : L.f.dense || L.strided(out) ? std::vector<size_t>{} : split_run_at(g, ni)) {
    if (nj == ni) continue;
    if (L.strided(g.nodes[nj].outputs[0]) || run.size() >= size_t(kMaxSplitOutputs)) break;
    run.push_back(nj);
  }
  size_t run_bytes = 0;
  for (size_t nj : run) run_bytes += value_bytes(g.values[g.nodes[nj].outputs[0]]);
  if (run.size() > 1 && (L.f.split_always || run_bytes <= kSplitFuseBytes)) {
    std::vector<int> outs, begins, cs;
    std::vector<CodeOut> codes;  // slices that write codes convert in the same launch
    for (size_t nj : run) {
      const Node& m = g.nodes[nj];
      outs.push_back(m.outputs[0]);
      begins.push_back(as_int(m.attr_int("start")));
      cs.push_back(as_int(g.values[m.outputs[0]].shape[1]));
      codes.push_back(code_out(g, m.outputs[0]));
      L.f.split_done[nj] = 1;
    }
    L.step(cat("split_channels_nhwc x", run.size()), [=](const Exec& x) {
      std::vector<void*> ys;
      for (int o : outs) ys.push_back(ptr(x, o));
      split_channels_nhwc(ptr(x, in0), xc, ys, begins, cs, rows, xdt, x.stream, codes);
    });
    return;
  }
  if (const CodeOut code = code_out(g, out); code.on()) {
    // One slice writing codes: the converting concat of one input, read at its channel offset.
    const size_t offset = size_t(start) * dtype_size(xdt);
    L.step("concat_to_codes_nhwc", [=](const Exec& x) {
      const void* from = static_cast<const char*>(ptr(x, in0)) + offset;
      concat_to_codes_nhwc({from}, {xc}, {c}, xdt, ptr(x, out), rows, code, x.stream);
    });
    return;
  }
  L.step("copy_channels_nhwc", [=](const Exec& x) { copy_channels_nhwc(ptr(x, in0), xc, start, ptr(x, out), yc, 0, c, rows, dt, x.stream); });
}

}  // namespace kiln::cuda
