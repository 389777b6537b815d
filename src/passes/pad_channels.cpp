// Pads channel chunks whose width breaks the GPU's vector alignment.
//
// Res2Net splits a 1x1 conv's output into chunks of `width` channels (26 for
// res2net50_26w_4s), runs a 3x3 conv on each and concatenates. In fp16 NHWC a
// 26-channel row is 52 bytes: cuDNN's tensor-core kernels need every pixel row
// (and a chunk's start) on a 16-byte boundary, so those convs fall back to slow
// kernels. This pass widens each chunk to the next multiple of `align`
// channels (26 -> 32) with zero weights and zero biases:
//   - the producing conv gets zero output rows for the padded channels, so
//     they hold act(0) = 0 (only activations with f(0) = 0 qualify);
//   - slices, adds, pools and concats carry the zeros along unchanged;
//   - every conv that reads a padded value gets zero input columns there.
// The function is unchanged: each real output sums the same products, plus
// products with zero. A component (everything reachable from the root conv
// before a conv with an aligned output) is padded only if every op in it is
// one of the above; otherwise it is left alone.
//
// Quantized (8-bit) convs pad the same way: their weights are codes, and a
// zero code is an exact zero at any scale, so the padded output channels get
// zero codes, weight scale 1 and bias 0 (acc 0 -> fma(0, alpha, 0) = 0 ->
// act(0) = 0 -> code 0), and padded input columns are zero codes; activation
// scales are per tensor, so a per-tensor `quantize` carries the zeros as code
// 0. Without this an 8-bit Res2Net keeps its 26-channel chunks: no aligned
// channel views, a pad kernel before every 8-bit conv reading one, and conv1's
// 104 outputs too narrow for the tiled FP8 GEMMs (multiples of 16).
//
// 8-bit residual chains (session 17). An 8-bit layer's codes are 1 byte, so
// its output rows need 16 channels (align_8bit) where a 16-bit value needs 8:
// EfficientNet's stage widths 24, 40 and 112 leave every project conv (and
// the expand conv reading its output) on a padded two-kernel path, and its
// residual blocks chain those values: x.0's project conv writes the stage's
// value, x.1's project conv adds it as its residual and writes the next. So
// a second kind of root: an 8-bit conv (no residual) whose output width is
// not a multiple of align_8bit; its component follows readers that take the
// value as x (zero input columns) or as their residual (whose output is then
// padded the same way: zero rows, 0 + 0 = 0 through the activation). Only
// 8-bit layers root it, so a 16-bit engine's graph is unchanged.
#include <algorithm>
#include <map>
#include <optional>
#include <set>

#include "ir/quant_form.hpp"
#include "passes/pass.hpp"

