/* Compiled as C: proves include/kiln/kiln.h is a C header and exercises the ABI from C. */
#include <stdio.h>
#include <string.h>

#include "kiln/kiln.h"

/* Loads `bundle`, checks its input metadata, runs it on a constant image
 * through kiln_context_run and classifies `image`. Returns 0 on success,
 * otherwise a step number; *top1 receives the image's class. */
int kiln_c_smoke(const char* bundle, const char* image, int* top1, float* logits, size_t logits_capacity,
                 size_t* logits_count) {
  kiln_engine* e = NULL;
  kiln_context* c = NULL;
  const char* name = NULL;
  int64_t dims[8];
  int rank = 0, ids[3], n = 0;
  float scores[3], pixels[3 * 32 * 32];
  size_t i;
  if (kiln_engine_load(bundle, NULL, &e) != KILN_OK) return 1;
  if (kiln_engine_num_inputs(e) != 1 || kiln_engine_num_outputs(e) != 1) return 2;
  if (kiln_engine_input(e, 0, &name, dims, &rank) != KILN_OK || rank != 4 || strcmp(name, "pixel_values") != 0) return 3;
  if (kiln_context_create(e, &c) != KILN_OK) return 4;
  for (i = 0; i < sizeof(pixels) / sizeof(pixels[0]); ++i) pixels[i] = 0.25f;
  dims[0] = 1;
  if (kiln_context_run(c, "pixel_values", pixels, dims, 4, logits, logits_capacity, logits_count) != KILN_OK) return 5;
  if (kiln_classify_file(e, image, 3, ids, scores, &n) != KILN_OK || n != 3) return 6;
  if (!(scores[0] >= scores[1] && scores[1] >= scores[2])) return 7;
  *top1 = ids[0];
  kiln_context_free(c);
  kiln_engine_free(e);
  return 0;
}
