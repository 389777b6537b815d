// GPU pre-processing (backends/cuda/image_preprocess.*) against the CPU's
// run_preprocess_plan, bit for bit: the sample photos and synthetic images of
// awkward sizes, every interpolation and timm crop mode, both pass orders.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <random>
#include <vector>

#include <unistd.h>

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
  ASSERT_EQ(batched.size(), 4u);
  for (size_t k = 0; k < photos.size(); ++k) {
    SCOPED_TRACE(photos[k]);
    EXPECT_EQ(batched[k].logits, want[k].logits);
    EXPECT_EQ(clf.classify_file(photos[k], 5).logits, want[k].logits);  // batch 1
  }
  std::vector<std::shared_ptr<PreparedImage>> prepared;
  for (const auto& p : photos) prepared.push_back(clf.prepare_file(p));
  const auto again = clf.classify_prepared(prepared, 5);
  for (size_t k = 0; k < photos.size(); ++k) EXPECT_EQ(again[k].logits, want[k].logits) << photos[k];
  // From a caller's decoded pixels (read in place, no copy): the same logits.
  for (size_t k = 0; k < photos.size(); ++k) {
    const ImageU8 img = decode_image(photos[k]);
    EXPECT_EQ(clf.classify_rgb(img.width, img.height, img.rgb.data(), 5).logits, want[k].logits) << photos[k];
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace kiln
