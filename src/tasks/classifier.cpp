#include <algorithm>
#include <chrono>
#include <cmath>
#include <mutex>
#include <numeric>

#include "core/error.hpp"
#include "image/image.hpp"
#include "kiln/kiln.hpp"
#include "runtime/engine_impl.hpp"
#include "tasks/runtime_config.hpp"

namespace kiln {

// Device path: the decoded image (or a caller's pixels, `borrowed`, for the
// call that made it) and its plan (pixels empty). Host path: the
// pre-processed CHW floats (image dropped once used).
struct PreparedImage {
  ImageU8 image;
  RgbView borrowed;
  std::shared_ptr<const PreprocessPlan> plan;
  std::vector<float> pixels;
  RgbView view() const { return borrowed.rgb ? borrowed : view_of(image); }
};

struct Classifier::Impl {
  ClassificationRuntime rt;
  TimmPreprocess pre;
  std::unique_ptr<ExecutionContext> ctx;
  bool on_device = false;  // the engine pre-processes on its GPU (run_images)
  int logits_index = 0;    // rt.output among the engine's outputs
  TaskTimings timings;
  // Plans of the last image sizes seen (most recent first): photos of one
  // camera or data set share a few sizes, and a plan's resampling weights
  // and tables take longer to compute than the GPU takes to apply them.
  // prepare() runs on decode threads, hence the lock.
  static constexpr size_t kPlanCache = 8;
  mutable std::mutex plans_mu;
  mutable std::vector<std::shared_ptr<const PreprocessPlan>> plans;

  std::shared_ptr<const PreprocessPlan> plan_for(int width, int height) const {
    {
      const std::lock_guard<std::mutex> lock(plans_mu);
      for (size_t i = 0; i < plans.size(); ++i)
        if (plans[i]->resize.in_w == width && plans[i]->resize.in_h == height) {
          auto hit = plans[i];
          std::rotate(plans.begin(), plans.begin() + i, plans.begin() + i + 1);
          return hit;
        }
    }
    auto plan = std::make_shared<const PreprocessPlan>(plan_timm_preprocess(width, height, pre));
    const std::lock_guard<std::mutex> lock(plans_mu);
    plans.insert(plans.begin(), plan);
    if (plans.size() > kPlanCache) plans.pop_back();
    return plan;
  }
};

Classifier::Classifier(std::shared_ptr<const Engine> engine) : engine_(std::move(engine)), impl_(std::make_unique<Impl>()) {
  if (engine_->task() != "classification")
    fail_input("this bundle's task is '", engine_->task(), "', not classification", engine_->task() == "detection" ? " (use kiln::Detector or kiln detect)" : "");
  impl_->rt = parse_classification_runtime(nlohmann::json::parse(engine_->runtime_json()), "runtime.json");
  impl_->pre = timm_preprocess_of(impl_->rt.preprocess);
  impl_->ctx = engine_->create_context();
  impl_->on_device = kiln::preprocesses_on_device(*impl_->ctx);
  const auto outs = engine_->outputs();
  for (size_t k = 0; k < outs.size(); ++k)
    if (outs[k].name == impl_->rt.output) impl_->logits_index = static_cast<int>(k);
}

bool Classifier::preprocesses_on_device() const { return impl_->on_device; }

Classifier::~Classifier() = default;

namespace {

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

std::string label_of(int id, const std::vector<std::string>& labels) {
  return id < static_cast<int>(labels.size()) ? labels[id] : std::to_string(id);
}

Classification postprocess(const float* logits, int classes, int top_k, const std::vector<std::string>& labels) {
  Classification c;
  c.logits.assign(logits, logits + classes);
  const float mx = *std::max_element(c.logits.begin(), c.logits.end());
  std::vector<double> prob(classes);
  double sum = 0;
  for (int i = 0; i < classes; ++i) sum += prob[i] = std::exp(static_cast<double>(c.logits[i]) - mx);
  std::vector<int> order(classes);
  std::iota(order.begin(), order.end(), 0);
  const int k = std::clamp(top_k, 0, classes);
  // Ties broken by the lower class id, as torch.topk does on CPU in practice.
  std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int a, int b) {
    return c.logits[a] != c.logits[b] ? c.logits[a] > c.logits[b] : a < b;
  });
  for (int i = 0; i < k; ++i) {
    int id = order[i];
    c.top_k.push_back({id, label_of(id, labels), static_cast<float>(prob[id] / sum)});
  }
  return c;
}

}  // namespace

