// GPU pre-processing (backends/cuda/image_preprocess.*) against the CPU's
// run_preprocess_plan, bit for bit: the sample photos and synthetic images of
// awkward sizes, every interpolation and timm crop mode, both pass orders.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <filesystem>
#include <random>
#include <vector>

#include <unistd.h>

#include "backends/cuda/classify_post.hpp"
#include "backends/cuda/device_buffer.hpp"
#include "bundle/builder.hpp"
#include "kiln/kiln.hpp"
#include "backends/cuda/image_preprocess.hpp"
#include "cuda_test_util.hpp"
#include "image/image.hpp"

namespace kiln {
namespace {

namespace fs = std::filesystem;

std::vector<float> on_gpu(cuda::GpuPreprocessor& gp, const ImageU8& img, const PreprocessPlan& plan) {
  cuda::DeviceBuffer in(img.rgb.size()), out(size_t{3} * plan.out_w * plan.out_h * sizeof(float));
  EXPECT_EQ(cudaMemcpy(in.get(), img.rgb.data(), img.rgb.size(), cudaMemcpyHostToDevice), cudaSuccess);
  gp.run(plan, static_cast<const uint8_t*>(in.get()), static_cast<float*>(out.get()), nullptr);
  std::vector<float> got(size_t{3} * plan.out_w * plan.out_h);
  EXPECT_EQ(cudaMemcpy(got.data(), out.get(), got.size() * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
  return got;
}

std::vector<ImageU8> images() {
  std::vector<ImageU8> out;
  for (const auto& e : fs::directory_iterator(fs::path(KILN_FIXTURES_DIR) / "images" / "images"))
    if (e.path().extension() == ".jpg" || e.path().extension() == ".png") out.push_back(decode_image(e.path()));
  std::mt19937 rng(11);
  std::uniform_int_distribution<int> byte(0, 255);
  for (const auto& [w, h] : std::vector<std::pair<int, int>>{{17, 23}, {1900, 260}, {240, 1500}, {56, 48}}) {
    ImageU8 img;
    img.width = w, img.height = h;
    img.rgb.resize(size_t(w) * h * 3);
    for (auto& v : img.rgb) v = static_cast<uint8_t>(byte(rng));
    out.push_back(std::move(img));
  }
  return out;
}

TEST(CudaPreprocess, BitIdenticalToTheCpuPlan) {
  KILN_REQUIRE_GPU();
  cuda::GpuPreprocessor gp;
  int cases = 0;
  for (const ImageU8& img : images())
    for (const char* mode : {"center", "squash", "border"})
      for (Interpolation interp : {Interpolation::Nearest, Interpolation::Bilinear, Interpolation::Bicubic})
        for (PilPassOrder order : {PilPassOrder::Pillow13, PilPassOrder::Pillow12}) {
          TimmPreprocess p;
          p.height = 224, p.width = 200, p.crop_pct = mode == std::string("border") ? 1.1f : 0.875f;
          p.crop_mode = mode, p.interpolation = interp, p.pil_pass_order = order;
          const PreprocessPlan plan = plan_timm_preprocess(img.width, img.height, p);
          const std::vector<float> want = run_preprocess_plan(img, plan);
          const std::vector<float> got = on_gpu(gp, img, plan);
          ASSERT_EQ(got.size(), want.size());
          EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)), 0)
              << img.width << "x" << img.height << " " << mode << " " << interpolation_name(interp);
          ++cases;
        }
  EXPECT_GT(cases, 100);
}

// The classification task on a CUDA bundle pre-processes on the GPU
// (Classifier -> run_images -> GpuPreprocessor): its logits equal, bit for
// bit, the same engine fed the CPU's pre-processing, one image per call and
// several per call, and a batch mixing image sizes.
// The host's post-processing (classifier.cpp) restated: ids ranked by logit,
// equal logits by lower id; softmax in double, sequential sum.
void host_top_k(const float* l, int classes, int k, int* ids, float* probs) {
  const float mx = *std::max_element(l, l + classes);
  double sum = 0;
  for (int i = 0; i < classes; ++i) sum += std::exp(static_cast<double>(l[i]) - mx);
  std::vector<int> order(classes);
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + k, order.end(),
                    [&](int a, int b) { return l[a] != l[b] ? l[a] > l[b] : a < b; });
  for (int j = 0; j < k; ++j) {
    ids[j] = order[j];
    probs[j] = static_cast<float>(std::exp(static_cast<double>(l[order[j]]) - mx) / sum);
  }
}

// Probabilities from the device's tree-ordered double sum: the host's within
// one f32 rounding (the sums differ far below f32's precision).
void expect_same_picks(const std::vector<Prediction>& got, const std::vector<Prediction>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t j = 0; j < want.size(); ++j) {
    EXPECT_EQ(got[j].class_id, want[j].class_id) << "pick " << j;
    EXPECT_NEAR(got[j].score, want[j].score, 2e-7 * want[j].score + 1e-30) << "pick " << j;
    EXPECT_EQ(got[j].label, want[j].label) << "pick " << j;
  }
}

