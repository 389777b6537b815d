/* kiln C ABI: load a bundle, run it, classify images. Plain C, no CUDA headers.
 *
 *   kiln_engine* e = NULL;
 *   if (kiln_engine_load("model.bundle", NULL, &e) != KILN_OK) fprintf(stderr, "%s\n", kiln_last_error());
 *   int ids[5]; float scores[5]; int n = 0;
 *   kiln_classify_file(e, "cat.jpg", 5, ids, scores, &n);
 *   kiln_engine_free(e);
 *
 * Every call returns a kiln_status; on failure kiln_last_error() gives the
 * message (per thread, valid until the thread's next failing call). Engines
 * are shareable between threads; contexts belong to one thread at a time.
 */
#ifndef KILN_KILN_H
#define KILN_KILN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { KILN_OK = 0, KILN_ERROR_USAGE = 1, KILN_ERROR_INPUT = 2, KILN_ERROR_RUNTIME = 3 } kiln_status;

typedef struct kiln_engine kiln_engine;
typedef struct kiln_context kiln_context;

const char* kiln_version(void);
const char* kiln_last_error(void);

/* backend: NULL or "" = the bundle's own; "cpu" runs a CUDA bundle on the CPU. */
kiln_status kiln_engine_load(const char* bundle_path, const char* backend, kiln_engine** out);
void kiln_engine_free(kiln_engine* engine);
/* Engine inputs/outputs as built (dimension 0, the batch, may differ at run time). */
int kiln_engine_num_inputs(const kiln_engine* engine);
int kiln_engine_num_outputs(const kiln_engine* engine);
/* name: valid while the engine lives; dims: at least 8 entries; *rank receives the rank. */
kiln_status kiln_engine_input(const kiln_engine* engine, int index, const char** name, int64_t* dims, int* rank);
kiln_status kiln_engine_output(const kiln_engine* engine, int index, const char** name, int64_t* dims, int* rank);

kiln_status kiln_context_create(const kiln_engine* engine, kiln_context** out);
void kiln_context_free(kiln_context* context);
/* Runs an engine with one input (f32, shape[rank]) and copies output 0 into
 * `output` (f32, at most `capacity` values); *count receives its size. The
 * shape is checked against the engine (name, rank, dims, batch 1..max) before
 * `input` is read: KILN_ERROR_INPUT names the input otherwise. When `output`
 * is NULL or too small, KILN_ERROR_USAGE, *count says how many floats it
 * needs, and nothing is written to `output`. */
kiln_status kiln_context_run(kiln_context* context, const char* input_name, const float* input, const int64_t* shape,
                             int rank, float* output, size_t capacity, size_t* count);

/* Classification bundles: top-k of one image file (JPEG/PNG), scores are
 * softmax probabilities; *count receives min(top_k, classes). The engine
 * keeps one execution context for these calls (made at the first one), so
 * concurrent calls on one engine run one after another. */
kiln_status kiln_classify_file(const kiln_engine* engine, const char* image_path, int top_k, int* class_ids,
                               float* scores, int* count);

#ifdef __cplusplus
}
#endif

#endif /* KILN_KILN_H */
