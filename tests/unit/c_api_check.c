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

/* The N-in/N-out call from C on the two-input, two-output test engine
 * (tests/unit/engine_test_util.hpp: inputs a, b [n,24,3,3]; outputs sum
 * [n,24,3,3], logits [n,10]). Checks the queries, runs with the outputs
 * listed in the other order, then checks that a too small output is refused
 * with nothing written. Returns 0 on success, otherwise a step number. */
int kiln_c_run_n(const char* bundle, const float* a, const float* b, int64_t n, float* sum, size_t sum_capacity,
                 float* logits, size_t logits_capacity) {
  kiln_engine* e = NULL;
  kiln_context* c = NULL;
  const char* name = NULL;
  int64_t dims[8], in_shape[4], sum_shape[8], logits_shape[8];
  int rank = 0, sum_rank = 0, logits_rank = 0, step = 0, i;
  kiln_dtype dt = KILN_DTYPE_I8;
  kiln_tensor in[2], out[2];
  float canary = -7.f;
  if (kiln_engine_load(bundle, NULL, &e) != KILN_OK) return 1;
  if (kiln_engine_num_inputs(e) != 2 || kiln_engine_num_outputs(e) != 2 || kiln_engine_max_batch(e) != 4) step = 2;
  else if (kiln_engine_input(e, 1, &name, dims, &rank) != KILN_OK || rank != 4 || strcmp(name, "b") != 0) step = 3;
  else if (kiln_engine_input_dtype(e, 0, &dt) != KILN_OK || dt != KILN_DTYPE_F32) step = 4;
  else if (kiln_engine_output_dtype(e, 1, &dt) != KILN_OK || dt != KILN_DTYPE_F32) step = 5;
  else if (kiln_engine_output_shape(e, 0, n, sum_shape, &sum_rank) != KILN_OK || sum_rank != 4 || sum_shape[0] != n) step = 6;
  else if (kiln_engine_output_shape(e, 1, n, logits_shape, &logits_rank) != KILN_OK || logits_rank != 2 ||
           logits_shape[0] != n || logits_shape[1] != 10)
    step = 7;
  else if (kiln_engine_output_shape(e, 1, 5, logits_shape, &logits_rank) != KILN_ERROR_INPUT) step = 8;
  else if (kiln_context_create(e, &c) != KILN_OK) step = 9;
  if (step) {
    kiln_engine_free(e);
    return step;
  }
  in_shape[0] = n;
  in_shape[1] = 24;
  in_shape[2] = 3;
  in_shape[3] = 3;
  in[0].name = "b";
  in[1].name = "a";
  in[0].data = (void*)b;
  in[1].data = (void*)a;
  for (i = 0; i < 2; ++i) {
    in[i].dtype = KILN_DTYPE_F32;
    in[i].rank = 4;
    in[i].shape = in_shape;
    in[i].capacity = (size_t)n * 24 * 3 * 3 * sizeof(float);
    in[i].memory = KILN_MEMORY_HOST;
  }
  out[0].name = "logits";
  out[0].rank = logits_rank;
  out[0].shape = logits_shape;
  out[0].data = logits;
  out[0].capacity = logits_capacity;
  out[1].name = "sum";
  out[1].rank = sum_rank;
  out[1].shape = sum_shape;
  out[1].data = sum;
  out[1].capacity = sum_capacity;
  for (i = 0; i < 2; ++i) {
    out[i].dtype = KILN_DTYPE_F32;
    out[i].memory = KILN_MEMORY_HOST;
  }
  if (kiln_context_run_n(c, in, 2, out, 2, NULL) != KILN_OK) step = 10;
  /* One byte short of logits: refused by name, nothing written. */
  out[0].capacity = (size_t)n * 10 * sizeof(float) - 1;
  out[0].data = &canary;
  if (!step && (kiln_context_run_n(c, in, 2, out, 2, NULL) != KILN_ERROR_USAGE || canary != -7.f ||
                strstr(kiln_last_error(), "'logits'") == NULL))
    step = 11;
  kiln_context_free(c);
  kiln_engine_free(e);
  return step;
}

/* Loads a detection bundle and detects objects in `image` from C. Returns 0
 * on success, otherwise a step number; the first label is copied to label0. */
int kiln_c_detect(const char* bundle, const char* image, float threshold, kiln_detection* out, int capacity,
                  int* count, char* label0, size_t label0_size) {
  kiln_engine* e = NULL;
  const char* label = NULL;
  int i;
  if (kiln_engine_load(bundle, NULL, &e) != KILN_OK) return 1;
  if (kiln_detect_file(e, image, threshold, out, capacity, count) != KILN_OK) {
    kiln_engine_free(e);
    return 2;
  }
  for (i = 1; i < *count; ++i)
    if (out[i - 1].score < out[i].score) return 3;
  if (*count > 0) {
    if (kiln_engine_label(e, out[0].class_id, &label) != KILN_OK) return 4;
    snprintf(label0, label0_size, "%s", label);
  }
  kiln_engine_free(e);
  return 0;
}
