/* kiln C ABI: load a bundle, run it, classify images, detect objects. Plain C, no CUDA headers.
 *
 *   kiln_engine* e = NULL;
 *   if (kiln_engine_load("model.bundle", NULL, &e) != KILN_OK) fprintf(stderr, "%s\n", kiln_last_error());
 *   int ids[5]; float scores[5]; int n = 0;
 *   kiln_classify_file(e, "cat.jpg", 5, ids, scores, &n);
 *   kiln_detection boxes[300]; int found = 0;     (a detection bundle)
 *   kiln_detect_file(e, "street.jpg", 0.5f, boxes, 300, &found);
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

/* Element types; the numbers are those of kiln::DType (kiln.hpp). */
typedef enum {
  KILN_DTYPE_F32 = 0,
  KILN_DTYPE_F16 = 1,
  KILN_DTYPE_BF16 = 2,
  KILN_DTYPE_F8E4M3 = 3,
  KILN_DTYPE_F8E5M2 = 4,
  KILN_DTYPE_I32 = 5,
  KILN_DTYPE_I64 = 6,
  KILN_DTYPE_U8 = 7,
  KILN_DTYPE_I8 = 8
} kiln_dtype;

/* Where a buffer lives: host memory or memory of the GPU the engine runs on. */
typedef enum { KILN_MEMORY_HOST = 0, KILN_MEMORY_DEVICE = 1 } kiln_memory;

/* A caller's buffer for kiln_context_run_n: dense row-major (NCHW images),
 * `capacity` bytes at `data`. Inputs are only read (cast a const pointer);
 * outputs are written. */
typedef struct {
  const char* name;
  kiln_dtype dtype;
  int rank;             /* 1..8 */
  const int64_t* shape; /* rank dimensions */
  void* data;
  size_t capacity; /* bytes */
  kiln_memory memory;
} kiln_tensor;

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
/* The type an input/output is stored in inside the engine (f32, f16, bf16).
 * Runs take and give f32 whatever it is (kiln_context_run_n below). */
kiln_status kiln_engine_input_dtype(const kiln_engine* engine, int index, kiln_dtype* dtype);
kiln_status kiln_engine_output_dtype(const kiln_engine* engine, int index, kiln_dtype* dtype);
/* Output `index`'s shape when every input has batch `batch` (1..kiln_engine_max_batch). */
kiln_status kiln_engine_output_shape(const kiln_engine* engine, int index, int64_t batch, int64_t* dims, int* rank);
/* Largest batch a run accepts (0 for NULL). */
int64_t kiln_engine_max_batch(const kiln_engine* engine);

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

/* Runs an engine on N named inputs into N named outputs: every engine input
 * and output exactly once, in any order. Inputs: f32, or f16/bf16 host memory
 * (converted); outputs: f32, shaped as kiln_engine_output_shape says for the
 * inputs' batch. Every tensor is checked (name, dtype, rank 1..8, shape,
 * capacity, host/device memory) before any buffer is read or written; a
 * failure writes nothing and the message names the tensor: KILN_ERROR_INPUT
 * for a wrong name, dtype, shape or memory kind, KILN_ERROR_USAGE for NULL
 * pointers, a rank outside 1..8 or a capacity below what the shape needs.
 *
 * CPU engines take host memory only and run synchronously (`stream` is
 * ignored). CUDA engines enqueue on `stream` (a cudaStream_t; NULL: the
 * context's own, and the call waits). With a caller's stream and device
 * memory only, the call never waits for that stream: outputs are ready, and
 * inputs may be changed, when the stream passes the work (the first call at
 * a batch size waits for its own CUDA-graph capture on the context's
 * stream). With any host buffer the
 * call returns when the outputs are written. A context's next call (on any
 * stream) is ordered after its previous one; kiln_context_free waits for it. */
kiln_status kiln_context_run_n(kiln_context* context, const kiln_tensor* inputs, size_t n_inputs,
                               const kiln_tensor* outputs, size_t n_outputs, void* stream);

/* Classification bundles: top-k of one image file (JPEG/PNG), scores are
 * softmax probabilities; *count receives min(top_k, classes). The engine
 * keeps one execution context for these calls (made at the first one), so
 * concurrent calls on one engine run one after another. */
kiln_status kiln_classify_file(const kiln_engine* engine, const char* image_path, int top_k, int* class_ids,
                               float* scores, int* count);

/* Number of labels in the bundle's labels.json (0 when it has none), and the
 * label of class `class_id` (valid while the engine lives). */
int kiln_engine_num_labels(const kiln_engine* engine);
kiln_status kiln_engine_label(const kiln_engine* engine, int class_id, const char** label);

/* One detected object, in pixels of the original image (not clipped). */
typedef struct {
  float x_min, y_min, x_max, y_max;
  float score; /* sigmoid of the class logit */
  int class_id;
} kiln_detection;

/* Detection bundles: the objects of one image file (JPEG/PNG) scoring above
 * score_threshold (strictly), sorted by score, highest first; pre- and post-
 * processing as kiln::Detector (RT-DETR's). `detections` has room for
 * `capacity` entries; *count receives how many were found. When they do not
 * fit, KILN_ERROR_USAGE, *count says how many there are and nothing is
 * written: a capacity of num_queries (dimension 1 of the logits output,
 * kiln_engine_output) always suffices. A classification bundle is
 * KILN_ERROR_INPUT. One detector per engine (made at the first call) serves
 * these calls; concurrent calls on one engine run one after another. */
kiln_status kiln_detect_file(const kiln_engine* engine, const char* image_path, float score_threshold,
                             kiln_detection* detections, int capacity, int* count);

#ifdef __cplusplus
}
#endif

#endif /* KILN_KILN_H */
