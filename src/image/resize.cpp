// PIL-exact resampling of 8-bit RGB images (PIL's libImaging/Resample.c and the
// NEAREST path of Geometry.c, re-derived). Every floating-point expression
// below keeps PIL's operation order, because the coefficient values, once
// quantised to fixed point, decide the 8-bit result.
#include <algorithm>
#include <functional>
#include <cmath>
#include <cstring>

#include "backends/cpu/thread_pool.hpp"
#include "image/image.hpp"

// A fused multiply-add rounds differently from PIL's separate mul + add, which
// can flip a fixed-point coefficient by one unit; keep contraction off even if
// someone builds with -march=native.
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

namespace kiln {
namespace {

// PIL: 8 bits of result, 2 bits of headroom for the negative lobes of the
// cubic kernel, the rest for the fractional part of the coefficients.
constexpr int kPrecisionBits = 32 - 8 - 2;
static_assert(kPrecisionBits == kResampleFractionBits);

struct Filter {
  double (*weight)(double);
  double support;
};

double bilinear_weight(double x) {
  if (x < 0.0) x = -x;
  if (x < 1.0) return 1.0 - x;
  return 0.0;
}

double bicubic_weight(double x) {
  // Cubic convolution with a = -0.5 (Keys); same grouping as PIL.
  constexpr double a = -0.5;
  if (x < 0.0) x = -x;
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
  if (x < 2.0) return (((x - 5) * x + 8) * x - 4) * a;
  return 0.0;
}

// For each output index along one axis: the first input index, the number of
// inputs, and `ksize` fixed-point weights (unused tail is zero).
struct AxisCoeffs {
  int ksize = 0;
  std::vector<int> first, count;
  std::vector<int32_t> weights;
};

AxisCoeffs precompute_coeffs(int in_size, int out_size, const Filter& filter) {
  // PIL passes the box edges as floats (0 and in_size); the scale is computed
  // in double from their float difference.
  const float in0 = 0.0f, in1 = static_cast<float>(in_size);
  const double scale = static_cast<double>(in1 - in0) / out_size;
  // Downscaling widens the kernel by the scale (antialiasing); upscaling keeps it.
  const double filterscale = scale < 1.0 ? 1.0 : scale;
  const double support = filter.support * filterscale;
  AxisCoeffs c;
  c.ksize = static_cast<int>(std::ceil(support)) * 2 + 1;
  c.first.resize(out_size);
  c.count.resize(out_size);
  c.weights.assign(static_cast<size_t>(out_size) * c.ksize, 0);
  std::vector<double> k(c.ksize);
  for (int xx = 0; xx < out_size; ++xx) {
    const double center = in0 + (xx + 0.5) * scale;
    const double ss = 1.0 / filterscale;
    // PIL "rounds" with +0.5 and a C cast, i.e. truncation toward zero; the
    // clamp to 0 afterwards makes that equal to its result for negatives too.
    int xmin = static_cast<int>(center - support + 0.5);
    if (xmin < 0) xmin = 0;
    int xmax = static_cast<int>(center + support + 0.5);
    if (xmax > in_size) xmax = in_size;
    xmax -= xmin;
    double ww = 0.0;
    for (int x = 0; x < xmax; ++x) {
      const double w = filter.weight((x + xmin - center + 0.5) * ss);
      k[x] = w;
      ww += w;
    }
    int32_t* out = &c.weights[static_cast<size_t>(xx) * c.ksize];
    for (int x = 0; x < xmax; ++x) {
      const double kn = ww != 0.0 ? k[x] / ww : k[x];
      // Round half away from zero into fixed point, as PIL does.
      out[x] = kn < 0 ? static_cast<int32_t>(-0.5 + kn * (1 << kPrecisionBits))
                      : static_cast<int32_t>(0.5 + kn * (1 << kPrecisionBits));
    }
    c.first[xx] = xmin;
    c.count[xx] = xmax;
  }
  return c;
}

// The accumulator starts at one half so the final arithmetic shift rounds to
// nearest; PIL then clips the shifted value to [0, 255].
inline uint8_t clip8(int32_t acc) {
  const int32_t v = acc >> kPrecisionBits;
  return static_cast<uint8_t>(v < 0 ? 0 : (v > 255 ? 255 : v));
}

// Rows of a pass are independent: spread them over the CPU pool (the
// arithmetic per pixel is unchanged, so results stay bit-exact). Small
// images run inline, where threading would cost more than it saves.
void for_rows(int rows, int64_t work_per_row, const std::function<void(int, int)>& fn) {
  constexpr int64_t kMinWorkPerChunk = 1 << 16;
  auto& pool = cpu::default_pool();
  const int64_t grain = std::max<int64_t>(1, kMinWorkPerChunk / std::max<int64_t>(1, work_per_row));
  pool.parallel_for(rows, [&](int64_t b, int64_t e) { fn(static_cast<int>(b), static_cast<int>(e)); }, grain);
}

// Horizontal pass: output row y is input row y + pass.row_offset.
ImageU8 resample_horizontal(const ImageU8& in, const ResamplePass& c) {
  ImageU8 out;
  out.width = c.out_w;
  out.height = c.out_h;
  out.rgb.resize(static_cast<size_t>(c.out_w) * c.out_h * 3);
  for_rows(c.out_h, static_cast<int64_t>(c.out_w) * c.ksize * 3, [&](int y0, int y1) {
    for (int yy = y0; yy < y1; ++yy) {
      const uint8_t* src = &in.rgb[static_cast<size_t>(yy + c.row_offset) * in.width * 3];
      uint8_t* dst = &out.rgb[static_cast<size_t>(yy) * c.out_w * 3];
      for (int xx = 0; xx < c.out_w; ++xx) {
        const int32_t* k = &c.weights[static_cast<size_t>(xx) * c.ksize];
        const uint8_t* p = src + static_cast<size_t>(c.first[xx]) * 3;
        int32_t s0 = 1 << (kPrecisionBits - 1), s1 = s0, s2 = s0;
        for (int x = 0; x < c.count[xx]; ++x, p += 3) {
          s0 += p[0] * k[x];
          s1 += p[1] * k[x];
          s2 += p[2] * k[x];
        }
        dst[xx * 3 + 0] = clip8(s0);
        dst[xx * 3 + 1] = clip8(s1);
        dst[xx * 3 + 2] = clip8(s2);
      }
    }
  });
  return out;
}

// Vertical pass: coefficient row r reads input row first[r] - pass.row_offset
// (non-zero when the horizontal pass only produced the needed rows).
ImageU8 resample_vertical(const ImageU8& in, const ResamplePass& c) {
  ImageU8 out;
  out.width = in.width;
  out.height = c.out_h;
  out.rgb.resize(static_cast<size_t>(in.width) * c.out_h * 3);
  const size_t stride = static_cast<size_t>(in.width) * 3;
  for_rows(c.out_h, static_cast<int64_t>(stride) * c.ksize, [&](int y0, int y1) {
    // Accumulate whole rows (y outer, x inner) so the loop is contiguous and
    // vectorizes; each pixel still sums its taps in PIL's order.
    std::vector<int32_t> acc(stride);
    for (int yy = y0; yy < y1; ++yy) {
      const int32_t* k = &c.weights[static_cast<size_t>(yy) * c.ksize];
      const uint8_t* base = &in.rgb[static_cast<size_t>(c.first[yy] - c.row_offset) * stride];
      std::fill(acc.begin(), acc.end(), 1 << (kPrecisionBits - 1));
      for (int y = 0; y < c.count[yy]; ++y) {
        const uint8_t* p = base + static_cast<size_t>(y) * stride;
        const int32_t w = k[y];
        for (size_t i = 0; i < stride; ++i) acc[i] += p[i] * w;
      }
      uint8_t* dst = &out.rgb[static_cast<size_t>(yy) * stride];
      for (size_t i = 0; i < stride; ++i) dst[i] = clip8(acc[i]);
    }
  });
  return out;
}

// PIL's NEAREST resize is an affine "scale" transform: source positions are
// accumulated (not multiplied) in double from a pixel-centre start and
// truncated; positions falling outside the image leave black pixels.
std::vector<int> nearest_positions(int in_size, int out_size) {
  const double step = static_cast<double>(static_cast<float>(in_size) - 0.0f) / out_size;
  std::vector<int> pos(out_size);
  double v = 0.0 + step * 0.5;
  for (int i = 0; i < out_size; ++i) {
    const int p = v < 0.0 ? -1 : static_cast<int>(v);
    pos[i] = (p >= 0 && p < in_size) ? p : -1;
    v += step;
  }
  return pos;
}

ImageU8 resize_nearest(const ImageU8& in, const ResizePlan& plan) {
  const std::vector<int>& xs = plan.nearest_x;
  const std::vector<int>& ys = plan.nearest_y;
  ImageU8 out;
  out.width = plan.out_w;
  out.height = plan.out_h;
  out.rgb.assign(static_cast<size_t>(plan.out_w) * plan.out_h * 3, 0);
  for (int y = 0; y < plan.out_h; ++y) {
    if (ys[y] < 0) continue;
    const uint8_t* src = &in.rgb[static_cast<size_t>(ys[y]) * in.width * 3];
    uint8_t* dst = &out.rgb[static_cast<size_t>(y) * plan.out_w * 3];
    for (int x = 0; x < plan.out_w; ++x) {
      if (xs[x] < 0) continue;
      std::memcpy(dst + x * 3, src + static_cast<size_t>(xs[x]) * 3, 3);
    }
  }
  return out;
}

ResamplePass make_pass(bool horizontal, int in_w, int in_h, int out_w, int out_h, int row_offset, AxisCoeffs c) {
  ResamplePass p;
  p.horizontal = horizontal;
  p.in_w = in_w, p.in_h = in_h, p.out_w = out_w, p.out_h = out_h;
  p.row_offset = row_offset;
  p.ksize = c.ksize;
  p.first = std::move(c.first);
  p.count = std::move(c.count);
  p.weights = std::move(c.weights);
  return p;
}

}  // namespace

ResizePlan plan_resize_pil(int in_w, int in_h, int out_w, int out_h, Interpolation interp, PilPassOrder order) {
  if (out_w < 1 || out_h < 1) fail_input("resize: height and width must be > 0, got ", out_w, "x", out_h);
  if (in_w < 1 || in_h < 1) fail_input("resize: malformed input image ", in_w, "x", in_h);
  ResizePlan plan;
  plan.in_w = in_w, plan.in_h = in_h, plan.out_w = out_w, plan.out_h = out_h;
  // Image.resize returns a copy when the size does not change.
  if (out_w == in_w && out_h == in_h) return plan;
  if (interp == Interpolation::Nearest) {
    plan.nearest = true;
    plan.nearest_x = nearest_positions(in_w, out_w);
    plan.nearest_y = nearest_positions(in_h, out_h);
    return plan;
  }
  const Filter filter = interp == Interpolation::Bicubic ? Filter{bicubic_weight, 2.0}
                                                         : Filter{bilinear_weight, 1.0};
  // A pass runs only when its dimension changes (default box).
  if (out_h == in_h) {
    plan.passes.push_back(make_pass(true, in_w, in_h, out_w, in_h, 0, precompute_coeffs(in_w, out_w, filter)));
    return plan;
  }
  AxisCoeffs vert = precompute_coeffs(in_h, out_h, filter);
  if (out_w == in_w) {
    plan.passes.push_back(make_pass(false, in_w, in_h, in_w, out_h, 0, std::move(vert)));
    return plan;
  }
  AxisCoeffs horiz = precompute_coeffs(in_w, out_w, filter);
  // Pillow 13 measures the reductions in pixels: vertical first iff the height
  // shrinks and loses more than twice as many pixels as the width does.
  const bool vertical_first = order == PilPassOrder::Pillow13 && out_h < in_h && (in_h - out_h) > 2 * (in_w - out_w);
  if (vertical_first) {
    plan.passes.push_back(make_pass(false, in_w, in_h, in_w, out_h, 0, std::move(vert)));
    plan.passes.push_back(make_pass(true, in_w, out_h, out_w, out_h, 0, std::move(horiz)));
    return plan;
  }
  // Like PIL, the horizontal pass only produces the rows the vertical pass
  // reads (identical results, less work when the rows are cropped away).
  const int row_first = vert.first.front();
  const int row_last = vert.first.back() + vert.count.back();
  plan.passes.push_back(make_pass(true, in_w, in_h, out_w, row_last - row_first, row_first, std::move(horiz)));
  plan.passes.push_back(make_pass(false, out_w, row_last - row_first, out_w, out_h, row_first, std::move(vert)));
  return plan;
}

ImageU8 run_resize_plan(const ImageU8& in, const ResizePlan& plan) {
  if (in.width != plan.in_w || in.height != plan.in_h ||
      in.rgb.size() != static_cast<size_t>(in.width) * in.height * 3)
    fail_input("resize: malformed input image ", in.width, "x", in.height, " for a plan of ", plan.in_w, "x", plan.in_h);
  if (plan.nearest) return resize_nearest(in, plan);
  if (plan.passes.empty()) return in;
  ImageU8 cur = plan.passes[0].horizontal ? resample_horizontal(in, plan.passes[0]) : resample_vertical(in, plan.passes[0]);
  for (size_t i = 1; i < plan.passes.size(); ++i)
    cur = plan.passes[i].horizontal ? resample_horizontal(cur, plan.passes[i]) : resample_vertical(cur, plan.passes[i]);
  return cur;
}

ImageU8 resize_pil(const ImageU8& in, int out_w, int out_h, Interpolation interp, PilPassOrder order) {
  if (in.width < 1 || in.height < 1 || in.rgb.size() != static_cast<size_t>(in.width) * in.height * 3)
    fail_input("resize: malformed input image ", in.width, "x", in.height);
  return run_resize_plan(in, plan_resize_pil(in.width, in.height, out_w, out_h, interp, order));
}

}  // namespace kiln
