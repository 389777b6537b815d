/* Writes 4-component JPEGs that Pillow cannot write: YCCK (Adobe transform 2)
 * and plain CMYK with chosen sampling. Built and run by
 * make_pil_decode_fixtures.py; the files it writes are then decoded by PIL
 * for the references, so this tool only has to make valid, varied files.
 *
 *   write_cmyk_jpeg IN.raw WIDTH HEIGHT OUT.jpg ycck|cmyk [progressive] [noadobe]
 *
 * IN.raw holds WIDTH*HEIGHT*4 bytes, C M Y K per pixel, passed to libjpeg
 * unchanged (libjpeg stores what it is given; the Adobe inversion convention
 * is a matter of how readers interpret the samples).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jpeglib.h>

int main(int argc, char** argv) {
  if (argc < 6) {
    fprintf(stderr, "usage: %s IN.raw W H OUT.jpg ycck|cmyk [progressive] [noadobe]\n", argv[0]);
    return 1;
  }
  const int w = atoi(argv[2]), h = atoi(argv[3]);
  int progressive = 0, noadobe = 0;
  for (int i = 6; i < argc; ++i) {
    if (strcmp(argv[i], "progressive") == 0) progressive = 1;
    if (strcmp(argv[i], "noadobe") == 0) noadobe = 1;
  }
  const size_t n = (size_t)w * h * 4;
  unsigned char* pixels = malloc(n);
  FILE* in = fopen(argv[1], "rb");
  if (!pixels || !in || fread(pixels, 1, n, in) != n) {
    fprintf(stderr, "%s: cannot read %zu bytes\n", argv[1], n);
    return 1;
  }
  fclose(in);
  FILE* out = fopen(argv[4], "wb");
  if (!out) {
    fprintf(stderr, "%s: cannot create\n", argv[4]);
    return 1;
  }
  struct jpeg_compress_struct cinfo;
  struct jpeg_error_mgr jerr;
  cinfo.err = jpeg_std_error(&jerr);
  jpeg_create_compress(&cinfo);
  jpeg_stdio_dest(&cinfo, out);
  cinfo.image_width = (JDIMENSION)w;
  cinfo.image_height = (JDIMENSION)h;
  cinfo.input_components = 4;
  cinfo.in_color_space = JCS_CMYK;
  jpeg_set_defaults(&cinfo);
  /* JCS_YCCK: libjpeg converts C, M, Y to YCbCr (K passes through) and
   * subsamples Cb/Cr 2x2; JCS_CMYK keeps all four at full resolution. Both
   * write an Adobe APP14 marker (transform 2 or 0) unless told not to. */
  jpeg_set_colorspace(&cinfo, strcmp(argv[5], "ycck") == 0 ? JCS_YCCK : JCS_CMYK);
  if (noadobe) cinfo.write_Adobe_marker = FALSE;
  jpeg_set_quality(&cinfo, 90, TRUE);
  if (progressive) jpeg_simple_progression(&cinfo);
  jpeg_start_compress(&cinfo, TRUE);
  while (cinfo.next_scanline < cinfo.image_height) {
    JSAMPROW row = pixels + (size_t)cinfo.next_scanline * w * 4;
    jpeg_write_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_compress(&cinfo);
  jpeg_destroy_compress(&cinfo);
  fclose(out);
  free(pixels);
  return 0;
}
