// JPEG (libjpeg) and PNG (libpng) decoding into RGB8, matching what timm sees
// through PIL: Image.open(path).convert('RGB').
//
// Both libraries report fatal errors by calling a handler that must not
// return. We longjmp out of it back into a small function whose only locals
// are the library structs (the pattern libjpeg's example.c uses); no C++
// object with a destructor lives in those frames, and the C++ exception is
// thrown only after the library state has been destroyed.
#include <csetjmp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>

#include <jpeglib.h>
#include <jerror.h>
#include <png.h>

#include "core/file.hpp"
#include "image/image.hpp"

namespace kiln {
namespace {

// Both decoders fill this; `error` empty means success.
struct DecodeResult {
  ImageU8 image;
  char error[JMSG_LENGTH_MAX + 64] = {};
};

void set_error(DecodeResult& r, const char* msg) {
  std::snprintf(r.error, sizeof(r.error), "%s", msg);
}

bool dimensions_ok(DecodeResult& r, unsigned long w, unsigned long h) {
  if (w == 0 || h == 0) {
    set_error(r, "image has zero width or height");
    return false;
  }
  if (w > static_cast<unsigned long>(kMaxImageSide) || h > static_cast<unsigned long>(kMaxImageSide) ||
      static_cast<unsigned long long>(w) * h > static_cast<unsigned long long>(kMaxImagePixels)) {
    std::snprintf(r.error, sizeof(r.error),
                  "image too large: %lux%lu (limit %d pixels per side and 2^28 pixels)", w, h,
                  kMaxImageSide);
    return false;
  }
  return true;
}

// A header may claim up to kMaxImagePixels from a few bytes; before
// allocating (and decoding for seconds), check that the file can hold that
// much image data at all. `min_bytes` is a lower bound no valid file
// undercuts, so only truncated or hostile files are refused.
bool data_ok(DecodeResult& r, const char* format, uint64_t min_bytes, uint64_t have_bytes) {
  if (have_bytes >= min_bytes) return true;
  std::snprintf(r.error, sizeof(r.error), "truncated %s data (%llu bytes of image data, the %s header needs at least %llu)",
                format, static_cast<unsigned long long>(have_bytes), format, static_cast<unsigned long long>(min_bytes));
  return false;
}

// Allocation can throw; turn that into a decode error so the library state is
// still cleaned up by the caller's normal path.
bool allocate_rgb(DecodeResult& r, int w, int h) {
  try {
    r.image.width = w;
    r.image.height = h;
    r.image.rgb.resize(static_cast<size_t>(w) * h * 3);
    return true;
  } catch (const std::bad_alloc&) {
    set_error(r, "out of memory for decoded image");
    return false;
  }
}

// ---------------------------------------------------------------- JPEG ----

struct JpegErrorManager {
  jpeg_error_mgr pub;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

[[noreturn]] void jpeg_on_error(j_common_ptr cinfo) {
  auto* mgr = reinterpret_cast<JpegErrorManager*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, mgr->message);
  std::longjmp(mgr->jump, 1);
}

// libjpeg only warns when the data runs out and then pads with a fake EOI,
// producing a grey bottom. PIL treats that case as "image file is truncated",
// so it is fatal here too; other warnings (e.g. extraneous bytes) are ignored
// exactly like PIL's silent output_message.
void jpeg_on_message(j_common_ptr cinfo, int msg_level) {
  if (msg_level < 0 && cinfo->err->msg_code == JWRN_JPEG_EOF) {
    auto* mgr = reinterpret_cast<JpegErrorManager*>(cinfo->err);
    std::snprintf(mgr->message, sizeof(mgr->message), "truncated JPEG data");
    std::longjmp(mgr->jump, 1);
  }
}

// PIL reads every 4-component JPEG as inverted CMYK (raw mode "CMYK;I",
// "assume adobe conventions", whether or not an Adobe marker is present) and
// convert("RGB") then computes, per channel, nk - round(c * nk / 255) with
// nk = 255 - k, using its MULDIV255 rounding: (a*b + 128 + ((a*b + 128) >> 8)) >> 8.
// With the inversion folded in, c = 255 - stored_c and nk = stored_k.
void cmyk_row_to_rgb(const uint8_t* cmyk, uint8_t* rgb, int w) {
  for (int x = 0; x < w; ++x, cmyk += 4, rgb += 3) {
    const int nk = cmyk[3];
    for (int c = 0; c < 3; ++c) {
      const int t = (255 - cmyk[c]) * nk + 128;
      rgb[c] = static_cast<uint8_t>(nk - (((t >> 8) + t) >> 8));
    }
  }
}

void decode_jpeg(const uint8_t* data, size_t size, DecodeResult& r) {
  jpeg_decompress_struct cinfo;
  JpegErrorManager err;
  cinfo.err = jpeg_std_error(&err.pub);
  err.pub.error_exit = jpeg_on_error;
  err.pub.emit_message = jpeg_on_message;
  err.message[0] = 0;
  if (setjmp(err.jump)) {
    jpeg_destroy_decompress(&cinfo);
    set_error(r, err.message[0] ? err.message : "corrupt JPEG data");
    return;
  }
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, const_cast<unsigned char*>(data), static_cast<unsigned long>(size));
  jpeg_read_header(&cinfo, TRUE);
  const int components = cinfo.num_components;
  if (components != 1 && components != 3 && components != 4) {
    // PIL: "cannot handle N-layer images".
    std::snprintf(r.error, sizeof(r.error), "unsupported JPEG with %d components", components);
  } else if (dimensions_ok(r, cinfo.image_width, cinfo.image_height) &&
             // Huffman coding spends at least one bit on every 8x8 block of the first
             // component (arithmetic coding can spend less, so it is not bounded).
             (cinfo.arith_code ||
              data_ok(r, "JPEG", (uint64_t{cinfo.comp_info[0].width_in_blocks} * cinfo.comp_info[0].height_in_blocks + 7) / 8,
                      size))) {
    // PIL picks its mode from the component count alone (1 L, 3 RGB, 4 CMYK)
    // and asks libjpeg for that colour space; libjpeg has already chosen the
    // stored one from the Adobe/JFIF markers (4 components: YCCK when the
    // Adobe transform is 2, else CMYK) and converts YCCK to CMYK itself.
    cinfo.out_color_space = components == 1 ? JCS_GRAYSCALE : components == 3 ? JCS_RGB : JCS_CMYK;
    // PIL leaves libjpeg at its defaults: accurate integer IDCT and fancy
    // (triangular) chroma upsampling. Set them explicitly anyway.
    cinfo.dct_method = JDCT_ISLOW;
    cinfo.do_fancy_upsampling = TRUE;
    jpeg_start_decompress(&cinfo);
    const int w = static_cast<int>(cinfo.output_width), h = static_cast<int>(cinfo.output_height);
    if (allocate_rgb(r, w, h)) {
      uint8_t* base = r.image.rgb.data();
      // CMYK rows need 4 bytes per pixel: a row from libjpeg's own pool,
      // which jpeg_destroy_decompress frees on every path (longjmp included).
      JSAMPARRAY cmyk_row = components == 4
                                ? (*cinfo.mem->alloc_sarray)(reinterpret_cast<j_common_ptr>(&cinfo), JPOOL_IMAGE,
                                                             static_cast<JDIMENSION>(w) * 4, 1)
                                : nullptr;
      while (cinfo.output_scanline < cinfo.output_height) {
        uint8_t* row = base + static_cast<size_t>(cinfo.output_scanline) * w * 3;
        JSAMPROW rows[1] = {components == 4 ? cmyk_row[0] : row};
        // Grayscale rows are decoded into the row's first third and then
        // spread out in place (back to front so nothing is overwritten early).
        if (jpeg_read_scanlines(&cinfo, rows, 1) != 1) break;
        if (components == 1) {
          for (int x = w - 1; x >= 0; --x) row[x * 3] = row[x * 3 + 1] = row[x * 3 + 2] = row[x];
        } else if (components == 4) {
          cmyk_row_to_rgb(cmyk_row[0], row, w);
        }
      }
      if (cinfo.output_scanline < cinfo.output_height) set_error(r, "truncated JPEG data");
      else jpeg_finish_decompress(&cinfo);
    }
  }
  jpeg_destroy_decompress(&cinfo);
}

// ----------------------------------------------------------------- PNG ----

struct PngSource {
  const uint8_t* data;
  size_t size;
  size_t pos;
  char message[JMSG_LENGTH_MAX];
};

void png_read_from_memory(png_structp png, png_bytep out, png_size_t n) {
  auto* src = static_cast<PngSource*>(png_get_io_ptr(png));
  if (n > src->size - src->pos) png_error(png, "truncated PNG data");
  std::memcpy(out, src->data + src->pos, n);
  src->pos += n;
}

[[noreturn]] void png_on_error(png_structp png, png_const_charp msg) {
  auto* src = static_cast<PngSource*>(png_get_error_ptr(png));
  std::snprintf(src->message, sizeof(src->message), "%s", msg);
  std::longjmp(png_jmpbuf(png), 1);
}

void png_on_warning(png_structp, png_const_charp) {}

// Converts one decoded row (after libpng's 8-bit expansion of low bit depths
// and palettes, but with 16-bit samples kept) to RGB8 the way PIL would.
void png_row_to_rgb(const uint8_t* in, uint8_t* out, int w, int channels, bool sixteen,
                    bool gray16_clamp) {
  const int bps = sixteen ? 2 : 1;
  for (int x = 0; x < w; ++x) {
    const uint8_t* px = in + static_cast<size_t>(x) * channels * bps;
    uint8_t rgb[3];
    if (gray16_clamp) {
      // PIL opens 16-bit grayscale as mode I;16 and its I;16 -> RGB/L
      // conversion clamps the 16-bit value to 255 instead of rescaling.
      const unsigned v = (unsigned{px[0]} << 8) | px[1];
      rgb[0] = rgb[1] = rgb[2] = static_cast<uint8_t>(v > 255 ? 255 : v);
    } else if (channels <= 2) {
      // Big-endian samples: the high byte is the first one. PIL's ";16B"
      // unpackers keep just that byte (truncation, not rounding).
      rgb[0] = rgb[1] = rgb[2] = px[0];
    } else {
      rgb[0] = px[0];
      rgb[1] = px[bps];
      rgb[2] = px[2 * bps];
    }
    std::memcpy(out + static_cast<size_t>(x) * 3, rgb, 3);
  }
}

void decode_png(const uint8_t* data, size_t size, DecodeResult& r) {
  PngSource src{data, size, 0, {}};
  png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &src, png_on_error, png_on_warning);
  if (!png) {
    set_error(r, "cannot initialise libpng");
    return;
  }
  png_infop info = png_create_info_struct(png);
  // Raw row buffer: a raw pointer so that nothing with a destructor is
  // skipped by longjmp; volatile because it changes after setjmp and is read
  // after a longjmp. Freed on both paths.
  uint8_t* volatile rows = nullptr;
  if (!info || setjmp(png_jmpbuf(png))) {
    std::free(rows);
    png_destroy_read_struct(&png, info ? &info : nullptr, nullptr);
    set_error(r, src.message[0] ? src.message : "cannot initialise libpng");
    return;
  }
  png_set_read_fn(png, &src, png_read_from_memory);
  // libpng buffers a text/ICC/palette-suggestion/EXIF chunk whole, trusting
  // its length field (Debian's build sets no cap), so a 200-byte file could
  // ask for gigabytes. None of them changes the RGB pixels convert('RGB')
  // gives, so skip them unread; image data (IDAT) is streamed anyway.
  static const png_byte kSkipped[] = "iCCP\0iTXt\0tEXt\0zTXt\0sPLT\0eXIf";
  png_set_keep_unknown_chunks(png, PNG_HANDLE_CHUNK_NEVER, kSkipped, 6);
  png_read_info(png, info);
  // PIL verifies the header chunks' CRCs but not IDAT's; ignore CRC errors in
  // the image data (the critical chunks still to come) to accept the same files.
  png_set_crc_action(png, PNG_CRC_QUIET_USE, PNG_CRC_DEFAULT);
  const png_uint_32 w = png_get_image_width(png, info), h = png_get_image_height(png, info);
  const int color_type = png_get_color_type(png, info);
  const int bit_depth = png_get_bit_depth(png, info);
  // Deflate expands at most 1032:1, and the filtered rows hold at least w*h*bits bits.
  const uint64_t raw_bytes = (uint64_t{w} * png_get_channels(png, info) * bit_depth + 7) / 8 * h;
  if (dimensions_ok(r, w, h) && data_ok(r, "PNG", raw_bytes / 1032, size - src.pos)) {
    // Palette -> RGB and 1/2/4-bit gray -> 8-bit (scaled like PIL's L;2/L;4
    // unpackers: x*85, x*17). Alpha/tRNS is dropped later, as convert('RGB').
    if (color_type == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
    if (color_type == PNG_COLOR_TYPE_GRAY && bit_depth < 8) png_set_expand_gray_1_2_4_to_8(png);
    const int passes = png_set_interlace_handling(png);
    png_read_update_info(png, info);
    const int channels = png_get_channels(png, info);
    const bool sixteen = png_get_bit_depth(png, info) == 16;
    const bool gray16 = sixteen && color_type == PNG_COLOR_TYPE_GRAY;
    const size_t rowbytes = png_get_rowbytes(png, info);
    if (allocate_rgb(r, static_cast<int>(w), static_cast<int>(h))) {
      // Interlaced images need the whole raw image across passes; others are
      // converted row by row to keep peak memory at one row.
      const size_t raw_rows = passes > 1 ? h : 1;
      uint8_t* const buffer = static_cast<uint8_t*>(std::malloc(rowbytes * raw_rows));
      rows = buffer;
      if (!buffer) {
        set_error(r, "out of memory for decoded image");
      } else {
        for (int pass = 0; pass < passes; ++pass) {
          for (png_uint_32 y = 0; y < h; ++y) {
            uint8_t* raw = buffer + (passes > 1 ? rowbytes * y : 0);
            png_read_row(png, raw, nullptr);
            if (passes == 1)
              png_row_to_rgb(raw, &r.image.rgb[static_cast<size_t>(y) * w * 3], w, channels,
                             sixteen, gray16);
          }
        }
        if (passes > 1) {
          for (png_uint_32 y = 0; y < h; ++y)
            png_row_to_rgb(buffer + rowbytes * y, &r.image.rgb[static_cast<size_t>(y) * w * 3], w,
                           channels, sixteen, gray16);
        }
        // Trailing chunks (and IEND) are not read: PIL tolerates a file that
        // ends right after the image data, and so do we.
      }
    }
  }
  std::free(rows);
  png_destroy_read_struct(&png, &info, nullptr);
}

constexpr uint8_t kPngMagic[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};

}  // namespace

