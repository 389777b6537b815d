// PNG encoding (libpng) of RGB8 images, for `kiln detect --draw` and tests.
// Encoding happens in memory first, so a file is only written (atomically)
// once the whole PNG exists.
#include <csetjmp>
#include <cstdio>
#include <cstring>

#include <png.h>

#include "core/error.hpp"
#include "core/file.hpp"
#include "image/image.hpp"

namespace kiln {
namespace {

struct PngSink {
  std::vector<uint8_t> bytes;
  char error[256] = {};
};

void png_write_to_memory(png_structp png, png_bytep data, png_size_t n) {
  auto* sink = static_cast<PngSink*>(png_get_io_ptr(png));
  sink->bytes.insert(sink->bytes.end(), data, data + n);
}
void png_flush_nothing(png_structp) {}

[[noreturn]] void png_on_write_error(png_structp png, png_const_charp msg) {
  auto* sink = static_cast<PngSink*>(png_get_error_ptr(png));
  std::snprintf(sink->error, sizeof(sink->error), "%s", msg);
  std::longjmp(png_jmpbuf(png), 1);
}
void png_on_write_warning(png_structp, png_const_charp) {}

// Only C objects live in this frame (see decode.cpp): the longjmp from
// libpng's error handler lands here. Rows are handed over as pointers into
// the caller's image. Returns false with sink.error set on failure.
bool encode_rgb(const ImageU8& img, png_bytep* rows, PngSink& sink) {
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, &sink, png_on_write_error, png_on_write_warning);
  if (!png) {
    std::snprintf(sink.error, sizeof(sink.error), "out of memory");
    return false;
  }
  png_infop info = png_create_info_struct(png);
  if (!info || setjmp(png_jmpbuf(png))) {
    if (!sink.error[0]) std::snprintf(sink.error, sizeof(sink.error), "out of memory");
    png_destroy_write_struct(&png, info ? &info : nullptr);
    return false;
  }
  png_set_write_fn(png, &sink, png_write_to_memory, png_flush_nothing);
  png_set_IHDR(png, info, static_cast<png_uint_32>(img.width), static_cast<png_uint_32>(img.height), 8,
               PNG_COLOR_TYPE_RGB, PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  png_set_rows(png, info, rows);
  png_write_png(png, info, PNG_TRANSFORM_IDENTITY, nullptr);
  png_destroy_write_struct(&png, &info);
  return true;
}

}  // namespace

std::vector<uint8_t> encode_png(const ImageU8& img) {
  if (img.width < 1 || img.height < 1 || img.width > kMaxImageSide || img.height > kMaxImageSide ||
      img.rgb.size() != static_cast<size_t>(img.width) * img.height * 3)
    fail_input("encode_png: invalid image ", img.width, "x", img.height, " with ", img.rgb.size(), " bytes");
  std::vector<png_bytep> rows(static_cast<size_t>(img.height));
  // libpng takes non-const row pointers but only reads them when writing.
  auto* base = const_cast<uint8_t*>(img.rgb.data());
  for (int y = 0; y < img.height; ++y) rows[static_cast<size_t>(y)] = base + static_cast<size_t>(y) * img.width * 3;
  PngSink sink;
  if (!encode_rgb(img, rows.data(), sink)) fail_runtime("encode_png: ", sink.error);
  return std::move(sink.bytes);
}

void write_png(const std::filesystem::path& path, const ImageU8& img) {
  const std::vector<uint8_t> bytes = encode_png(img);
  try {
    write_file_atomic(path, [&](std::FILE* f) { write_all(f, bytes.data(), bytes.size()); });
  } catch (const Error& e) {
    fail_input(path.string(), ": cannot write PNG: ", e.what());
  } catch (const std::exception& e) {
    fail_input(path.string(), ": cannot write PNG: ", e.what());
  }
}

}  // namespace kiln