namespace kiln {

namespace {

// Channel layout of a padded value: `chunks` runs of `w` real channels, each
// stored in `wp` slots (channel c sits at (c / w) * wp + c % w).
struct ChunkMap {
  int64_t chunks = 0, w = 0, wp = 0;
  int64_t padded() const { return chunks * wp; }
  int64_t at(int64_t c) const { return (c / w) * wp + c % w; }
  bool same_chunking(const ChunkMap& o) const { return w == o.w && wp == o.wp; }
};

int64_t round_up(int64_t v, int64_t a) { return (v + a - 1) / a * a; }

bool zero_preserving(Activation a) {
  return a == Activation::None || a == Activation::Relu || a == Activation::Relu6 || a == Activation::Silu;
}

bool is_channel_op(const Graph& g, const Node& n) {
  return n.attr_int("axis", -1) == 1 && g.values[n.outputs[0]].shape.size() == 4;
}

// A quantize the padded zeros pass through as code 0: one scale for the tensor.
bool per_tensor_quantize(const Graph& g, const Node& n) {
  const auto& q = g.values[n.outputs[0]].quant;
  return n.op == Op::Quantize && q && q->axis < 0 && q->scales.size() == 1;
}

// A quantized conv's weight scales that padding can extend: one per output
// channel (axis 0) or one for the tensor.
bool paddable_weight_scales(const Graph& g, const Node& n) {
  if (!is_quantized_layer(g, n)) return true;
  const auto& q = g.values[n.inputs[1]].quant;
  return q && (q->axis == 0 || (q->axis < 0 && q->scales.size() == 1));
}

// A conv whose output channels may be padded: ungrouped, no residual input
// (the residual would need padding too), activation keeps 0 at 0, and (8-bit
// layers) weight scales per output channel or per tensor.
bool paddable_conv(const Graph& g, const Node& n) {
  return n.op == Op::Conv2d && n.attr_int("groups", 1) == 1 && n.inputs.size() <= 3 && zero_preserving(n.activation()) &&
         paddable_weight_scales(g, n);
}

struct Component {
  bool chunked = false;          // rooted at a conv read by chunk slices (Res2Net), not a residual chain
  std::map<int, ChunkMap> maps;  // value -> its padded layout
  std::set<int> convs_in;        // convs that read a padded value
  std::set<int> convs_out;       // convs whose output is padded
  std::set<int> slices;
};

// Follows every reader of the root's output; false if some reader cannot
// carry padded channels.
bool grow(const Graph& g, int root_node, const ChunkMap& root_map, Component& comp, int64_t align) {
  std::vector<int> work = {g.nodes[root_node].outputs[0]};
  comp.maps[work[0]] = root_map;
  comp.convs_out.insert(root_node);
  auto set_map = [&](int v, const ChunkMap& m) {
    auto it = comp.maps.find(v);
    if (it != comp.maps.end()) return it->second.chunks == m.chunks && it->second.same_chunking(m);
    comp.maps[v] = m;
    work.push_back(v);
    return true;
  };
  while (!work.empty()) {
    const int v = work.back();
    work.pop_back();
    const ChunkMap m = comp.maps.at(v);
    if (g.is_graph_output(v)) return false;
    for (int ni : g.consumers(v)) {
      const Node& n = g.nodes[ni];
      const int out = n.outputs[0];
      switch (n.op) {
        case Op::Slice: {
          if (!is_channel_op(g, n)) return false;
          const int64_t s = n.attr_int("start"), e = n.attr_int("end");
          if (s % m.w != 0 || e % m.w != 0 || e <= s) return false;
          comp.slices.insert(ni);
          if (!set_map(out, {(e - s) / m.w, m.w, m.wp})) return false;
          break;
        }
        case Op::Activation:
          if (!zero_preserving(n.activation())) return false;
          [[fallthrough]];
        case Op::AvgPool2d:
        case Op::MaxPool2d:
          if (!set_map(out, m)) return false;
          break;
        case Op::Quantize:
          if (!per_tensor_quantize(g, n) || !set_map(out, m)) return false;
          break;
        case Op::Add: {
          if (!zero_preserving(n.activation())) return false;
          for (int in : n.inputs) {
            auto it = comp.maps.find(in);
            // The other operand must be padded the same way (it is reached from
            // the same root, possibly later: grow() revisits via set_map).
            if (it == comp.maps.end()) {
              const int p = g.values[in].producer;
              if (p < 0) return false;
              continue;  // checked once every value is mapped (below)
            }
            if (!it->second.same_chunking(m) || it->second.chunks != m.chunks) return false;
          }
          if (!set_map(out, m)) return false;
          break;
        }
        case Op::Concat: {
          if (!is_channel_op(g, n)) return false;
          int64_t chunks = 0;
          for (int in : n.inputs) {
            const int64_t c = g.values[in].shape[1];
            if (c % m.w != 0) return false;
            chunks += c / m.w;
          }
          if (!set_map(out, {chunks, m.w, m.wp})) return false;
          break;
        }
        case Op::Conv2d: {
          if (n.attr_int("groups", 1) != 1 || !paddable_weight_scales(g, n)) return false;
          const int64_t k_out = g.values[out].shape[1];
          if (!comp.chunked && n.inputs.size() > 3 && n.inputs[3] == v) {
            // v is its residual (an 8-bit residual chain): its output takes v's padded layout.
            if (n.inputs[0] == v || k_out != m.chunks * m.w || !zero_preserving(n.activation())) return false;
            comp.convs_out.insert(ni);
            if (!set_map(out, m)) return false;
            break;
          }
          if (n.inputs[0] != v) return false;
          for (size_t k = 1; k < n.inputs.size(); ++k)
            if (n.inputs[k] == v) return false;
          comp.convs_in.insert(ni);
          if (comp.chunked && k_out % m.w == 0 && m.w % align != 0 && paddable_conv(g, n)) {
            // Another chunk-sized output (Res2Net's convs.i): pad it the same way.
            comp.convs_out.insert(ni);
            if (!set_map(out, {k_out / m.w, m.w, m.wp})) return false;
          }
          break;
        }
        default:
          return false;
      }
    }
  }
  // Every input of a padded add/concat must itself be padded.
  for (const auto& [v, m] : comp.maps) {
    (void)m;
    const int p = g.values[v].producer;
    if (p < 0 || g.nodes[p].op == Op::Conv2d || g.nodes[p].op == Op::Slice) continue;
    for (int in : g.nodes[p].inputs)
      if (!g.is_constant(in) && !comp.maps.count(in)) return false;
  }
  return true;
}

// New weight [K', C', r, s] and bias [K'] with the real values at their padded
// positions and zeros elsewhere. An 8-bit weight keeps its codes (to_f32 gives
// each code's value, which re-encodes to the same code) and its scales, per
// output channel moved with their channel, 1 for padded channels.
void repack_conv(Graph& g, int ni, const ChunkMap* in_map, const ChunkMap* out_map) {
  Node& n = g.nodes[ni];
  const Value& wv = g.values[n.inputs[1]];
  const Shape ws = wv.shape;
  const int64_t k = ws[0], c = ws[1], taps = ws[2] * ws[3];
  const int64_t kp = out_map ? out_map->padded() : k, cp = in_map ? in_map->padded() : c;
  const std::vector<float> w = wv.constant->to_f32();
  std::vector<float> nw(static_cast<size_t>(kp * cp * taps), 0.f);
  for (int64_t o = 0; o < k; ++o) {
    const int64_t po = out_map ? out_map->at(o) : o;
    for (int64_t i = 0; i < c; ++i) {
      const int64_t pi = in_map ? in_map->at(i) : i;
      std::copy_n(w.begin() + (o * c + i) * taps, taps, nw.begin() + (po * cp + pi) * taps);
    }
  }
  const DType wdt = wv.dtype;
  const std::string wname = wv.name;
  std::optional<QuantParams> wq = wv.quant;
  if (wq && wq->axis == 0 && out_map) {
    std::vector<float> scales(static_cast<size_t>(kp), 1.f);
    for (int64_t o = 0; o < k; ++o) scales[static_cast<size_t>(out_map->at(o))] = wq->scales[static_cast<size_t>(o)];
    wq->scales = std::move(scales);
  }
  std::vector<int> new_in = n.inputs;
  new_in[1] = g.add_constant(wname, HostTensor::from_f32_as(wdt, {kp, cp, ws[2], ws[3]}, nw));
  g.values[new_in[1]].quant = wq;
  g.set_node_inputs(ni, new_in);
  if (out_map && g.nodes[ni].inputs.size() > 2) {
    const Value& bv = g.values[g.nodes[ni].inputs[2]];
    const std::vector<float> b = bv.constant->to_f32();
    std::vector<float> nb(static_cast<size_t>(kp), 0.f);
    for (int64_t o = 0; o < k; ++o) nb[out_map->at(o)] = b[o];
    const DType bdt = bv.dtype;
    const std::string bname = bv.name;
    new_in[2] = g.add_constant(bname, HostTensor::from_f32_as(bdt, {kp}, nb));
    g.set_node_inputs(ni, new_in);
  }
}

// Pads a component grow() accepted: its slices' bounds, its convs' weights and
// biases; its values join `done`.
void apply_component(Graph& g, const Component& comp, std::set<int>& done) {
  for (int ni : comp.slices) {
    Node& s = g.nodes[ni];
    const ChunkMap& m = comp.maps.at(s.inputs[0]);
    s.attrs["start"] = s.attr_int("start") / m.w * m.wp;
    s.attrs["end"] = s.attr_int("end") / m.w * m.wp;
  }
  std::set<int> convs = comp.convs_in;
  convs.insert(comp.convs_out.begin(), comp.convs_out.end());
  for (int ni : convs) {
    const Node& n = g.nodes[ni];
    auto in = comp.maps.find(n.inputs[0]);
    const ChunkMap* in_map = in == comp.maps.end() ? nullptr : &in->second;
    const ChunkMap* out_map = comp.convs_out.count(ni) ? &comp.maps.at(n.outputs[0]) : nullptr;
    repack_conv(g, ni, in_map, out_map);
  }
  for (const auto& [pv, m] : comp.maps) {
    (void)m;
    done.insert(pv);
  }
  g.infer_shapes();
}

}  // namespace

int pad_channels(Graph& g, int64_t align, int64_t align_8bit) {
  if (align <= 1) return 0;
  int rewrites = 0;
  std::set<int> done;  // values already padded
  for (size_t ri = 0; ri < g.nodes.size(); ++ri) {
    const Node& r = g.nodes[ri];
    if (!paddable_conv(g, r) || done.count(r.outputs[0])) continue;
    // Root: a conv whose readers are all channel slices of one width w that is
    // not a multiple of `align`.
    const int v = r.outputs[0];
    const auto readers = g.consumers(v);
    if (readers.empty()) continue;
    int64_t w = -1;
    bool ok = true;
    for (int ni : readers) {
      const Node& s = g.nodes[ni];
      if (s.op != Op::Slice || !is_channel_op(g, s)) { ok = false; break; }
      const int64_t sw = s.attr_int("end") - s.attr_int("start");
      if (w < 0) w = sw;
      ok = ok && sw == w;
    }
    const int64_t c = g.values[v].shape.size() == 4 ? g.values[v].shape[1] : 0;
    if (!ok || w <= 0 || w % align == 0 || c % w != 0) continue;
    Component comp;
    comp.chunked = true;
    if (!grow(g, static_cast<int>(ri), {c / w, w, round_up(w, align)}, comp, align)) continue;
    apply_component(g, comp, done);
    ++rewrites;
  }
  // 8-bit residual chains: an 8-bit conv without a residual whose output width
  // is not a multiple of align_8bit (the chain's first block).
  if (align_8bit <= 1) return rewrites;
  for (size_t ri = 0; ri < g.nodes.size(); ++ri) {
    const Node& r = g.nodes[ri];
    if (!is_quantized_layer(g, r) || !paddable_conv(g, r) || done.count(r.outputs[0])) continue;
    const Shape& ys = g.values[r.outputs[0]].shape;
    if (ys.size() != 4 || ys[1] % align_8bit == 0 || g.consumers(r.outputs[0]).empty()) continue;
    Component comp;
    if (!grow(g, static_cast<int>(ri), {1, ys[1], round_up(ys[1], align_8bit)}, comp, align_8bit)) continue;
    apply_component(g, comp, done);
    ++rewrites;
  }
  return rewrites;
}

}  // namespace kiln
