// The C ABI (include/kiln/kiln.h) over the C++ API: exceptions never cross it;
// each failure becomes a status plus a per-thread message.
#include <algorithm>
#include <cstring>
#include <type_traits>
#include <mutex>
#include <optional>
#include <string>

#include "core/dtype.hpp"
#include "kiln/kiln.h"
#include "kiln/kiln.hpp"

struct kiln_engine {
  std::shared_ptr<const kiln::Engine> engine;
  std::vector<kiln::TensorInfo> inputs, outputs;
  // One classifier (its context, arena and, on the GPU, captured graph) made
  // at the first kiln_classify_file and reused; the mutex serialises callers
  // since a context runs one call at a time.
  mutable std::mutex classify_mutex;
  mutable std::unique_ptr<kiln::Classifier> classifier;
  // The same for kiln_detect_file.
  mutable std::mutex detect_mutex;
  mutable std::unique_ptr<kiln::Detector> detector;
};
struct kiln_context {
  std::unique_ptr<kiln::ExecutionContext> ctx;
  std::vector<kiln::TensorInfo> inputs;  // to check a caller's shape before reading its buffer
  int64_t max_batch = 0;
};

namespace {

thread_local std::string g_last_error;

template <typename F>
kiln_status guarded(F&& f) {
  try {
    f();
    return KILN_OK;
  } catch (const kiln::Error& e) {
    g_last_error = e.what();
    return static_cast<kiln_status>(e.exit_code());
  } catch (const std::exception& e) {
    g_last_error = e.what();
    return KILN_ERROR_RUNTIME;
  }
}

kiln_status usage(const char* msg) {
  g_last_error = msg;
  return KILN_ERROR_USAGE;
}

kiln_status describe(const std::vector<kiln::TensorInfo>& list, int index, const char** name, int64_t* dims, int* rank) {
  if (index < 0 || index >= static_cast<int>(list.size())) return usage("tensor index out of range");
  const auto& t = list[static_cast<size_t>(index)];
  if (t.shape.size() > 8) return usage("tensor rank above 8");
  if (name) *name = t.name.c_str();
  if (dims)
    for (size_t i = 0; i < t.shape.size(); ++i) dims[i] = t.shape[i];
  if (rank) *rank = static_cast<int>(t.shape.size());
  return KILN_OK;
}

static_assert(KILN_DTYPE_F32 == static_cast<int>(kiln::DType::F32) && KILN_DTYPE_F16 == static_cast<int>(kiln::DType::F16) &&
                  KILN_DTYPE_BF16 == static_cast<int>(kiln::DType::BF16) &&
                  KILN_DTYPE_F8E4M3 == static_cast<int>(kiln::DType::F8E4M3) &&
                  KILN_DTYPE_F8E5M2 == static_cast<int>(kiln::DType::F8E5M2) &&
                  KILN_DTYPE_I32 == static_cast<int>(kiln::DType::I32) && KILN_DTYPE_I64 == static_cast<int>(kiln::DType::I64) &&
                  KILN_DTYPE_U8 == static_cast<int>(kiln::DType::U8) && KILN_DTYPE_I8 == static_cast<int>(kiln::DType::I8),
              "kiln_dtype numbers are kiln::DType's");

kiln_status storage_dtype(const std::vector<kiln::TensorInfo>& list, int index, kiln_dtype* dtype) {
  if (index < 0 || index >= static_cast<int>(list.size())) return usage("tensor index out of range");
  if (!dtype) return usage("dtype must not be NULL");
  const kiln::TensorInfo& t = list[static_cast<size_t>(index)];
  const std::optional<kiln::DType> d = kiln::dtype_from_name(t.dtype);
  if (!d) {
    g_last_error = "tensor '" + t.name + "' has dtype " + t.dtype + ", which the C ABI cannot name";
    return KILN_ERROR_RUNTIME;
  }
  *dtype = static_cast<kiln_dtype>(*d);
  return KILN_OK;
}

// The integer a C caller stored in an enum field. Read as bytes: a C caller
// may store any int there, and loading an out-of-range value as the C++ enum
// type is undefined behaviour (UBSan's -fsanitize=enum reports it).
template <typename E>
int raw_enum(const E& e) {
  std::underlying_type_t<E> v;
  std::memcpy(&v, &e, sizeof v);
  return static_cast<int>(v);
}

// One kiln_tensor as a C++ view (TensorView or MutableTensorView); throws
// Error(Usage) for what only a C caller can get wrong.
template <typename View>
View c_view(const kiln_tensor& t, const char* role, size_t index) {
  std::string problem;
  const int dtype = raw_enum(t.dtype), memory = raw_enum(t.memory);
  if (!t.name) problem = "has a NULL name";
  else if (t.rank < 1 || t.rank > 8) problem = "has rank " + std::to_string(t.rank) + ", outside 1..8";
  else if (!t.shape) problem = "has a NULL shape";
  else if (dtype < 0 || dtype > KILN_DTYPE_I8)
    problem = "has an unknown dtype code " + std::to_string(dtype);
  else if (memory != KILN_MEMORY_HOST && memory != KILN_MEMORY_DEVICE)
    problem = "has an unknown memory kind " + std::to_string(memory);
  else if (t.capacity == 0) problem = "has capacity 0 bytes";
  if (!problem.empty())
    throw kiln::Error(kiln::ErrorKind::Usage, "kiln_context_run_n: " + std::string(role) + " " +
                                                  (t.name ? "'" + std::string(t.name) + "'" : std::to_string(index)) + " " +
                                                  problem);
  return View{t.name, static_cast<kiln::DType>(dtype), std::vector<int64_t>(t.shape, t.shape + t.rank), t.data,
              memory == KILN_MEMORY_DEVICE ? kiln::MemoryKind::Device : kiln::MemoryKind::Host, t.capacity};
}

}  // namespace

