// ms_deform_attn: RT-DETR v2's multi-scale deformable attention core, as
// transformers' multi_scale_deformable_attention_v2 computes it, in plain
// loops. For each image n, query q and head h: the P attention logits are
// softmaxed; point p of level l sits at
//   loc = ref.xy + off[p] * (1 / points_l) * ref.wh * offset_scale
// (computed in f32 in torch's order: in discrete mode the rounding decides
// the pixel), and the head's output is the weighted sum of the value samples.
//   default:  grid_sample(bilinear, zeros, align_corners=False) at pixel
//             loc * (w, h) - 0.5; a corner outside the map contributes 0.
//   discrete: pixel (int64)(loc * (w, h) + 0.5) (truncation toward zero),
//             clamped to the map.
#include <cmath>

#include "backends/cpu/ref/ref.hpp"
#include "ir/attrs.hpp"

namespace kiln::ref {

namespace {

// torch's .to(int64) of loc * extent + 0.5 (truncation), clamped to [0, extent).
int64_t discrete_index(float loc, int64_t extent) {
  const float f = loc * static_cast<float>(extent) + 0.5f;
  if (!(f >= 1.f)) return 0;  // trunc of (-1, 1) is 0; below clamps to 0; NaN as torch's clamp of INT64_MIN
  const double t = std::trunc(static_cast<double>(f));
  return t >= static_cast<double>(extent - 1) ? extent - 1 : static_cast<int64_t>(t);
}

}  // namespace

Buffer ms_deform_attn(const OpArgs& a) {
  const DeformAttnDims dm = deform_attn_dims(a.g, a.n);
  const Buffer &value = a.in[0], &ref = a.in[1], &off = a.in[2], &logit = a.in[3];
  const float os = static_cast<float>(dm.offset_scale);
  auto v_at = [&](int64_t n, int64_t s, int64_t h, int64_t d) {
    return static_cast<double>(value[((n * dm.s + s) * dm.heads + h) * dm.d + d]);
  };
  Buffer y(static_cast<size_t>(dm.n * dm.q * dm.heads * dm.d), 0.f);
  for (int64_t n = 0; n < dm.n; ++n)
    for (int64_t q = 0; q < dm.q; ++q) {
      const float* box = &ref[(n * dm.q + q) * 4];
      for (int64_t h = 0; h < dm.heads; ++h) {
        const int64_t row = (n * dm.q + q) * dm.heads + h;
        // softmax over the P points of this head
        double mx = -INFINITY, sum = 0;
        for (int64_t p = 0; p < dm.p; ++p) mx = std::fmax(mx, logit[row * dm.p + p]);
        std::vector<double> wgt(static_cast<size_t>(dm.p));
        for (int64_t p = 0; p < dm.p; ++p) sum += wgt[p] = std::exp(logit[row * dm.p + p] - mx);
        std::vector<double> acc(static_cast<size_t>(dm.d), 0.0);
        int64_t p = 0;
        for (size_t l = 0; l < dm.points.size(); ++l) {
          const int64_t H = dm.level_h[l], W = dm.level_w[l], start = dm.level_start[l];
          const float scale = 1.0f / static_cast<float>(dm.points[l]);  // transformers' n_points_scale
          for (int64_t k = 0; k < dm.points[l]; ++k, ++p) {
            const double w = wgt[p] / sum;
            const float ox = off[(row * dm.p + p) * 2], oy = off[(row * dm.p + p) * 2 + 1];
            const float lx = box[0] + ox * scale * box[2] * os;
            const float ly = box[1] + oy * scale * box[3] * os;
            if (dm.discrete) {
              const int64_t ix = discrete_index(lx, W), iy = discrete_index(ly, H);
              for (int64_t d = 0; d < dm.d; ++d) acc[d] += w * v_at(n, start + iy * W + ix, h, d);
              continue;
            }
            const double px = static_cast<double>(lx) * W - 0.5, py = static_cast<double>(ly) * H - 0.5;
            if (!std::isfinite(px) || !std::isfinite(py)) continue;  // outside every map
            const double x0 = std::floor(px), y0 = std::floor(py);
            const double fx = px - x0, fy = py - y0;
            for (int cy = 0; cy < 2; ++cy)
              for (int cx = 0; cx < 2; ++cx) {
                const double yy = y0 + cy, xx = x0 + cx;
                if (yy < 0 || yy >= H || xx < 0 || xx >= W) continue;  // zero padding
                const double bw = (cy ? fy : 1 - fy) * (cx ? fx : 1 - fx);
                const int64_t s = start + static_cast<int64_t>(yy) * W + static_cast<int64_t>(xx);
                for (int64_t d = 0; d < dm.d; ++d) acc[d] += w * bw * v_at(n, s, h, d);
              }
          }
        }
        for (int64_t d = 0; d < dm.d; ++d) y[(static_cast<size_t>((n * dm.q + q) * dm.heads + h)) * dm.d + d] = static_cast<float>(acc[d]);
      }
    }
  return y;
}

}  // namespace kiln::ref