ImageU8 decode_image_bytes(const uint8_t* data, size_t size, const std::string& name_for_errors) {
  if (size == 0) fail_input(name_for_errors, ": empty file, not a JPEG or PNG image");
  DecodeResult r;
  if (size >= 3 && data[0] == 0xFF && data[1] == 0xD8 && data[2] == 0xFF) {
    decode_jpeg(data, size, r);
    if (r.error[0]) fail_input(name_for_errors, ": ", r.error);
  } else if (size >= 8 && std::memcmp(data, kPngMagic, 8) == 0) {
    decode_png(data, size, r);
    if (r.error[0]) fail_input(name_for_errors, ": ", r.error);
  } else if (size < 8 && std::memcmp(data, kPngMagic, size) == 0) {
    fail_input(name_for_errors, ": truncated PNG data");
  } else if (size < 3 && data[0] == 0xFF && (size == 1 || data[1] == 0xD8)) {
    fail_input(name_for_errors, ": truncated JPEG data");
  } else {
    fail_input(name_for_errors, ": not a JPEG or PNG image");
  }
  return std::move(r.image);
}

ImageU8 decode_image(const std::filesystem::path& path) {
  const Blob blob = map_file(path);
  return decode_image_bytes(blob.data, blob.size, path.string());
}

}  // namespace kiln