extern "C" {

const char* kiln_version(void) { return kiln::version(); }
const char* kiln_last_error(void) { return g_last_error.c_str(); }

kiln_status kiln_engine_load(const char* path, const char* backend, kiln_engine** out) {
  if (!path || !out) return usage("kiln_engine_load: path and out must not be NULL");
  *out = nullptr;
  return guarded([&] {
    auto e = std::make_unique<kiln_engine>();
    e->engine = kiln::Engine::load(path, kiln::LoadOptions{backend ? backend : "", nullptr});
    e->inputs = e->engine->inputs();
    e->outputs = e->engine->outputs();
    *out = e.release();
  });
}

void kiln_engine_free(kiln_engine* engine) { delete engine; }
int kiln_engine_num_inputs(const kiln_engine* e) { return e ? static_cast<int>(e->inputs.size()) : 0; }
int kiln_engine_num_outputs(const kiln_engine* e) { return e ? static_cast<int>(e->outputs.size()) : 0; }

kiln_status kiln_engine_input(const kiln_engine* e, int index, const char** name, int64_t* dims, int* rank) {
  if (!e) return usage("kiln_engine_input: engine is NULL");
  return describe(e->inputs, index, name, dims, rank);
}
kiln_status kiln_engine_output(const kiln_engine* e, int index, const char** name, int64_t* dims, int* rank) {
  if (!e) return usage("kiln_engine_output: engine is NULL");
  return describe(e->outputs, index, name, dims, rank);
}

kiln_status kiln_engine_input_dtype(const kiln_engine* e, int index, kiln_dtype* dtype) {
  if (!e) return usage("kiln_engine_input_dtype: engine is NULL");
  return storage_dtype(e->inputs, index, dtype);
}
kiln_status kiln_engine_output_dtype(const kiln_engine* e, int index, kiln_dtype* dtype) {
  if (!e) return usage("kiln_engine_output_dtype: engine is NULL");
  return storage_dtype(e->outputs, index, dtype);
}

kiln_status kiln_engine_output_shape(const kiln_engine* e, int index, int64_t batch, int64_t* dims, int* rank) {
  if (!e || !dims || !rank) return usage("kiln_engine_output_shape: engine, dims and rank must not be NULL");
  if (index < 0 || index >= static_cast<int>(e->outputs.size())) return usage("tensor index out of range");
  std::vector<kiln::TensorInfo> at;
  const kiln_status s = guarded([&] { at = e->engine->outputs(batch); });
  return s == KILN_OK ? describe(at, index, nullptr, dims, rank) : s;
}

int64_t kiln_engine_max_batch(const kiln_engine* e) { return e ? e->engine->max_batch() : 0; }

kiln_status kiln_context_create(const kiln_engine* e, kiln_context** out) {
  if (!e || !out) return usage("kiln_context_create: engine and out must not be NULL");
  *out = nullptr;
  return guarded([&] { *out = new kiln_context{e->engine->create_context(), e->inputs, e->engine->max_batch()}; });
}

void kiln_context_free(kiln_context* c) { delete c; }

kiln_status kiln_context_run(kiln_context* c, const char* input_name, const float* input, const int64_t* shape, int rank,
                             float* output, size_t capacity, size_t* count) {
  if (!c || !input_name || !input || !shape || rank <= 0 || rank > 8 || !count)
    return usage("kiln_context_run: NULL argument or rank outside 1..8");
  return guarded([&] {
    kiln::Tensor t{input_name, std::vector<int64_t>(shape, shape + rank), {}};
    // The shape says how many floats to read from the caller's buffer: check it
    // against the engine before reading a byte (a hostile shape must not make
    // us read past the buffer or overflow the element count).
    auto it = std::find_if(c->inputs.begin(), c->inputs.end(), [&](const kiln::TensorInfo& i) { return i.name == t.name; });
    if (it == c->inputs.end()) throw kiln::Error(kiln::ErrorKind::Input, "input '" + t.name + "' is not an input of this engine");
    bool ok = t.shape.size() == it->shape.size() && t.shape[0] >= 1 && t.shape[0] <= c->max_batch;
    for (size_t d = 1; ok && d < t.shape.size(); ++d) ok = t.shape[d] == it->shape[d];
    if (!ok) {
      std::string want = "[1.." + std::to_string(c->max_batch);
      for (size_t d = 1; d < it->shape.size(); ++d) want += "," + std::to_string(it->shape[d]);
      std::string got = "[";
      for (size_t d = 0; d < t.shape.size(); ++d) got += (d ? "," : "") + std::to_string(t.shape[d]);
      throw kiln::Error(kiln::ErrorKind::Input, "input '" + t.name + "' has shape " + got + "], expected " + want + "]");
    }
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    t.data.assign(input, input + n);
    auto outs = c->ctx->run({t});
    const auto& o = outs.at(0);
    *count = o.data.size();
    if (!output || capacity < o.data.size())
      throw kiln::Error(kiln::ErrorKind::Usage, "output '" + o.name + "' needs " + std::to_string(o.data.size()) +
                                                    " floats, capacity is " + std::to_string(capacity));
    std::memcpy(output, o.data.data(), o.data.size() * sizeof(float));
  });
}

kiln_status kiln_context_run_n(kiln_context* c, const kiln_tensor* inputs, size_t n_inputs, const kiln_tensor* outputs,
                               size_t n_outputs, void* stream) {
  if (!c || (n_inputs && !inputs) || (n_outputs && !outputs))
    return usage("kiln_context_run_n: context, inputs and outputs must not be NULL");
  return guarded([&] {
    std::vector<kiln::TensorView> in;
    for (size_t i = 0; i < n_inputs; ++i) in.push_back(c_view<kiln::TensorView>(inputs[i], "input", i));
    std::vector<kiln::MutableTensorView> out;
    for (size_t i = 0; i < n_outputs; ++i) out.push_back(c_view<kiln::MutableTensorView>(outputs[i], "output", i));
    c->ctx->run(in, out, stream);
  });
}

kiln_status kiln_classify_file(const kiln_engine* e, const char* image_path, int top_k, int* class_ids, float* scores,
                               int* count) {
  if (!e || !image_path || top_k <= 0 || !class_ids || !scores || !count)
    return usage("kiln_classify_file: NULL argument or top_k <= 0");
  return guarded([&] {
    std::lock_guard<std::mutex> lock(e->classify_mutex);
    if (!e->classifier) e->classifier = std::make_unique<kiln::Classifier>(e->engine);
    auto r = e->classifier->classify_file(image_path, top_k);
    *count = static_cast<int>(r.top_k.size());
    for (size_t i = 0; i < r.top_k.size(); ++i) {
      class_ids[i] = r.top_k[i].class_id;
      scores[i] = r.top_k[i].score;
    }
  });
}

int kiln_engine_num_labels(const kiln_engine* e) { return e ? static_cast<int>(e->engine->labels().size()) : 0; }

kiln_status kiln_engine_label(const kiln_engine* e, int class_id, const char** label) {
  if (!e || !label) return usage("kiln_engine_label: NULL argument");
  const auto& labels = e->engine->labels();
  if (class_id < 0 || class_id >= static_cast<int>(labels.size())) return usage("kiln_engine_label: class id out of range");
  *label = labels[static_cast<size_t>(class_id)].c_str();
  return KILN_OK;
}

kiln_status kiln_detect_file(const kiln_engine* e, const char* image_path, float score_threshold,
                             kiln_detection* detections, int capacity, int* count) {
  if (!e || !image_path || !count || capacity < 0 || (capacity > 0 && !detections))
    return usage("kiln_detect_file: NULL argument or negative capacity");
  return guarded([&] {
    std::lock_guard<std::mutex> lock(e->detect_mutex);
    if (!e->detector) e->detector = std::make_unique<kiln::Detector>(e->engine);
    const kiln::Detections r = e->detector->detect_file(image_path, score_threshold);
    *count = static_cast<int>(r.boxes.size());
    if (r.boxes.size() > static_cast<size_t>(capacity))
      throw kiln::Error(kiln::ErrorKind::Usage, "kiln_detect_file: " + std::to_string(r.boxes.size()) +
                                                    " detections do not fit in capacity " + std::to_string(capacity));
    for (size_t i = 0; i < r.boxes.size(); ++i) {
      const kiln::Detection& d = r.boxes[i];
      detections[i] = {d.x_min, d.y_min, d.x_max, d.y_max, d.score, d.class_id};
    }
  });
}

}  // extern "C"
