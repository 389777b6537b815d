// kiln public C++ API. Self-contained: standard headers only, no CUDA.
//
//   auto engine = kiln::Engine::load("resnet50.bundle");
//   auto ctx = engine->create_context();
//   auto outputs = ctx->run({{"pixel_values", {1, 3, 224, 224}, pixels}});
//
//   // Into the caller's buffers, on the caller's stream (device pointers with a CUDA engine):
//   ctx->run({{"pixel_values", kiln::DType::F32, {1, 3, 224, 224}, d_pixels, kiln::MemoryKind::Device}},
//            {{"logits", kiln::DType::F32, {1, 1000}, d_logits, kiln::MemoryKind::Device, 1000 * 4}}, stream);
//
//   kiln::Classifier clf(engine);
//   auto result = clf.classify_file("cat.jpg", 5);
//
//   kiln::Detector det(kiln::Engine::load("rtdetr.bundle"));
//   for (const auto& d : det.detect_file("street.jpg", 0.5f).boxes) ...
#pragma once
#include <cstddef>
#include <cstdint>
#include <iosfwd>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace kiln {

// Exit codes of the CLI follow ErrorKind (1 usage, 2 input, 3 runtime).
enum class ErrorKind { Usage = 1, Input = 2, Runtime = 3 };

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& msg) : std::runtime_error(msg), kind_(kind) {}
  ErrorKind kind() const { return kind_; }
  int exit_code() const { return static_cast<int>(kind_); }

 private:
  ErrorKind kind_;
};

const char* version();

// Element types. The numbers are stable (tables index by them): new dtypes go at the end.
enum class DType : uint8_t { F32, F16, BF16, F8E4M3, F8E5M2, I32, I64, U8, I8 };

// Where a buffer lives: host memory, or memory of the device the engine runs on.
enum class MemoryKind { Host, Device };

// A caller's input buffer, dense row-major (NCHW for images). `bytes` is what
// may be read at `data`; 0 leaves it to dtype x shape. Accepted: f32 (host, or
// device for a CUDA engine) and f16/bf16 host buffers, converted to f32 on the host.
struct TensorView {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  const void* data = nullptr;
  MemoryKind where = MemoryKind::Host;
  size_t bytes = 0;
};

// A caller's output buffer: the engine's output shape for this batch
// (Engine::outputs(batch)), f32, `capacity` bytes writable at `data`.
struct MutableTensorView {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  void* data = nullptr;
  MemoryKind where = MemoryKind::Host;
  size_t capacity = 0;
};

// Engine inputs and outputs are f32 by contract (the engine casts internally).
struct Tensor {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> data;
};

struct TensorInfo {
  std::string name;
  std::vector<int64_t> shape;  // as built; the batch dimension (0) may differ at run time
  std::string dtype;           // storage inside the engine: "f32", "f16", "bf16"
};

struct MemoryReport {
  size_t arena_bytes = 0;  // activation memory actually reserved (planned reuse)
  size_t naive_bytes = 0;  // sum of all activation sizes without reuse
  int views = 0;           // channel views in use: slices read in place + concat inputs written in place
};

struct LoadOptions {
  std::string backend;           // "" = the bundle's backend; "cpu" runs a CUDA bundle on the CPU
  std::ostream* log = nullptr;   // notices (e.g. tactics re-selected for another GPU)
};

class ExecutionContext;

// Immutable after load; share one Engine between threads, give each thread
// its own ExecutionContext.
class Engine : public std::enable_shared_from_this<Engine> {
 public:
  static std::shared_ptr<const Engine> load(const std::string& bundle_path, const LoadOptions& options = {});
  // A bundle already in memory (copied; `name` stands for the path in messages).
  static std::shared_ptr<const Engine> load_from_memory(const void* data, size_t size, const LoadOptions& options = {},
                                                        const std::string& name = "<memory>");
  ~Engine();

  const std::string& family() const;
  const std::string& task() const;
  const std::string& backend() const;
  const std::string& precision() const;
  std::vector<TensorInfo> inputs() const;
  std::vector<TensorInfo> outputs() const;
  // The outputs' shapes when every input has batch `batch` (dimension 0);
  // Error(Input) for a batch outside 1..max_batch().
  std::vector<TensorInfo> outputs(int64_t batch) const;
  const std::vector<std::string>& labels() const;
  std::string runtime_json() const;  // the bundle's runtime.json, validated at load
  size_t node_count() const;
  int64_t max_batch() const;  // largest batch run() accepts (kiln build --max-batch)
  std::unique_ptr<ExecutionContext> create_context() const;

