// kiln::Detector: RT-DETR-style detection bundles from image files to boxes.
// Pre-processing: image/resize_rescale (PIL-exact resize, x 1/255); post-
// processing: tasks/detection_post (transformers' post_process_object_detection).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>

#include "core/error.hpp"
#include "image/image.hpp"
#include "kiln/kiln.hpp"
#include "tasks/detection_post.hpp"
#include "tasks/runtime_config.hpp"

namespace kiln {

std::vector<int64_t> torch_topk_order(const std::vector<float>& values, size_t k) {
  // torch.topk(largest=True, sorted=True) on the CPU (ATen's topk_impl_loop):
  // (value, index) pairs in index order; std::partial_sort when k * 64 <= n,
  // else std::nth_element at k - 1 and std::sort of the first k - 1. Equal
  // values come out in whatever order those algorithms leave them, so the
  // same calls (libstdc++, as PyTorch's Linux builds) give the same order.
  // NaN ranks above every number.
  const size_t n = values.size();
  k = std::min(k, n);
  if (k == 0) return {};
  using Elem = std::pair<float, int64_t>;
  std::vector<Elem> queue(n);
  for (size_t j = 0; j < n; ++j) queue[j] = {values[j], static_cast<int64_t>(j)};
  const auto greater = [](const Elem& x, const Elem& y) {
    return (std::isnan(x.first) && !std::isnan(y.first)) || x.first > y.first;
  };
  const auto kk = static_cast<std::ptrdiff_t>(k);
  if (k * 64 <= n) {
    std::partial_sort(queue.begin(), queue.begin() + kk, queue.end(), greater);
  } else {
    std::nth_element(queue.begin(), queue.begin() + kk - 1, queue.end(), greater);
    std::sort(queue.begin(), queue.begin() + kk - 1, greater);
  }
  std::vector<int64_t> order(k);
  for (size_t j = 0; j < k; ++j) order[j] = queue[j].second;
  return order;
}

Detections postprocess_detections(const float* logits, const float* boxes, const DetectionShape& s, int image_width,
                                  int image_height, float score_threshold, const std::vector<std::string>& labels) {
  const size_t total = static_cast<size_t>(s.queries) * s.classes;
  std::vector<float> scores(total);
  for (size_t i = 0; i < total; ++i) scores[i] = 1.f / (1.f + std::exp(-logits[i]));
  const size_t k = std::min(total, static_cast<size_t>(std::max(s.num_top, 0)));
  const std::vector<int64_t> order = torch_topk_order(scores, k);
  Detections out;
  out.image_width = image_width;
  out.image_height = image_height;
  const float fw = static_cast<float>(image_width), fh = static_cast<float>(image_height);
  for (size_t r = 0; r < k; ++r) {
    const int64_t idx = order[r];
    const float score = scores[idx];
    if (!(score > score_threshold)) continue;  // strict; NaN never passes
    const int cls = static_cast<int>(idx % s.classes);
    const int64_t q = idx / s.classes;
    const float* b = boxes + static_cast<size_t>(q) * 4;
    Detection d;
    d.x_min = (b[0] - 0.5f * b[2]) * fw;
    d.y_min = (b[1] - 0.5f * b[3]) * fh;
    d.x_max = (b[0] + 0.5f * b[2]) * fw;
    d.y_max = (b[1] + 0.5f * b[3]) * fh;
    d.score = score;
    d.class_id = cls;
    d.label = cls < static_cast<int>(labels.size()) ? labels[cls] : std::to_string(cls);
    out.boxes.push_back(std::move(d));
  }
  return out;
}

namespace {

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

const TensorInfo* find_tensor(const std::vector<TensorInfo>& list, const std::string& name) {
  for (const auto& t : list)
    if (t.name == name) return &t;
  return nullptr;
}

std::string shape_text(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

}  // namespace

struct Detector::Impl {
  DetectionRuntime rt;
  ResizeRescale pre;
  DetectionShape shape;
  std::unique_ptr<ExecutionContext> ctx;
  TaskTimings timings;
};

Detector::Detector(std::shared_ptr<const Engine> engine) : engine_(std::move(engine)), impl_(std::make_unique<Impl>()) {
  if (engine_->task() != "detection")
    fail_input("this bundle's task is '", engine_->task(), "', not detection (kiln::Detector and kiln detect take ",
               "detection bundles", engine_->task() == "classification" ? "; use kiln classify" : "", ")");
  auto& r = impl_->rt;
  r = parse_detection_runtime(nlohmann::json::parse(engine_->runtime_json()), "runtime.json");
  impl_->pre = resize_rescale_of(r.preprocess);
  // The engine must agree with runtime.json before any image is read.
  const auto ins = engine_->inputs(), outs = engine_->outputs();
  const TensorInfo* in = find_tensor(ins, r.input);
  if (!in) fail_input("runtime.json: input '", r.input, "' is not an input of the engine");
  if (in->shape.size() != 4 || in->shape[1] != 3 || in->shape[2] != r.preprocess.height ||
      in->shape[3] != r.preprocess.width)
    fail_input("runtime.json: input '", r.input, "' is ", shape_text(in->shape), ", pre-processing gives [N, 3, ",
               r.preprocess.height, ", ", r.preprocess.width, "]");
  const TensorInfo* lg = find_tensor(outs, r.logits);
  const TensorInfo* bx = find_tensor(outs, r.boxes);
  if (!lg) fail_input("runtime.json: logits '", r.logits, "' is not an output of the engine");
  if (!bx) fail_input("runtime.json: boxes '", r.boxes, "' is not an output of the engine");
  if (lg->shape.size() != 3 || lg->shape[1] != r.num_queries || lg->shape[2] != r.num_classes)
    fail_input("runtime.json: output '", r.logits, "' is ", shape_text(lg->shape), ", expected [N, ", r.num_queries,
               ", ", r.num_classes, "] (num_queries, num_classes)");
  if (bx->shape.size() != 3 || bx->shape[1] != r.num_queries || bx->shape[2] != 4)
    fail_input("runtime.json: output '", r.boxes, "' is ", shape_text(bx->shape), ", expected [N, ", r.num_queries,
               ", 4]");
  impl_->shape = {r.num_queries, r.num_classes, r.num_queries};
  impl_->ctx = engine_->create_context();
}

Detector::~Detector() = default;

int Detector::num_classes() const { return impl_->rt.num_classes; }
const TaskTimings& Detector::last_timings() const { return impl_->timings; }

std::vector<Detections> Detector::run_batch(const std::vector<DetectionInput>& images, float score_threshold) {
  const auto& p = impl_->pre;
  const size_t per = 3ULL * p.height * p.width;
  std::vector<float> pixels;
  pixels.reserve(per * images.size());
  for (size_t i = 0; i < images.size(); ++i) {
    if (images[i].pixels.size() != per)
      fail_input("detect_preprocessed: image ", i, " has ", images[i].pixels.size(), " values, expected 3x", p.height,
                 "x", p.width);
    if (images[i].image_width <= 0 || images[i].image_height <= 0)
      fail_input("detect_preprocessed: image ", i, " has no original size");
    pixels.insert(pixels.end(), images[i].pixels.begin(), images[i].pixels.end());
  }
  const auto n = static_cast<int64_t>(images.size());
  auto t0 = Clock::now();
  auto outputs = impl_->ctx->run({{impl_->rt.input, {n, 3, p.height, p.width}, std::move(pixels)}});
  impl_->timings.engine_ms = ms_since(t0);
  t0 = Clock::now();
  const Tensor *logits = nullptr, *boxes = nullptr;
  for (const auto& o : outputs) {
    if (o.name == impl_->rt.logits) logits = &o;
    if (o.name == impl_->rt.boxes) boxes = &o;
  }
  if (!logits || !boxes) fail_runtime("engine gave no '", impl_->rt.logits, "' or '", impl_->rt.boxes, "' output");
  const auto& s = impl_->shape;
  const size_t lper = static_cast<size_t>(s.queries) * s.classes, bper = static_cast<size_t>(s.queries) * 4;
  if (logits->data.size() != lper * images.size() || boxes->data.size() != bper * images.size())
    fail_runtime("engine outputs have unexpected sizes");
  std::vector<Detections> r;
  for (size_t i = 0; i < images.size(); ++i)
    r.push_back(postprocess_detections(logits->data.data() + i * lper, boxes->data.data() + i * bper, s,
                                       images[i].image_width, images[i].image_height, score_threshold,
                                       engine_->labels()));
  impl_->timings.postprocess_ms = ms_since(t0);
  return r;
}

DetectionInput Detector::preprocess_file(const std::string& path) const {
  ImageU8 img = decode_image(path);
  DetectionInput in;
  in.image_width = img.width;
  in.image_height = img.height;
  in.pixels = resize_rescale(img, impl_->pre);
  return in;
}

std::vector<Detections> Detector::detect_preprocessed(const std::vector<DetectionInput>& images, float threshold) {
  impl_->timings = {};
  if (images.empty()) return {};
  return run_batch(images, threshold);
}

std::vector<Detections> Detector::detect_files(const std::vector<std::string>& paths, float threshold) {
  if (paths.empty()) return {};
  TaskTimings t;
  std::vector<DetectionInput> in;
  for (const auto& path : paths) {
    auto t0 = Clock::now();
    ImageU8 img = decode_image(path);
    t.decode_ms += ms_since(t0);
    t0 = Clock::now();
    in.push_back({resize_rescale(img, impl_->pre), img.width, img.height});
    t.preprocess_ms += ms_since(t0);
  }
  impl_->timings = t;
  return run_batch(in, threshold);
}

std::vector<DetectionOutcome> Detector::try_detect_files(const std::vector<std::string>& paths, float threshold) {
  std::vector<DetectionOutcome> out(paths.size());
  std::vector<size_t> good;
  std::vector<DetectionInput> in;
  for (size_t i = 0; i < paths.size(); ++i) {
    out[i].path = paths[i];
    try {
      in.push_back(preprocess_file(paths[i]));
      good.push_back(i);
    } catch (const Error& e) {
      if (e.kind() != ErrorKind::Input) throw;  // not about this file
      out[i].error = e.what();
    }
  }
  impl_->timings = {};
  if (good.empty()) return out;
  auto results = run_batch(in, threshold);
  for (size_t k = 0; k < good.size(); ++k) {
    out[good[k]].ok = true;
    out[good[k]].result = std::move(results[k]);
  }
  return out;
}

Detections Detector::detect_file(const std::string& path, float threshold) { return detect_files({path}, threshold)[0]; }

Detections Detector::detect(int width, int height, const uint8_t* rgb, float threshold) {
  if (width <= 0 || height <= 0 || !rgb) fail_input("detect: empty image");
  if (width > kMaxImageSide || height > kMaxImageSide || int64_t{width} * height > kMaxImagePixels)
    fail_input("detect: image ", width, "x", height, " is too large");
  ImageU8 img{width, height, std::vector<uint8_t>(rgb, rgb + 3LL * width * height)};
  impl_->timings = {};
  const auto t0 = Clock::now();
  DetectionInput in{resize_rescale(img, impl_->pre), width, height};
  impl_->timings.preprocess_ms = ms_since(t0);
  return run_batch({in}, threshold)[0];
}


float iou(const Detection& a, const Detection& b) {
  const float iw = std::max(0.f, std::min(a.x_max, b.x_max) - std::max(a.x_min, b.x_min));
  const float ih = std::max(0.f, std::min(a.y_max, b.y_max) - std::max(a.y_min, b.y_min));
  const float inter = iw * ih;
  const float uni = (a.x_max - a.x_min) * (a.y_max - a.y_min) + (b.x_max - b.x_min) * (b.y_max - b.y_min) - inter;
  return uni > 0 ? inter / uni : 0.f;
}

std::string detection_mismatch(const Detections& want, const Detections& got, size_t allowed_unmatched) {
  if (want.boxes.size() != got.boxes.size())
    return cat(got.boxes.size(), " detections, the reference has ", want.boxes.size());
  std::vector<char> used(got.boxes.size(), 0);
  std::string first;
  size_t unmatched = 0;
  for (size_t k = 0; k < want.boxes.size(); ++k) {
    const Detection& w = want.boxes[k];
    int best = -1;
    float best_iou = 0.5f;
    for (size_t j = 0; j < got.boxes.size(); ++j) {
      const Detection& g = got.boxes[j];
      if (used[j] || g.class_id != w.class_id || std::fabs(g.score - w.score) > 0.05f) continue;
      const float v = iou(w, g);
      if (v >= best_iou) best = static_cast<int>(j), best_iou = v;
    }
    if (best >= 0) {
      used[static_cast<size_t>(best)] = 1;
      continue;
    }
    if (unmatched++ == 0)
      first = cat("reference detection ", k, " (class ", w.class_id, ", score ", w.score, ", box [", w.x_min, ", ", w.y_min,
                  ", ", w.x_max, ", ", w.y_max, "]) has no match (same class, IoU >= 0.5, |score diff| <= 0.05)");
  }
  if (unmatched <= allowed_unmatched) return "";
  return cat(unmatched, " of ", want.boxes.size(), " reference detections unmatched (", allowed_unmatched, " allowed); first: ", first);
}

}  // namespace kiln
