// timm's evaluation transform (timm.data.transforms_factory.
// transforms_imagenet_eval, timm 1.0) on top of PIL-exact resizing:
//   center: Resize(shortest edge) -> CenterCrop(size)
//   squash: Resize((h, w)) -> CenterCrop(size)
//   border: ResizeKeepRatio(longest edge) -> CenterCropOrPad(size, fill=mean)
// then ToTensor (/255) and Normalize(mean, std) in float32.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <tuple>
#include <utility>

#include "image/image.hpp"

namespace kiln {
namespace {

// timm computes with the Python float (a double) written in the model config,
// e.g. 0.95, while TimmPreprocess stores a float. Re-reading the float's
// shortest decimal form as a double recovers that Python value, so that e.g.
// floor(288 / 0.9) is evaluated exactly as Python does.
double python_double(float v) {
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof(buf) - 1, v);
  *res.ptr = 0;
  return std::strtod(buf, nullptr);
}

// Python's round(): half to even (the default FE_TONEAREST mode).
long round_half_even(double v) { return std::lrint(v); }

// timm ResizeKeepRatio.get_params without the random parts: the ratio blends
// the larger and smaller edge ratio by `longest`, each edge is divided by it
// and rounded half-to-even.
ResizeStep keep_ratio_size(int in_w, int in_h, int target_w, int target_h, double longest,
                           Interpolation interp) {
  const double ratio_h = static_cast<double>(in_h) / target_h;
  const double ratio_w = static_cast<double>(in_w) / target_w;
  const double ratio = std::max(ratio_h, ratio_w) * longest + std::min(ratio_h, ratio_w) * (1. - longest);
  ResizeStep s;
  s.height = static_cast<int>(round_half_even(in_h * 1.0 / ratio));
  s.width = static_cast<int>(round_half_even(in_w * 1.0 / ratio));
  s.interpolation = interp;
  return s;
}

void check_params(const TimmPreprocess& p) {
  if (p.height < 1 || p.width < 1 || p.height > kMaxImageSide || p.width > kMaxImageSide)
    fail_input("pre-processing: invalid input size ", p.height, "x", p.width);
  if (!(p.crop_pct >= 0.0f) || p.crop_pct > 16.0f)
    fail_input("pre-processing: invalid crop_pct ", p.crop_pct);
  for (float s : p.std)
    if (s == 0.0f) fail_input("pre-processing: std must be non-zero");
  if (p.crop_mode != "center" && p.crop_mode != "squash" && p.crop_mode != "border")
    fail_input("pre-processing: unsupported crop_mode '", p.crop_mode,
               "' (expected center, squash or border)");
}

}  // namespace

namespace {

// torchvision pads first when the crop is larger: (d // 2) before and
// ((d + 1) // 2) after, so the odd pixel goes to the right/bottom. Then
// crop_top = int(round((H - h) / 2.)) with Python's half-to-even round: an odd
// excess of 1 gives 0, of 3 gives 2, of 5 gives 2. Returns where output (0, 0)
// sits in the input: output (x, y) is input (x + dx, y + dy), `fill` outside.
std::pair<int, int> crop_origin(int in_w, int in_h, int out_w, int out_h) {
  const int pad_left = out_w > in_w ? (out_w - in_w) / 2 : 0;
  const int pad_top = out_h > in_h ? (out_h - in_h) / 2 : 0;
  const int padded_w = std::max(in_w, out_w);
  const int padded_h = std::max(in_h, out_h);
  const int crop_top = static_cast<int>(round_half_even((padded_h - out_h) / 2.0));
  const int crop_left = static_cast<int>(round_half_even((padded_w - out_w) / 2.0));
  return {crop_left - pad_left, crop_top - pad_top};
}

}  // namespace

ImageU8 center_crop(const ImageU8& in, int out_w, int out_h, std::array<uint8_t, 3> fill) {
  if (out_w < 1 || out_h < 1) fail_input("center crop: invalid size ", out_w, "x", out_h);
  const auto [dx, dy] = crop_origin(in.width, in.height, out_w, out_h);
  ImageU8 out;
  out.width = out_w;
  out.height = out_h;
  out.rgb.resize(static_cast<size_t>(out_w) * out_h * 3);
  for (int y = 0; y < out_h; ++y) {
    uint8_t* dst = &out.rgb[static_cast<size_t>(y) * out_w * 3];
    const int sy = y + dy;
    for (int x = 0; x < out_w; ++x) {
      const int sx = x + dx;
      if (sy >= 0 && sy < in.height && sx >= 0 && sx < in.width)
        std::memcpy(dst + x * 3, &in.rgb[(static_cast<size_t>(sy) * in.width + sx) * 3], 3);
      else
        std::memcpy(dst + x * 3, fill.data(), 3);
    }
  }
  return out;
}

ResizeStep timm_resize_step(int in_w, int in_h, const TimmPreprocess& p) {
  check_params(p);
  // `crop_pct or DEFAULT_CROP_PCT`: 0 means the default 0.875.
  const double crop_pct = p.crop_pct == 0.0f ? 0.875 : python_double(p.crop_pct);
  const int scale_h = static_cast<int>(std::floor(p.height / crop_pct));
  const int scale_w = static_cast<int>(std::floor(p.width / crop_pct));
  if (p.crop_mode == "squash") return ResizeStep{scale_w, scale_h, p.interpolation};
  if (p.crop_mode == "border")
    return keep_ratio_size(in_w, in_h, scale_w, scale_h, 1.0, p.interpolation);
  if (scale_h != scale_w) {
    // timm builds ResizeKeepRatio(scale_size) here without passing the
    // interpolation, so non-square targets always resize bilinearly.
    return keep_ratio_size(in_w, in_h, scale_w, scale_h, 0.0, Interpolation::Bilinear);
  }
  // torchvision Resize(int): the short edge becomes `size`, the long edge
  // int(size * long / short) (true division, then truncation).
  const int size = scale_h;
  const bool portrait = in_w <= in_h;
  const int shorter = portrait ? in_w : in_h, longer = portrait ? in_h : in_w;
  const int new_long = static_cast<int>(static_cast<double>(int64_t{size} * longer) / shorter);
  return portrait ? ResizeStep{size, new_long, p.interpolation}
                  : ResizeStep{new_long, size, p.interpolation};
}