// The classification post-processing kernel against the host's ranking:
// rows with many equal logits (values on a coarse grid), class counts below,
// at and above the block size, every k it takes.
TEST(CudaPost, SoftmaxTopKRanksAsTheHost) {
  KILN_REQUIRE_GPU();
  std::mt19937 rng(5);
  for (int classes : {1, 7, 256, 1000, 1001}) {
    for (int k : {1, 5, 32}) {
      if (k > classes) continue;
      const int rows = 3;
      std::vector<float> logits(size_t(rows) * classes);
      std::uniform_int_distribution<int> grid(-12, 12);
      for (auto& v : logits) v = 0.5f * grid(rng);  // ties everywhere
      logits[classes - 1] = 40.f;                   // a sharp softmax in row 0
      cuda::DeviceBuffer d(logits.size() * sizeof(float)), ids_d(size_t(rows) * k * 4), probs_d(size_t(rows) * k * 4);
      ASSERT_EQ(cudaMemcpy(d.get(), logits.data(), logits.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
      cuda::softmax_top_k(static_cast<const float*>(d.get()), rows, classes, k, static_cast<int*>(ids_d.get()),
                          static_cast<float*>(probs_d.get()), nullptr);
      std::vector<int> ids(size_t(rows) * k);
      std::vector<float> probs(size_t(rows) * k);
      ASSERT_EQ(cudaMemcpy(ids.data(), ids_d.get(), ids.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(probs.data(), probs_d.get(), probs.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
      for (int r = 0; r < rows; ++r) {
        std::vector<int> want_ids(k);
        std::vector<float> want_probs(k);
        host_top_k(logits.data() + size_t(r) * classes, classes, k, want_ids.data(), want_probs.data());
        for (int j = 0; j < k; ++j) {
          EXPECT_EQ(ids[r * k + j], want_ids[j]) << classes << " classes, k " << k << ", row " << r << ", pick " << j;
          EXPECT_NEAR(probs[r * k + j], want_probs[j], 2e-7 * want_probs[j] + 1e-30) << classes << " classes, pick " << j;
        }
      }
    }
  }
  EXPECT_THROW(cuda::softmax_top_k(nullptr, 1, 10, cuda::kMaxDeviceTopK + 1, nullptr, nullptr, nullptr), Error);
}

TEST(CudaPreprocess, ClassifierOnTheGpuEqualsTheHostPath) {
  KILN_REQUIRE_GPU();
  const fs::path dir = fs::temp_directory_path() / ("kiln_gpu_pre_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  BuildOptions o;
  o.model = (fs::path(KILN_FIXTURES_DIR) / "resnet" / "basic").string();
  o.backend = "cuda";
  o.precision = DType::F16;
  o.batch = 4;
  build_bundle(o, dir / "basic.bundle");
  Classifier clf(Engine::load((dir / "basic.bundle").string()));
  ASSERT_TRUE(clf.preprocesses_on_device());
  std::vector<std::string> photos;
  for (const auto& e : fs::directory_iterator(fs::path(KILN_FIXTURES_DIR) / "images" / "images"))
    if (e.path().extension() == ".jpg" || e.path().extension() == ".png") photos.push_back(e.path().string());
  std::sort(photos.begin(), photos.end());
  ASSERT_GE(photos.size(), 4u);
  photos.resize(4);
  std::vector<float> host_pixels;
  for (const auto& p : photos) {
    const std::vector<float> px = clf.preprocess_file(p);  // the CPU executor of the same plan
    host_pixels.insert(host_pixels.end(), px.begin(), px.end());
  }
  const auto want = clf.classify_preprocessed(host_pixels, 4, 5);
  const auto batched = clf.classify_files(photos, 5);
  EXPECT_GT(clf.last_timings().preprocess_ms, 0.0);
  EXPECT_GT(clf.last_timings().copy_ms, 0.0);  // the upload and the copy out, timed apart
  EXPECT_GT(clf.last_timings().engine_ms, 0.0);
  ASSERT_EQ(batched.size(), 4u);
  for (size_t k = 0; k < photos.size(); ++k) {
    SCOPED_TRACE(photos[k]);
    EXPECT_EQ(batched[k].logits, want[k].logits);
    expect_same_picks(batched[k].top_k, want[k].top_k);  // softmax and top-k on the GPU
    const Classification one = clf.classify_file(photos[k], 5);  // batch 1
    EXPECT_EQ(one.logits, want[k].logits);
    expect_same_picks(one.top_k, want[k].top_k);
    // More picks than the GPU kernel takes: the host post-processes, the same way.
    const auto many_want = clf.classify_preprocessed(std::vector<float>(host_pixels.begin() + k * host_pixels.size() / 4,
                                                                        host_pixels.begin() + (k + 1) * host_pixels.size() / 4),
                                                     1, cuda::kMaxDeviceTopK + 3);
    expect_same_picks(clf.classify_file(photos[k], cuda::kMaxDeviceTopK + 3).top_k, many_want[0].top_k);
  }
  std::vector<std::shared_ptr<PreparedImage>> prepared;
  for (const auto& p : photos) prepared.push_back(clf.prepare_file(p));
  const auto again = clf.classify_prepared(prepared, 5);
  for (size_t k = 0; k < photos.size(); ++k) EXPECT_EQ(again[k].logits, want[k].logits) << photos[k];
  // From a caller's decoded pixels (read in place, no copy): the same logits.
  for (size_t k = 0; k < photos.size(); ++k) {
    const ImageU8 img = decode_image(photos[k]);
    const Classification c = clf.classify_rgb(img.width, img.height, img.rgb.data(), 5);
    EXPECT_EQ(c.logits, want[k].logits) << photos[k];
    expect_same_picks(c.top_k, want[k].top_k);
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace kiln