// Runs a batch of already pre-processed CHW images and post-processes each.
std::vector<Classification> Classifier::run_batch(std::vector<float> pixels, int64_t images, int top_k) {
  const auto& p = impl_->pre;
  auto t0 = Clock::now();
  auto outputs = impl_->ctx->run({{impl_->rt.input, {images, 3, p.height, p.width}, std::move(pixels)}});
  impl_->timings.engine_ms = ms_since(t0);
  return postprocess_all(outputs, images, top_k);
}

std::vector<Classification> Classifier::postprocess_all(const std::vector<Tensor>& outputs, int64_t images, int top_k) {
  const auto t0 = Clock::now();
  const Tensor* logits = nullptr;
  for (const auto& o : outputs)
    if (o.name == impl_->rt.output) logits = &o;
  if (!logits) fail_runtime("engine has no output '", impl_->rt.output, "'");
  const int classes = static_cast<int>(logits->shape.back());
  std::vector<Classification> r;
  for (int64_t i = 0; i < images; ++i)
    r.push_back(postprocess(logits->data.data() + i * classes, classes, top_k, engine_->labels()));
  impl_->timings.postprocess_ms = ms_since(t0);
  return r;
}

// Plans the image's pre-processing; on the host path also runs it.
std::shared_ptr<PreparedImage> Classifier::prepare(ImageU8&& img, TaskTimings& t) const {
  const auto t0 = Clock::now();
  auto out = std::make_shared<PreparedImage>();
  out->plan = impl_->plan_for(img.width, img.height);
  if (impl_->on_device) out->image = std::move(img);
  else out->pixels = run_preprocess_plan(img, *out->plan);
  t.preprocess_ms += ms_since(t0);
  return out;
}

// One engine call for prepared images; `t` holds their decode and host pre-processing times.
std::vector<Classification> Classifier::run_prepared(const std::vector<const PreparedImage*>& images, int top_k, TaskTimings t) {
  impl_->timings = t;
  const int64_t n = static_cast<int64_t>(images.size());
  if (!impl_->on_device) {
    const auto& p = impl_->pre;
    std::vector<float> pixels;
    pixels.reserve(3ULL * p.height * p.width * images.size());
    for (const PreparedImage* im : images) {
      if (im->pixels.size() != 3ULL * p.height * p.width)
        fail_usage("classify_prepared: an image prepared by a classifier that pre-processes on the device");
      pixels.insert(pixels.end(), im->pixels.begin(), im->pixels.end());
    }
    return run_batch(std::move(pixels), n, top_k);
  }
  std::vector<RgbView> imgs;
  std::vector<const PreprocessPlan*> plans;
  for (const PreparedImage* im : images) {
    if (!im->view().rgb) fail_usage("classify_prepared: an image prepared by a classifier that pre-processes on the host");
    imgs.push_back(im->view());
    plans.push_back(im->plan.get());
  }
  const auto t0 = Clock::now();
  ImageRunTimes dev;
  DeviceTopK top;
  top.output = impl_->logits_index;
  top.k = top_k;
  const auto outputs = run_images(*impl_->ctx, imgs, plans, &dev, top_k > 0 ? &top : nullptr);
  impl_->timings.preprocess_ms += dev.preprocess_ms;
  impl_->timings.copy_ms = dev.upload_ms + dev.download_ms;
  impl_->timings.engine_ms = std::max(0.0, ms_since(t0) - dev.preprocess_ms - impl_->timings.copy_ms);
  if (!top.done) return postprocess_all(outputs, n, top_k);
  // Softmax and top-k came from the device: the logits and the picks only get their labels here.
  const auto t1 = Clock::now();
  const Tensor& logits = outputs.at(static_cast<size_t>(impl_->logits_index));
  const int classes = static_cast<int>(logits.shape.back());
  std::vector<Classification> r(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    r[i].logits.assign(logits.data.begin() + i * classes, logits.data.begin() + (i + 1) * classes);
    for (int j = 0; j < top_k; ++j) {
      const int id = top.ids[i * top_k + j];
      r[i].top_k.push_back({id, label_of(id, engine_->labels()), top.probs[i * top_k + j]});
    }
  }
  impl_->timings.postprocess_ms = ms_since(t1);
  return r;
}

std::shared_ptr<PreparedImage> Classifier::prepare_file(const std::string& path) const {
  TaskTimings unused;
  return prepare(decode_image(path), unused);
}