namespace {

// CenterCropOrPad(fill=[round(255 * v) for v in mean]) for crop_mode border, else black.
std::array<uint8_t, 3> crop_fill(const TimmPreprocess& p) {
  std::array<uint8_t, 3> fill{0, 0, 0};
  if (p.crop_mode == "border")
    for (int c = 0; c < 3; ++c)
      fill[c] = static_cast<uint8_t>(std::clamp<long>(round_half_even(255 * python_double(p.mean[c])), 0, 255));
  return fill;
}

ResizeStep checked_step(int in_w, int in_h, const TimmPreprocess& p) {
  const ResizeStep step = timm_resize_step(in_w, in_h, p);
  if (step.width < 1 || step.height < 1)
    fail_input("pre-processing: image ", in_w, "x", in_h, " is too small to resize");
  return step;
}

}  // namespace

ImageU8 timm_resize_crop(const ImageU8& img, const TimmPreprocess& p) {
  const ResizeStep step = checked_step(img.width, img.height, p);
  const ImageU8 resized = resize_pil(img, step.width, step.height, step.interpolation, p.pil_pass_order);
  return center_crop(resized, p.width, p.height, crop_fill(p));
}

std::vector<float> normalize_to_chw(const ImageU8& img, const std::array<float, 3>& mean,
                                    const std::array<float, 3>& std) {
  const size_t plane = static_cast<size_t>(img.width) * img.height;
  std::vector<float> out(plane * 3);
  for (int c = 0; c < 3; ++c) {
    // A 256-entry table per channel: exactly the float32 ops torch performs
    // (to_tensor's div(255) then sub_(mean).div_(std)), evaluated once.
    float lut[256];
    for (int v = 0; v < 256; ++v) lut[v] = (static_cast<float>(v) / 255.0f - mean[c]) / std[c];
    float* dst = &out[plane * c];
    for (size_t i = 0; i < plane; ++i) dst[i] = lut[img.rgb[i * 3 + c]];
  }
  return out;
}

std::vector<float> timm_preprocess(const ImageU8& img, const TimmPreprocess& p) {
  return run_preprocess_plan(img, plan_timm_preprocess(img.width, img.height, p));
}

PreprocessPlan plan_timm_preprocess(int in_w, int in_h, const TimmPreprocess& p) {
  const ResizeStep step = checked_step(in_w, in_h, p);
  PreprocessPlan plan;
  plan.resize = plan_resize_pil(in_w, in_h, step.width, step.height, step.interpolation, p.pil_pass_order);
  plan.out_w = p.width;
  plan.out_h = p.height;
  std::tie(plan.dx, plan.dy) = crop_origin(step.width, step.height, p.width, p.height);
  plan.fill = crop_fill(p);
  for (int c = 0; c < 3; ++c)
    for (int v = 0; v < 256; ++v) plan.lut[c][v] = (static_cast<float>(v) / 255.0f - p.mean[c]) / p.std[c];
  return plan;
}

std::vector<float> run_preprocess_plan(const ImageU8& img, const PreprocessPlan& plan) {
  const ImageU8 resized = run_resize_plan(img, plan.resize);
  const size_t plane = static_cast<size_t>(plan.out_w) * plan.out_h;
  std::vector<float> out(plane * 3);
  for (int y = 0; y < plan.out_h; ++y)
    for (int x = 0; x < plan.out_w; ++x) {
      const int sx = x + plan.dx, sy = y + plan.dy;
      const bool inside = sx >= 0 && sx < resized.width && sy >= 0 && sy < resized.height;
      const uint8_t* px = inside ? &resized.rgb[(static_cast<size_t>(sy) * resized.width + sx) * 3] : plan.fill.data();
      for (int c = 0; c < 3; ++c) out[plane * c + static_cast<size_t>(y) * plan.out_w + x] = plan.lut[c][px[c]];
    }
  return out;
}

ImageU8 resize_rescale_u8(const ImageU8& img, const ResizeRescale& p) {
  if (p.height < 1 || p.width < 1 || p.height > kMaxImageSide || p.width > kMaxImageSide)
    fail_input("pre-processing: invalid input size ", p.height, "x", p.width);
  if (img.width < 1 || img.height < 1) fail_input("pre-processing: empty image");
  if (img.width == p.width && img.height == p.height) return img;
  return resize_pil(img, p.width, p.height, p.interpolation, p.pil_pass_order);
}

std::vector<float> rescale_to_chw(const ImageU8& img, float rescale) {
  const size_t plane = static_cast<size_t>(img.width) * img.height;
  std::vector<float> out(plane * 3);
  float lut[256];
  for (int v = 0; v < 256; ++v) lut[v] = static_cast<float>(v) * rescale;
  for (int c = 0; c < 3; ++c) {
    float* dst = &out[plane * c];
    for (size_t i = 0; i < plane; ++i) dst[i] = lut[img.rgb[i * 3 + c]];
  }
  return out;
}

std::vector<float> resize_rescale(const ImageU8& img, const ResizeRescale& p) {
  return rescale_to_chw(resize_rescale_u8(img, p), p.rescale);
}

}  // namespace kiln