  struct Impl;
  const Impl& impl() const { return *impl_; }

 private:
  explicit Engine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

class ExecutionContext {
 public:
  ~ExecutionContext();
  // Inputs by name; every engine input must be given once, with the built
  // shape except for the batch dimension. Throws Error(Input) naming the
  // tensor on a wrong name, shape or size.
  std::vector<Tensor> run(const std::vector<Tensor>& inputs);
  // The same into the caller's buffers: every input and every output once, by
  // name. Each view is checked (name, dtype, shape, byte size, host/device)
  // before any is read or written; Error(Input) names the tensor (a NULL or
  // too small buffer: Error(Usage)).
  //
  // CPU engines run synchronously and take host memory only; `stream` is
  // ignored. CUDA engines enqueue on `stream` (a cudaStream_t; nullptr: the
  // context's own stream, and the call waits for its work). With a caller
  // stream and device buffers only, the call never waits for that stream:
  // the outputs are ready when the stream passes the work, and the input
  // buffers must stay unchanged until then (the first call at a batch size
  // does wait for its own warm-up and CUDA-graph capture, made on the
  // context's stream beforehand). When any buffer is host memory the call
  // returns once the outputs are written. The context's buffers are reused
  // by its next call, which is ordered after this one (on any stream);
  // destroying the context waits for its last call.
  void run(const std::vector<TensorView>& inputs, const std::vector<MutableTensorView>& outputs, void* stream = nullptr);
  // Memory of the plan for the last batch size run (or the built one).
  MemoryReport memory() const;

  struct Impl;
  Impl& impl() { return *impl_; }

