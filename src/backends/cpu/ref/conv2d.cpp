// conv2d, the definition spelled out: for every output element, the sum over
// the input channels of its group and the kernel taps that land inside the
// input (padding reads zero), in double; then + bias + residual, then the
// activation: y = act(conv(x) + bias + residual).
#include "backends/cpu/ref/ref.hpp"
#include "core/error.hpp"
#include "ir/attrs.hpp"
#include "ir/quant_form.hpp"
#include "quant/layer.hpp"

namespace kiln::ref {

Buffer conv2d(const OpArgs& a) {
  const Shape& xs = a.in_shape(0);
  const Shape& ws = a.in_shape(1);
  const Shape& ys = a.out_shape();
  const ConvAttrs at = conv_attrs(a.n);
  const int64_t batch = xs[0], c_in = xs[1], h = xs[2], w = xs[3];
  const int64_t c_out = ws[0], c_per_group = ws[1], kh = ws[2], kw = ws[3];
  const int64_t oh = ys[2], ow = ys[3];
  if (c_per_group * at.groups != c_in) fail_runtime(a.n.name, ": reference conv2d: weight does not fit groups");
  const int64_t out_per_group = c_out / at.groups;
  const Buffer& x = a.in[0];
  const Buffer& wt = a.in[1];
  const Buffer* bias = a.has_input(2) ? &a.in[2] : nullptr;
  const Buffer* residual = a.has_input(3) ? &a.in[3] : nullptr;
  const Activation act = a.n.activation();
  // A quantized layer (8-bit x and weight, buffers holding code values): the
  // double sum below is exact (quant/layer.hpp), the epilogue is the layer's.
  const bool quantized = is_quantized_layer(a.g, a.n);
  const quant::LayerEpilogue ep = quantized ? quant::layer_epilogue(a.g, a.n, bias ? bias->data() : nullptr) : quant::LayerEpilogue{};

  Buffer y(static_cast<size_t>(batch * c_out * oh * ow));
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t oc = 0; oc < c_out; ++oc) {
      const int64_t group = oc / out_per_group;
      for (int64_t oy = 0; oy < oh; ++oy)
        for (int64_t ox = 0; ox < ow; ++ox) {
          double sum = 0;
          for (int64_t ic = 0; ic < c_per_group; ++ic) {
            const int64_t c = group * c_per_group + ic;
            for (int64_t i = 0; i < kh; ++i)
              for (int64_t j = 0; j < kw; ++j) {
                const int64_t iy = oy * at.stride_h - at.pad_t + i * at.dil_h;
                const int64_t ix = ox * at.stride_w - at.pad_l + j * at.dil_w;
                if (iy < 0 || iy >= h || ix < 0 || ix >= w) continue;  // zero padding
                sum += double(x[((b * c_in + c) * h + iy) * w + ix]) * double(wt[((oc * c_per_group + ic) * kh + i) * kw + j]);
              }
          }
          const int64_t at_y = ((b * c_out + oc) * oh + oy) * ow + ox;
          if (quantized) {
            y[at_y] = ep.apply(oc, sum, residual ? &(*residual)[at_y] : nullptr);
            continue;
          }
          if (bias) sum += (*bias)[oc];
          if (residual) sum += (*residual)[at_y];
          y[at_y] = static_cast<float>(activate(act, sum));
        }
    }
  return y;
}

}  // namespace kiln::ref
