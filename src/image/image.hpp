// 8-bit RGB images: decoding (JPEG, PNG), PIL-exact resizing, and timm's
// evaluation pre-processing. The goal is bit-for-bit agreement with what timm
// feeds a model (PIL decode -> convert('RGB') -> Resize -> CenterCrop ->
// ToTensor -> Normalize), so every rounding step here mirrors PIL/torchvision.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "image/interpolation.hpp"

namespace kiln {

// Decoding refuses anything larger, before allocating pixel memory.
constexpr int kMaxImageSide = 32768;
constexpr int64_t kMaxImagePixels = int64_t{1} << 28;

struct ImageU8 {
  int width = 0, height = 0;
  std::vector<uint8_t> rgb;  // HWC, RGB, row-major, size 3*width*height
};

// Pixels someone else owns, laid out as ImageU8's (the GPU pre-processing
// reads them where they are: no copy into an ImageU8 first).
struct RgbView {
  int width = 0, height = 0;
  const uint8_t* rgb = nullptr;  // 3*width*height bytes
  size_t bytes() const { return 3 * static_cast<size_t>(width) * static_cast<size_t>(height); }
};
inline RgbView view_of(const ImageU8& img) { return {img.width, img.height, img.rgb.data()}; }

// Detects JPEG/PNG by magic bytes and returns RGB8 the way PIL's
// Image.open(p).convert('RGB') would: grayscale replicated, palette expanded,
// alpha dropped (not composited), 16-bit RGB/LA/RGBA reduced to the high byte,
// 16-bit grayscale clamped to 255 (PIL's I;16 -> RGB conversion), CMYK and
// YCCK JPEGs read as Adobe-inverted CMYK and converted with PIL's integer
// formula. Every failure is Error(Input) whose message starts with the file
// name, e.g. "x.png: truncated PNG data".
ImageU8 decode_image(const std::filesystem::path& path);
ImageU8 decode_image_bytes(const uint8_t* data, size_t size, const std::string& name_for_errors);

// When both dimensions change, PIL resamples in two 8-bit passes and the
// order matters (the rounded intermediate makes the orders differ by +-1).
// Pillow <= 12 always goes horizontal first; Pillow 13 (python-pillow PR
// #9549) goes vertical first when the height shrinks by more than twice as
// many pixels as the width. For ordinary photos resized proportionally the
// two agree unless the image is more than twice as tall as wide.
enum class PilPassOrder { Pillow13, Pillow12 };

// Bit-exact with PIL Image.resize((out_w, out_h), resample) on an RGB image.
ImageU8 resize_pil(const ImageU8& in, int out_w, int out_h, Interpolation interp,
                   PilPassOrder order = PilPassOrder::Pillow13);

// resize_pil as data, so another executor (the GPU's) applies the very same
// integer arithmetic: one 8-bit pass along one axis. For output index i along
// the axis, the taps are inputs first[i] .. first[i] + count[i] - 1 with the
// fixed-point weights weights[i * ksize ...] (PIL's 22 fractional bits); the
// sum starts at one half and is shifted and clipped to 0..255.
struct ResamplePass {
  bool horizontal = true;
  int in_w = 0, in_h = 0;    // the pass's input image
  int out_w = 0, out_h = 0;  // its output image
  // Horizontal: output row y reads input row y + row_offset (PIL computes only the
  // rows the vertical pass reads). Vertical: coefficient row r reads input row
  // first[r] - row_offset.
  int row_offset = 0;
  int ksize = 0;
  std::vector<int> first, count;
  std::vector<int32_t> weights;
};
inline constexpr int kResampleFractionBits = 22;  // 32 - 8 - 2, PIL's PRECISION_BITS

struct ResizePlan {
  int in_w = 0, in_h = 0, out_w = 0, out_h = 0;
  bool nearest = false;
  std::vector<int> nearest_x, nearest_y;  // NEAREST: source index per output index, -1: black
  std::vector<ResamplePass> passes;       // in order; none when the size does not change
};
ResizePlan plan_resize_pil(int in_w, int in_h, int out_w, int out_h, Interpolation interp,
                           PilPassOrder order = PilPassOrder::Pillow13);
ImageU8 run_resize_plan(const ImageU8& in, const ResizePlan& plan);

// torchvision CenterCrop: offsets round((in - out) / 2) half-to-even; when the
// crop is larger than the image it first pads (extra pixel on the right/bottom)
// with `fill` (torchvision uses 0, timm's CenterCropOrPad the mean colour).
ImageU8 center_crop(const ImageU8& in, int out_w, int out_h,
                    std::array<uint8_t, 3> fill = {0, 0, 0});

struct TimmPreprocess {
  int height = 224, width = 224;
  float crop_pct = 0.875f;
  Interpolation interpolation = Interpolation::Bicubic;
  std::array<float, 3> mean{0.485f, 0.456f, 0.406f}, std{0.229f, 0.224f, 0.225f};
  std::string crop_mode = "center";  // "center", "squash" or "border" (timm's crop_mode)
  PilPassOrder pil_pass_order = PilPassOrder::Pillow13;  // the Pillow the references use
};

struct ResizeStep {
  int width = 0, height = 0;
  Interpolation interpolation = Interpolation::Bilinear;
};

// The Resize that timm's transforms_imagenet_eval applies to an in_w x in_h
// image (before the crop). Exposed for tests and for CLI diagnostics.
ResizeStep timm_resize_step(int in_w, int in_h, const TimmPreprocess& p);

// Resize + crop/pad: the 8-bit image right before ToTensor.
ImageU8 timm_resize_crop(const ImageU8& img, const TimmPreprocess& p);

// ToTensor + Normalize in float32 exactly as torch does it:
// (float(v) / 255.f - mean[c]) / std[c], laid out CHW.
std::vector<float> normalize_to_chw(const ImageU8& img, const std::array<float, 3>& mean,
                                    const std::array<float, 3>& std);

// The whole timm eval transform; returns CHW float32 of 3 * p.height * p.width.
std::vector<float> timm_preprocess(const ImageU8& img, const TimmPreprocess& p);

// A whole pre-processing as data, for one input size: the resize, then output
// pixel (x, y) of the crop is resized pixel (x + dx, y + dy), or `fill` outside
// it, then channel c's 8-bit value v becomes lut[c][v] in CHW float32. The
// table holds the float32 results of torch's own operations, computed once, so
// any executor that indexes it (the CPU's run_preprocess_plan, the GPU's)
// gives the same bits.
struct PreprocessPlan {
  ResizePlan resize;
  int out_w = 0, out_h = 0;
  int dx = 0, dy = 0;
  std::array<uint8_t, 3> fill{0, 0, 0};
  std::array<std::array<float, 256>, 3> lut{};
};
PreprocessPlan plan_timm_preprocess(int in_w, int in_h, const TimmPreprocess& p);
std::vector<float> run_preprocess_plan(const ImageU8& img, const PreprocessPlan& plan);

// Detection pre-processing (transformers' RTDetrImageProcessor): Resize to
// (height, width) with PIL (no crop, aspect not kept; an image already of
// that size is not resampled, as PIL's resize returns a copy), then
// float(v) * rescale in float32 laid out CHW, no mean/std. The float math is
// torch's (uint8 tensor * python float), i.e. what transformers' default
// torchvision image processor computes; its PIL processor multiplies in
// float64 and rounds once, which differs by at most 1 ulp (6e-8).
struct ResizeRescale {
  int height = 640, width = 640;
  Interpolation interpolation = Interpolation::Bilinear;
  float rescale = 1.f / 255.f;
  PilPassOrder pil_pass_order = PilPassOrder::Pillow13;
};
// The 8-bit image right before the rescale.
ImageU8 resize_rescale_u8(const ImageU8& img, const ResizeRescale& p);
std::vector<float> rescale_to_chw(const ImageU8& img, float rescale);
std::vector<float> resize_rescale(const ImageU8& img, const ResizeRescale& p);

// PNG encoding (8-bit RGB, no interlace). write_png writes to a temporary
// file beside `path` and renames it, so a failure leaves nothing behind;
// errors name the file.
std::vector<uint8_t> encode_png(const ImageU8& img);
void write_png(const std::filesystem::path& path, const ImageU8& img);

// Drawing on RGB8 images (kiln detect --draw): rectangle outlines clipped to
// the image, and text in a built-in 5x7 bitmap font (ASCII 32..126; lower
// case is drawn as upper case, other bytes as '?'), scaled by `scale`.
struct Rgb {
  uint8_t r = 0, g = 0, b = 0;
};
void draw_rect(ImageU8& img, int x0, int y0, int x1, int y1, Rgb color, int thickness = 1);
void fill_rect(ImageU8& img, int x0, int y0, int x1, int y1, Rgb color);
// Width and height in pixels of `text` drawn at `scale`.
int text_width(const std::string& text, int scale = 1);
int text_height(int scale = 1);
void draw_text(ImageU8& img, int x, int y, const std::string& text, Rgb color, int scale = 1);

}  // namespace kiln