std::vector<Classification> Classifier::classify_prepared(const std::vector<std::shared_ptr<PreparedImage>>& images, int top_k) {
  if (images.empty()) return {};
  std::vector<const PreparedImage*> raw;
  for (const auto& im : images) {
    if (!im) fail_usage("classify_prepared: a null image");
    raw.push_back(im.get());
  }
  return run_prepared(raw, top_k, {});
}

const TaskTimings& Classifier::last_timings() const { return impl_->timings; }

// Decode + pre-process one image, adding the two times to `t` (the batch
// entry points own their TaskTimings; preprocess_file stays const for threads).
std::vector<float> Classifier::timed_preprocess(const std::string& path, TaskTimings& t) const {
  auto t0 = Clock::now();
  ImageU8 img = decode_image(path);
  t.decode_ms += ms_since(t0);
  t0 = Clock::now();
  auto chw = timm_preprocess(img, impl_->pre);
  t.preprocess_ms += ms_since(t0);
  return chw;
}

std::vector<float> Classifier::preprocess_file(const std::string& path) const {
  TaskTimings unused;
  return timed_preprocess(path, unused);
}

std::vector<Classification> Classifier::classify_preprocessed(std::vector<float> pixels, int64_t images, int top_k) {
  const auto& p = impl_->pre;
  if (images <= 0) return {};
  if (pixels.size() != static_cast<size_t>(images) * 3 * p.height * p.width)
    fail_input("classify_preprocessed: ", pixels.size(), " values for ", images, " images of 3x", p.height, "x",
               p.width);
  impl_->timings = {};
  return run_batch(std::move(pixels), images, top_k);
}

std::vector<Classification> Classifier::classify_files(const std::vector<std::string>& paths, int top_k) {
  if (paths.empty()) return {};
  TaskTimings t;
  std::vector<std::shared_ptr<PreparedImage>> prepared;
  std::vector<const PreparedImage*> raw;
  for (const auto& path : paths) {
    const auto t0 = Clock::now();
    ImageU8 img = decode_image(path);
    t.decode_ms += ms_since(t0);
    prepared.push_back(prepare(std::move(img), t));
    raw.push_back(prepared.back().get());
  }
  return run_prepared(raw, top_k, t);
}

std::vector<ClassificationOutcome> Classifier::try_classify_files(const std::vector<std::string>& paths, int top_k) {
  std::vector<ClassificationOutcome> out(paths.size());
  std::vector<size_t> good;
  std::vector<std::shared_ptr<PreparedImage>> prepared;
  std::vector<const PreparedImage*> raw;
  TaskTimings t;
  for (size_t i = 0; i < paths.size(); ++i) {
    out[i].path = paths[i];
    try {
      const auto t0 = Clock::now();
      ImageU8 img = decode_image(paths[i]);
      t.decode_ms += ms_since(t0);
      prepared.push_back(prepare(std::move(img), t));
      raw.push_back(prepared.back().get());
      good.push_back(i);
    } catch (const Error& e) {
      // Only this image's input problem is recorded; anything else (out of
      // memory, a runtime fault) is not about the file and propagates.
      if (e.kind() != ErrorKind::Input) throw;
      out[i].error = e.what();
    }
  }
  impl_->timings = t;
  if (good.empty()) return out;
  auto results = run_prepared(raw, top_k, t);
  for (size_t k = 0; k < good.size(); ++k) {
    out[good[k]].ok = true;
    out[good[k]].result = std::move(results[k]);
  }
  return out;
}

Classification Classifier::classify_file(const std::string& path, int top_k) { return classify_files({path}, top_k)[0]; }

Classification Classifier::classify_rgb(int width, int height, const uint8_t* rgb, int top_k) {
  if (width <= 0 || height <= 0 || !rgb) fail_input("classify_rgb: empty image");
  if (impl_->on_device) {
    // The GPU path reads the caller's pixels in place (into its pinned staging): no copy here.
    const auto t0 = Clock::now();
    PreparedImage prepared;
    prepared.plan = impl_->plan_for(width, height);
    prepared.borrowed = {width, height, rgb};
    TaskTimings t;
    t.preprocess_ms = ms_since(t0);
    return run_prepared({&prepared}, top_k, t)[0];
  }
  ImageU8 img{width, height, std::vector<uint8_t>(rgb, rgb + 3LL * width * height)};
  TaskTimings t;
  const auto prepared = prepare(std::move(img), t);
  return run_prepared({prepared.get()}, top_k, t)[0];
}

}  // namespace kiln