 private:
  friend class Engine;
  explicit ExecutionContext(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

struct Prediction {
  int class_id = 0;
  std::string label;
  float score = 0.f;  // softmax probability
};

struct Classification {
  std::vector<float> logits;
  std::vector<Prediction> top_k;
};

// One image of a batch in which a bad file does not sink the others: either
// a result or the input error that stopped this image (its message names the
// file, e.g. "a.jpg: truncated JPEG data").
struct ClassificationOutcome {
  std::string path;
  bool ok = false;
  Classification result;  // when ok
  std::string error;      // when !ok
};

// Wall time of each stage of the last classify_* call, summed over its
// images (kiln bench's task breakdown). decode_ms is 0 for classify_rgb and
// classify_preprocessed; preprocess_ms covers resize, crop and normalize
// (on engines that pre-process on the GPU: planning on the host plus the
// device time of the pre-processing kernels). copy_ms, on engines that
// pre-process on the GPU: the device time of the upload of the decoded
// images (from the first byte queued to the last byte up, the host's copy
// into pinned memory included; the kernels of earlier images of a batch
// overlap it) and of the copy out of logits and picks when softmax and top-k
// ran on the GPU; 0 otherwise (engine_ms then holds the copies). engine_ms
// leaves both out.
struct TaskTimings {
  double decode_ms = 0, preprocess_ms = 0, copy_ms = 0, engine_ms = 0, postprocess_ms = 0;
};

// A decoded image and its pre-processing plan (Classifier::prepare_file).
struct PreparedImage;
struct ImageU8;

// Pre-processing (decode, resize, crop, normalize) exactly as the reference
// library does it, from the bundle's runtime.json; post-processing: softmax
// and top-k with labels.
class Classifier {
 public:
  explicit Classifier(std::shared_ptr<const Engine> engine);
  ~Classifier();
  Classification classify_file(const std::string& image_path, int top_k = 5);
  // Batched: one engine call for all images; the first unreadable image
  // throws (Error kind Input) and no result is returned.
  std::vector<Classification> classify_files(const std::vector<std::string>& image_paths, int top_k = 5);
  // Batched, per image: every file is decoded and pre-processed first, then
  // one engine call runs the ones that succeeded; outcomes keep input order.
  // Only input errors of single images are caught; engine errors still throw.
  std::vector<ClassificationOutcome> try_classify_files(const std::vector<std::string>& image_paths, int top_k = 5);
  // The two halves, for callers that decode ahead on other threads:
  // preprocess_file is const and safe to call concurrently (it reads only
  // the pre-processing constants); classify_preprocessed runs `images`
  // CHW float images laid end to end in one engine call.
  std::vector<float> preprocess_file(const std::string& image_path) const;
  std::vector<Classification> classify_preprocessed(std::vector<float> pixels, int64_t images, int top_k = 5);
  // The same halves where the engine pre-processes on its device (CUDA
  // bundles: the decoded bytes go up, PIL-exact resize, crop and normalize
  // run on the GPU, bit for bit the CPU's): prepare_file decodes and plans
  // (on CPU engines it also pre-processes), const and safe to call
  // concurrently; classify_prepared runs the images in one engine call.
  std::shared_ptr<PreparedImage> prepare_file(const std::string& image_path) const;
  std::vector<Classification> classify_prepared(const std::vector<std::shared_ptr<PreparedImage>>& images, int top_k = 5);
  // Whether this classifier pre-processes on the engine's device.
  bool preprocesses_on_device() const;
  // 8-bit RGB, row-major HWC.
  Classification classify_rgb(int width, int height, const uint8_t* rgb, int top_k = 5);
  const Engine& engine() const { return *engine_; }
  const TaskTimings& last_timings() const;

 private:
  struct Impl;
  std::vector<Classification> run_batch(std::vector<float> pixels, int64_t images, int top_k);
  std::vector<Classification> postprocess_all(const std::vector<Tensor>& outputs, int64_t images, int top_k);
  std::vector<Classification> run_prepared(const std::vector<const PreparedImage*>& images, int top_k, TaskTimings t);
  std::shared_ptr<PreparedImage> prepare(ImageU8&& img, TaskTimings& t) const;
  std::vector<float> timed_preprocess(const std::string& path, TaskTimings& t) const;
  std::shared_ptr<const Engine> engine_;
  std::unique_ptr<Impl> impl_;
};

// ------------------------------------------------------------ detection --

// One detected object, in pixels of the original image (x right, y down; not
// clipped to the image, as transformers leaves them).
struct Detection {
  float x_min = 0, y_min = 0, x_max = 0, y_max = 0;
  float score = 0;  // sigmoid of the class logit
  int class_id = 0;
  std::string label;  // the bundle's label of class_id, or the id as text
};

// One image's detections, sorted by score (highest first).
struct Detections {
  int image_width = 0, image_height = 0;  // the original image
  std::vector<Detection> boxes;
};

struct DetectionOutcome {
  std::string path;
  bool ok = false;
  Detections result;  // when ok
  std::string error;  // when !ok (names the file)
};

// An image after pre-processing, with the size of the image it came from
// (post-processing scales the boxes back to it).
struct DetectionInput {
  std::vector<float> pixels;  // CHW float32, 3 x input height x input width
  int image_width = 0, image_height = 0;
};

// Object detection bundles (task "detection", e.g. RT-DETR v2). Pre-processing
// from runtime.json: resize to the engine's height x width with PIL-exact
// resampling (aspect not kept, no crop), x rescale (1/255), no mean/std.
// Post-processing as transformers' post_process_object_detection: sigmoid of
// the logits, top num_queries over queries x classes (ties: lower flat index
// first), class = index % classes, box = that query's (cx, cy, w, h) turned
// into corners and scaled to the original image, kept when score > threshold.
class Detector {
 public:
  explicit Detector(std::shared_ptr<const Engine> engine);
  ~Detector();
  Detections detect_file(const std::string& image_path, float score_threshold = 0.3f);
  // Batched: one engine call for all images; the first unreadable image
  // throws (Error kind Input) and no result is returned.
  std::vector<Detections> detect_files(const std::vector<std::string>& image_paths, float score_threshold = 0.3f);
  // Batched, per image (as Classifier::try_classify_files): bad files become
  // outcomes with an error, the others run in one engine call.
  std::vector<DetectionOutcome> try_detect_files(const std::vector<std::string>& image_paths,
                                                 float score_threshold = 0.3f);
  // 8-bit RGB, row-major HWC.
  Detections detect(int width, int height, const uint8_t* rgb, float score_threshold = 0.3f);
  // The two halves: preprocess_file is const and safe to call concurrently;
  // detect_preprocessed runs the images in one engine call.
  DetectionInput preprocess_file(const std::string& image_path) const;
  std::vector<Detections> detect_preprocessed(const std::vector<DetectionInput>& images, float score_threshold = 0.3f);
  const Engine& engine() const { return *engine_; }
  int num_classes() const;
  const TaskTimings& last_timings() const;

 private:
  struct Impl;
  std::vector<Detections> run_batch(const std::vector<DetectionInput>& images, float score_threshold);
  std::shared_ptr<const Engine> engine_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln
