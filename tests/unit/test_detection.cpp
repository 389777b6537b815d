// The detection task: post-processing against transformers' own
// post_process_object_detection (tools/reference/detection_post_fixtures.py),
// torch.topk's order of equal scores, and kiln::Detector end to end on CPU
// bundles whose logits and boxes are simple functions of the pixels (a linear
// head), so the expected detections are computed here independently.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <map>
#include <numeric>
#include <random>

#include <nlohmann/json.hpp>

#include "cpu_bundle_util.hpp"
#include "graph_test_util.hpp"
#include "image/image.hpp"
#include "kiln/kiln.h"
#include "kiln/kiln.hpp"
#include "tasks/detection_post.hpp"
#include "temp_dir.hpp"

#ifndef KILN_FIXTURES_DIR
#error "compile with -DKILN_FIXTURES_DIR"
#endif

namespace kiln {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using Ints = std::vector<int64_t>;
const fs::path kFixtures = KILN_FIXTURES_DIR;

// ------------------------------------------------------ post-processing --

TEST(DetectionPost, MatchesTransformersPostProcessObjectDetection) {
  std::ifstream f(kFixtures / "detection" / "post_process.json");
  ASSERT_TRUE(f) << "missing fixture";
  const json fx = json::parse(f);
  int checked = 0;
  for (const auto& c : fx["cases"]) {
    SCOPED_TRACE(c["name"].get<std::string>());
    const float thr = c["threshold"].get<float>();
    for (size_t i = 0; i < c["logits"].size(); ++i) {
      std::vector<float> logits, boxes;
      for (const auto& q : c["logits"][i])
        for (const auto& v : q) logits.push_back(v.get<float>());
      for (const auto& q : c["boxes"][i])
        for (const auto& v : q) boxes.push_back(v.get<float>());
      const int queries = static_cast<int>(c["logits"][i].size());
      const int classes = static_cast<int>(c["logits"][i][0].size());
      const int h = c["sizes_hw"][i][0], w = c["sizes_hw"][i][1];
      const Detections d = postprocess_detections(logits.data(), boxes.data(), {queries, classes, queries}, w, h, thr,
                                                  {"zero", "one"});
      const auto& want = c["expected"][i];
      ASSERT_EQ(d.boxes.size(), want["scores"].size());
      EXPECT_EQ(d.image_width, w);
      for (size_t k = 0; k < d.boxes.size(); ++k) {
        const Detection& b = d.boxes[k];
        EXPECT_EQ(b.class_id, want["labels"][k].get<int>()) << "rank " << k;
        EXPECT_NEAR(b.score, want["scores"][k].get<float>(), 1e-6) << "rank " << k;
        const float tol = 1e-5f * static_cast<float>(std::max(w, h));
        EXPECT_NEAR(b.x_min, want["boxes"][k][0].get<float>(), tol);
        EXPECT_NEAR(b.y_min, want["boxes"][k][1].get<float>(), tol);
        EXPECT_NEAR(b.x_max, want["boxes"][k][2].get<float>(), tol);
        EXPECT_NEAR(b.y_max, want["boxes"][k][3].get<float>(), tol);
        EXPECT_EQ(b.label, b.class_id == 0 ? "zero" : b.class_id == 1 ? "one" : std::to_string(b.class_id));
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 40);
}

TEST(DetectionPost, TopkOrderOfTiesAndNaNFollowsTorch) {
  // Equal values: the order torch.topk gives on the CPU (checked in
  // post_process.json for both of its paths); here the rules around them.
  const float nan = std::nanf("");
  EXPECT_EQ(torch_topk_order({0.5f, nan, 0.9f, 0.1f}, 3), (std::vector<int64_t>{1, 2, 0}));
  EXPECT_EQ(torch_topk_order({0.5f, 0.9f}, 5), (std::vector<int64_t>{1, 0}));
  EXPECT_TRUE(torch_topk_order({0.5f}, 0).empty());
  // k * 64 <= n: partial_sort; the k largest, sorted.
  std::vector<float> v(200);
  std::mt19937 rng(3);
  for (auto& x : v) x = std::uniform_real_distribution<float>(0, 1)(rng);
  const auto top = torch_topk_order(v, 3);
  std::vector<int64_t> all(v.size());
  std::iota(all.begin(), all.end(), 0);
  std::sort(all.begin(), all.end(), [&](int64_t a, int64_t b) { return v[a] > v[b]; });
  EXPECT_EQ(top, (std::vector<int64_t>(all.begin(), all.begin() + 3)));
}

TEST(DetectionPost, NaNScoresAreNeverKept) {
  const float logits[] = {std::nanf(""), 2.f, -1.f, 0.f};
  const float boxes[] = {0.5f, 0.5f, 0.2f, 0.2f, 0.25f, 0.25f, 0.5f, 0.5f};
  const Detections d = postprocess_detections(logits, boxes, {2, 2, 2}, 100, 50, -1.f, {});
  ASSERT_EQ(d.boxes.size(), 1u);  // the NaN took a top-k slot and failed the threshold
  EXPECT_EQ(d.boxes[0].class_id, 1);
  EXPECT_EQ(d.boxes[0].label, "1");
  EXPECT_FLOAT_EQ(d.boxes[0].x_min, 40.f);
  EXPECT_FLOAT_EQ(d.boxes[0].y_max, 30.f);
}

// ------------------------------------------------- Detector end to end --

// pixel_values [N, 3, H, W] -> flatten -> linear (logits [N, Q, C]) and
// linear + sigmoid (boxes [N, Q, 4]). Weights are kept for the reference.
struct LinearDetector {
  int h = 8, w = 6, q = 5, c = 3;
  std::vector<float> wl, bl, wb, bb;
  Graph g;
  DetectionRuntime rt;

  LinearDetector(unsigned seed, bool tie = false) {
    std::mt19937 rng(seed);
    const int k = 3 * h * w;
    std::normal_distribution<float> n(0.f, 1.f);
    auto fill = [&](std::vector<float>& v, size_t size, float scale) {
      v.resize(size);
      for (auto& x : v) x = n(rng) * scale;
    };
    fill(wl, static_cast<size_t>(q) * c * k, 0.08f);
    fill(bl, static_cast<size_t>(q) * c, 1.f);
    fill(wb, static_cast<size_t>(q) * 4 * k, 0.05f);
    fill(bb, static_cast<size_t>(q) * 4, 0.5f);
    if (tie) {  // queries 1 and 3 give class 2 the same logit; query 0 saturates class 1
      std::copy_n(&wl[(1 * c + 2) * k], k, &wl[(3 * c + 2) * k]);
      bl[3 * c + 2] = bl[1 * c + 2];
      std::fill_n(&wl[(0 * c + 1) * k], k, 0.f);
      bl[0 * c + 1] = 50.f;
    }
    const int x = g.add_input("pixel_values", DType::F32, {1, 3, h, w});
    const int f = g.add_node(Op::Flatten, "flatten", {x});
    const int l = g.add_node(Op::Linear, "head.class",
                             {f, g.add_constant("head.class.weight", HostTensor::from_f32({q * c, k}, wl)),
                              g.add_constant("head.class.bias", HostTensor::from_f32({q * c}, bl))});
    g.mark_output(g.add_node(Op::Reshape, "logits", {l}, {{"shape", Ints{-1, q, c}}}));
    const int b = g.add_node(Op::Linear, "head.box",
                             {f, g.add_constant("head.box.weight", HostTensor::from_f32({q * 4, k}, wb)),
                              g.add_constant("head.box.bias", HostTensor::from_f32({q * 4}, bb))},
                             {{"activation", std::string("sigmoid")}});
    g.mark_output(g.add_node(Op::Reshape, "pred_boxes", {b}, {{"shape", Ints{-1, q, 4}}}));
    rt.num_classes = c;
    rt.num_queries = q;
    rt.preprocess.height = h;
    rt.preprocess.width = w;
  }

  std::shared_ptr<const Engine> engine(const std::vector<std::string>& labels = {"cat", "dog", "bird"}) const {
    const auto bytes = testing::cpu_detection_bundle(g, rt, labels);
    return Engine::load_from_memory(bytes.data(), bytes.size(), {}, "linear-detector.bundle");
  }

  // The expected detections, in double from the 8-bit resized image (the
  // resize itself is checked against PIL in test_image and below).
  std::vector<Detection> expected(const ImageU8& img, float thr) const {
    const ImageU8 u8 = img.width == w && img.height == h ? img : resize_pil(img, w, h, Interpolation::Bilinear);
    std::vector<double> px(static_cast<size_t>(3) * h * w);
    for (int ch = 0; ch < 3; ++ch)
      for (int i = 0; i < h * w; ++i) px[static_cast<size_t>(ch * h * w + i)] = u8.rgb[static_cast<size_t>(i) * 3 + ch] / 255.0;
    const int k = 3 * h * w;
    auto lin = [&](const std::vector<float>& wt, const std::vector<float>& bias, int row) {
      double s = bias[static_cast<size_t>(row)];
      for (int j = 0; j < k; ++j) s += wt[static_cast<size_t>(row) * k + j] * px[static_cast<size_t>(j)];
      return s;
    };
    struct Cand {
      double score;
      int idx;
    };
    std::vector<Cand> all;
    for (int i = 0; i < q * c; ++i) all.push_back({1.0 / (1.0 + std::exp(-lin(wl, bl, i))), i});
    std::stable_sort(all.begin(), all.end(), [](const Cand& a, const Cand& b) { return a.score > b.score; });
    std::vector<Detection> out;
    for (int r = 0; r < q; ++r) {
      if (!(all[r].score > thr)) continue;
      const int query = all[r].idx / c;
      double bx[4];
      for (int j = 0; j < 4; ++j) bx[j] = 1.0 / (1.0 + std::exp(-lin(wb, bb, query * 4 + j)));
      Detection d;
      d.x_min = static_cast<float>((bx[0] - bx[2] / 2) * img.width);
      d.y_min = static_cast<float>((bx[1] - bx[3] / 2) * img.height);
      d.x_max = static_cast<float>((bx[0] + bx[2] / 2) * img.width);
      d.y_max = static_cast<float>((bx[1] + bx[3] / 2) * img.height);
      d.score = static_cast<float>(all[r].score);
      d.class_id = all[r].idx % c;
      out.push_back(d);
    }
    return out;
  }
};

ImageU8 random_image(int w, int h, unsigned seed) {
  std::mt19937 rng(seed);
  ImageU8 img{w, h, std::vector<uint8_t>(static_cast<size_t>(w) * h * 3)};
  for (auto& v : img.rgb) v = static_cast<uint8_t>(rng() & 255);
  return img;
}

void write_file(const fs::path& p, const std::vector<uint8_t>& bytes) {
  std::ofstream(p, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

// A classification bundle (flatten of a 4x4 image), for the refusals.
std::vector<uint8_t> classification_bundle() {
  Graph g;
  g.mark_output(g.add_node(Op::Flatten, "logits", {g.add_input("pixel_values", DType::F32, {1, 3, 4, 4})}));
  return testing::cpu_bundle(g, "test/cls");
}

void expect_same(const std::vector<Detection>& got, const std::vector<Detection>& want,
                 const std::vector<std::string>& labels) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    SCOPED_TRACE("detection " + std::to_string(i));
    EXPECT_EQ(got[i].class_id, want[i].class_id);
    EXPECT_EQ(got[i].label, labels.at(static_cast<size_t>(want[i].class_id)));
    EXPECT_NEAR(got[i].score, want[i].score, 2e-6);
    EXPECT_NEAR(got[i].x_min, want[i].x_min, 1e-3);
    EXPECT_NEAR(got[i].y_min, want[i].y_min, 1e-3);
    EXPECT_NEAR(got[i].x_max, want[i].x_max, 1e-3);
    EXPECT_NEAR(got[i].y_max, want[i].y_max, 1e-3);
    if (i) EXPECT_GE(got[i - 1].score, got[i].score);
  }
}

TEST(Detector, DetectsWhatTheLinearHeadGivesInOriginalPixels) {
  const LinearDetector m(1);
  Detector det(m.engine());
  EXPECT_EQ(det.num_classes(), 3);
  const std::vector<std::string> labels{"cat", "dog", "bird"};
  // One image the engine's size (no resize) and two that are resized.
  const ImageU8 a = random_image(6, 8, 10), b = random_image(40, 30, 11), c = random_image(3, 5, 12);
  for (const ImageU8* img : {&a, &b, &c}) {
    for (float thr : {0.f, 0.3f, 0.6f}) {
      const Detections d = det.detect(img->width, img->height, img->rgb.data(), thr);
      EXPECT_EQ(d.image_width, img->width);
      EXPECT_EQ(d.image_height, img->height);
      expect_same(d.boxes, m.expected(*img, thr), labels);
    }
  }
  // Threshold 0 keeps all Q top entries (sigmoid > 0), 0.9999 (almost) none.
  EXPECT_EQ(det.detect(a.width, a.height, a.rgb.data(), 0.f).boxes.size(), 5u);
}

TEST(Detector, BatchedFilesEqualSingleCallsAndKeepEachImagesSize) {
  testing::TempDir tmp;
  const LinearDetector m(2);
  Detector det(m.engine());
  const std::vector<ImageU8> imgs{random_image(17, 9, 1), random_image(6, 8, 2), random_image(64, 48, 3)};
  std::vector<std::string> paths;
  for (size_t i = 0; i < imgs.size(); ++i) {
    paths.push_back((tmp.path() / ("img" + std::to_string(i) + ".png")).string());
    write_png(paths.back(), imgs[i]);
  }
  const auto batch = det.detect_files(paths, 0.2f);
  ASSERT_EQ(batch.size(), 3u);
  for (size_t i = 0; i < imgs.size(); ++i) {
    SCOPED_TRACE(paths[i]);
    const Detections one = det.detect_file(paths[i], 0.2f);
    ASSERT_EQ(one.boxes.size(), batch[i].boxes.size());
    for (size_t k = 0; k < one.boxes.size(); ++k) {
      EXPECT_EQ(one.boxes[k].class_id, batch[i].boxes[k].class_id);
      // The CPU linear kernel blocks batch 1 and 3 differently: 1-ulp differences.
      EXPECT_NEAR(one.boxes[k].score, batch[i].boxes[k].score, 1e-6);
      EXPECT_NEAR(one.boxes[k].x_max, batch[i].boxes[k].x_max, 1e-4);
    }
    EXPECT_EQ(batch[i].image_width, imgs[i].width);
    expect_same(batch[i].boxes, m.expected(imgs[i], 0.2f), {"cat", "dog", "bird"});
  }
  // Pre-processed halves give the same.
  std::vector<DetectionInput> in;
  for (const auto& p : paths) in.push_back(det.preprocess_file(p));
  const auto halves = det.detect_preprocessed(in, 0.2f);
  for (size_t i = 0; i < imgs.size(); ++i) EXPECT_EQ(halves[i].boxes.size(), batch[i].boxes.size());
  in[1].pixels.pop_back();
  EXPECT_NE(testing::error_of([&] { det.detect_preprocessed(in); }).find("image 1 has"), std::string::npos);
}

TEST(Detector, BadFilesInABatchKeepTheOthers) {
  testing::TempDir tmp;
  const LinearDetector m(3);
  Detector det(m.engine());
  const std::string good = (tmp.path() / "good.png").string(), junk = (tmp.path() / "junk.png").string();
  write_png(good, random_image(12, 10, 4));
  std::ofstream(junk) << "not a png";
  const auto out = det.try_detect_files({junk, good, (tmp.path() / "missing.jpg").string()}, 0.f);
  ASSERT_EQ(out.size(), 3u);
  EXPECT_FALSE(out[0].ok);
  EXPECT_NE(out[0].error.find("junk.png"), std::string::npos);
  EXPECT_TRUE(out[1].ok);
  EXPECT_EQ(out[1].result.boxes.size(), 5u);
  EXPECT_FALSE(out[2].ok);
  EXPECT_NE(out[2].error.find("missing.jpg"), std::string::npos);
  EXPECT_THROW(det.detect_files({good, junk}), Error);
}

TEST(Detector, EqualScoresComeOutInTorchTopkOrder) {
  const LinearDetector m(4, /*tie=*/true);
  Detector det(m.engine({"a", "b", "c"}));
  const ImageU8 img = random_image(6, 8, 5);
  const Detections d = det.detect(img.width, img.height, img.rgb.data(), 0.f);
  ASSERT_EQ(d.boxes.size(), 5u);
  EXPECT_EQ(d.boxes[0].class_id, 1);  // sigmoid(50) == 1
  EXPECT_EQ(d.boxes[0].score, 1.f);
  // The two equal logits (query 1 and 3, class 2) have equal scores; the
  // order among them is torch.topk's (nth_element path: 5 * 64 > 15).
  std::vector<float> logits;
  ASSERT_NO_THROW({
    const auto e = m.engine();
    auto ctx = e->create_context();
    std::vector<float> px = resize_rescale(img, {8, 6, Interpolation::Bilinear, 1.f / 255.f});
    const auto outs = ctx->run({{"pixel_values", {1, 3, 8, 6}, px}});
    for (const auto& o : outs)
      if (o.name == "logits") logits = o.data;
  });
  std::vector<float> scores;
  for (float l : logits) scores.push_back(1.f / (1.f + std::exp(-l)));
  const auto order = torch_topk_order(scores, 5);
  for (size_t i = 0; i < 5 && i < d.boxes.size(); ++i) EXPECT_EQ(d.boxes[i].class_id, order[i] % 3) << i;
  EXPECT_EQ(logits[1 * 3 + 2], logits[3 * 3 + 2]);
}

TEST(Detector, RefusesOtherTasksAndMismatchedRuntimes) {
  // A classification bundle: the detector names the task, the classifier
  // refuses a detection bundle the same way.
  const auto cls = classification_bundle();
  const auto cls_engine = Engine::load_from_memory(cls.data(), cls.size());
  EXPECT_NE(testing::error_of([&] { Detector d(cls_engine); }).find("task is 'classification', not detection"),
            std::string::npos);
  const LinearDetector m(5);
  EXPECT_NE(testing::error_of([&] { Classifier c(m.engine()); }).find("task is 'detection', not classification"),
            std::string::npos);
  // runtime.json disagreeing with the engine: named before any image.
  auto bad = [&](auto edit) {
    LinearDetector mm(5);
    edit(mm.rt);
    const auto bytes = testing::cpu_detection_bundle(mm.g, mm.rt, {});
    return testing::error_of([&] { Detector d(Engine::load_from_memory(bytes.data(), bytes.size())); });
  };
  EXPECT_NE(bad([](DetectionRuntime& r) { r.num_queries = 7; }).find("'logits' is [1, 5, 3], expected [N, 7, 3]"),
            std::string::npos);
  EXPECT_NE(bad([](DetectionRuntime& r) { r.num_classes = 80; }).find("num_classes"), std::string::npos);
  EXPECT_NE(bad([](DetectionRuntime& r) { r.boxes = "boxes"; }).find("boxes 'boxes' is not an output"),
            std::string::npos);
  EXPECT_NE(bad([](DetectionRuntime& r) { r.preprocess.width = 640; }).find("pre-processing gives [N, 3, 8, 640]"),
            std::string::npos);
  EXPECT_NE(bad([](DetectionRuntime& r) { r.input = "images"; }).find("input 'images'"), std::string::npos);
  // Labels missing: class ids as text.
  Detector det(m.engine({}));
  const ImageU8 img = random_image(6, 8, 6);
  for (const auto& d : det.detect(img.width, img.height, img.rgb.data(), 0.f).boxes)
    EXPECT_EQ(d.label, std::to_string(d.class_id));
  EXPECT_THROW(det.detect(0, 8, img.rgb.data()), Error);
}

// ---------------------------------------------------- pre-processing --

TEST(DetectionPreprocess, RescaleIsTorchsFloat32Multiply) {
  ImageU8 img{256, 1, {}};
  for (int v = 0; v < 256; ++v) img.rgb.insert(img.rgb.end(), {uint8_t(v), uint8_t(255 - v), uint8_t(v / 2)});
  const auto chw = rescale_to_chw(img, 1.f / 255.f);
  for (int v = 0; v < 256; ++v) {
    EXPECT_EQ(chw[v], static_cast<float>(v) * (1.f / 255.f));
    EXPECT_EQ(chw[256 + v], static_cast<float>(255 - v) * (1.f / 255.f));
  }
  EXPECT_EQ(chw[255], 1.f);
  // Same size: no resampling at all.
  const ImageU8 same = resize_rescale_u8(img, {1, 256, Interpolation::Bilinear, 1.f / 255.f});
  EXPECT_EQ(same.rgb, img.rgb);
}

TEST(DetectionPreprocess, SquashResizeMatchesPil) {
  // tools/reference/make_image_fixtures.py --detection: PIL's
  // Image.resize((640, 640), BILINEAR) of the sample photos, stored as PNG.
  std::ifstream f(kFixtures / "images" / "detection" / "manifest.json");
  ASSERT_TRUE(f) << "missing fixture";
  const json man = json::parse(f);
  int checked = 0;
  for (const auto& c : man["cases"]) {
    SCOPED_TRACE(c["image"].get<std::string>());
    const ImageU8 src = decode_image(kFixtures / "images" / c["image"].get<std::string>());
    const ImageU8 ref = decode_image(kFixtures / "images" / c["reference"].get<std::string>());
    ResizeRescale p;
    p.width = c["width"];
    p.height = c["height"];
    const ImageU8 got = resize_rescale_u8(src, p);
    ASSERT_EQ(got.width, ref.width);
    ASSERT_EQ(got.height, ref.height);
    size_t diff = 0;
    for (size_t i = 0; i < got.rgb.size(); ++i) diff += got.rgb[i] != ref.rgb[i];
    EXPECT_EQ(diff, 0u) << "bytes differing from PIL";
    ++checked;
  }
  EXPECT_GE(checked, 4);
}

// ------------------------------------------------------------ drawing --

TEST(DetectionDraw, PngRoundTripsAndDrawingStaysInside) {
  testing::TempDir tmp;
  ImageU8 img = random_image(33, 21, 9);
  draw_rect(img, -5, 3, 40, 10, {255, 0, 0}, 2);  // partly outside: clipped
  EXPECT_EQ(img.rgb[(3 * 33 + 0) * 3 + 0], 255);
  EXPECT_EQ(img.rgb[(3 * 33 + 0) * 3 + 1], 0);
  draw_text(img, 2, 12, "Cat 0.97", {0, 255, 0});
  EXPECT_EQ(text_width("Cat 0.97"), 8 * 6 - 1);
  EXPECT_EQ(text_height(2), 14);
  const fs::path p = tmp.path() / "out.png";
  write_png(p, img);
  EXPECT_EQ(decode_image(p).rgb, img.rgb);
  // A failing write names the file and leaves nothing.
  const fs::path bad = tmp.path() / "no" / "such" / "dir.png";
  EXPECT_NE(testing::error_of([&] { write_png(bad, img); }).find("dir.png"), std::string::npos);
  EXPECT_FALSE(fs::exists(bad));
}

}  // namespace
}  // namespace kiln

// ------------------------------------------------------------- C ABI --

extern "C" int kiln_c_detect(const char* bundle, const char* image, float threshold, kiln_detection* out,
                             int capacity, int* count, char* label0, size_t label0_size);

namespace kiln {
namespace {

// A linear-head detection bundle and `n` PNG images in a temporary folder.
struct DetectorFiles {
  testing::TempDir tmp;
  LinearDetector m;
  fs::path bundle;
  std::vector<std::string> images;
  DetectorFiles(unsigned seed, int n) : m(seed) {
    bundle = tmp.path() / "det.bundle";
    write_file(bundle, testing::cpu_detection_bundle(m.g, m.rt, {"cat", "dog", "bird"}));
    for (int i = 0; i < n; ++i) {
      images.push_back((tmp.path() / ("im" + std::to_string(i) + ".png")).string());
      write_png(images.back(), random_image(60 + 13 * i, 40 + 7 * i, seed * 10 + static_cast<unsigned>(i)));
    }
  }
};

TEST(DetectorCApi, DetectsFromCWithTheCppNumbers) {
  DetectorFiles f(7, 1);
  const fs::path& bundle = f.bundle;
  const fs::path img = f.images[0];
  kiln_detection out[5];
  int count = -1;
  char label0[32] = {};
  ASSERT_EQ(kiln_c_detect(bundle.c_str(), img.c_str(), 0.1f, out, 5, &count, label0, sizeof label0), 0)
      << kiln_last_error();
  Detector det(Engine::load(bundle.string()));
  const Detections want = det.detect_file(img.string(), 0.1f);
  ASSERT_EQ(count, static_cast<int>(want.boxes.size()));
  ASSERT_GT(count, 0);
  EXPECT_EQ(std::string(label0), want.boxes[0].label);
  for (int i = 0; i < count; ++i) {
    EXPECT_EQ(out[i].class_id, want.boxes[i].class_id);
    EXPECT_EQ(out[i].score, want.boxes[i].score);
    EXPECT_EQ(out[i].x_min, want.boxes[i].x_min);
    EXPECT_EQ(out[i].y_max, want.boxes[i].y_max);
  }
}

TEST(DetectorCApi, ErrorsAreStatusesAndWriteNothing) {
  DetectorFiles f(8, 1);
  const fs::path& bundle = f.bundle;
  const fs::path img = f.images[0];
  testing::TempDir& tmp = f.tmp;
  kiln_engine* e = nullptr;
  ASSERT_EQ(kiln_engine_load(bundle.c_str(), nullptr, &e), KILN_OK) << kiln_last_error();
  kiln_detection out[5];
  for (auto& d : out) d.class_id = -7;
  int count = 0;
  // Threshold 0: all 5 queries; room for 2 -> usage error, count says 5, nothing written.
  EXPECT_EQ(kiln_detect_file(e, img.c_str(), 0.f, out, 2, &count), KILN_ERROR_USAGE);
  EXPECT_EQ(count, 5);
  EXPECT_EQ(out[0].class_id, -7);
  EXPECT_NE(std::string(kiln_last_error()).find("capacity 2"), std::string::npos);
  EXPECT_EQ(kiln_detect_file(e, img.c_str(), 0.f, nullptr, 0, &count), KILN_ERROR_USAGE);
  EXPECT_EQ(count, 5);
  EXPECT_EQ(kiln_detect_file(e, img.c_str(), 0.f, out, 5, &count), KILN_OK);
  EXPECT_EQ(kiln_detect_file(e, "/no/such.png", 0.f, out, 5, &count), KILN_ERROR_INPUT);
  EXPECT_NE(std::string(kiln_last_error()).find("/no/such.png"), std::string::npos);
  EXPECT_EQ(kiln_detect_file(nullptr, img.c_str(), 0.f, out, 5, &count), KILN_ERROR_USAGE);
  EXPECT_EQ(kiln_detect_file(e, img.c_str(), 0.f, out, -1, &count), KILN_ERROR_USAGE);
  EXPECT_EQ(kiln_detect_file(e, img.c_str(), 0.f, nullptr, 3, &count), KILN_ERROR_USAGE);
  EXPECT_EQ(kiln_engine_num_labels(e), 3);
  const char* label = nullptr;
  EXPECT_EQ(kiln_engine_label(e, 2, &label), KILN_OK);
  EXPECT_STREQ(label, "bird");
  EXPECT_EQ(kiln_engine_label(e, 3, &label), KILN_ERROR_USAGE);
  kiln_engine_free(e);
  // A classification bundle is an input error naming the task.
  const auto cls = classification_bundle();
  const fs::path cb = tmp.path() / "cls.bundle";
  write_file(cb, cls);
  ASSERT_EQ(kiln_engine_load(cb.c_str(), nullptr, &e), KILN_OK);
  EXPECT_EQ(kiln_detect_file(e, img.c_str(), 0.f, out, 5, &count), KILN_ERROR_INPUT);
  EXPECT_NE(std::string(kiln_last_error()).find("not detection"), std::string::npos);
  kiln_engine_free(e);
}

}  // namespace
}  // namespace kiln

// ---------------------------------------------------------- the CLI --

#include "cli_test_util.hpp"
#include "tasks/coco_eval.hpp"

namespace kiln {
namespace {

struct CliFixture : DetectorFiles {
  CliFixture() : DetectorFiles(2, 4) {}
};

TEST(DetectCli, TextJsonAndDrawnImages) {
  CliFixture f;
  Detector det(Engine::load(f.bundle.string()));
  const Detections want = det.detect_file(f.images[0], 0.2f);
  ASSERT_FALSE(want.boxes.empty());
  auto r = testing::run_kiln("detect " + f.bundle.string() + " --score-threshold 0.2 --json --image " + f.images[0] +
                             " " + f.images[1] + " --draw " + (f.tmp.path() / "drawn").string());
  ASSERT_EQ(r.code, 0) << r.all();
  const json j = json::parse(r.out);
  ASSERT_EQ(j.size(), 2u);
  EXPECT_EQ(j[0]["width"], 60);
  ASSERT_EQ(j[0]["detections"].size(), want.boxes.size());
  for (size_t k = 0; k < want.boxes.size(); ++k) {
    EXPECT_EQ(j[0]["detections"][k]["class_id"], want.boxes[k].class_id);
    EXPECT_EQ(j[0]["detections"][k]["label"], want.boxes[k].label);
    EXPECT_FLOAT_EQ(j[0]["detections"][k]["score"].get<float>(), want.boxes[k].score);
    EXPECT_FLOAT_EQ(j[0]["detections"][k]["box"][2].get<float>(), want.boxes[k].x_max);
  }
  // The drawn image: same size, changed where the best box's outline is.
  const ImageU8 src = decode_image(f.images[0]);
  const ImageU8 drawn = decode_image(f.tmp.path() / "drawn" / "im0.png");
  ASSERT_EQ(drawn.width, src.width);
  ASSERT_EQ(drawn.height, src.height);
  EXPECT_NE(drawn.rgb, src.rgb);
  EXPECT_TRUE(fs::exists(f.tmp.path() / "drawn" / "im1.png"));
  // Text: a line per image and per box; a bad image is named, the others still run, exit 2.
  std::ofstream(f.tmp.path() / "bad.png") << "nope";
  r = testing::run_kiln("detect " + f.bundle.string() + " --image " + (f.tmp.path() / "bad.png").string() + " " +
                        f.images[0] + " --score-threshold 0.2");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("bad.png"), std::string::npos);
  EXPECT_NE(r.out.find(f.images[0] + " (60x40): " + std::to_string(want.boxes.size())), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(want.boxes[0].label), std::string::npos);
  // A classification bundle is refused naming the task.
  const auto cls = classification_bundle();
  const fs::path cb = f.tmp.path() / "cls.bundle";
  write_file(cb, cls);
  r = testing::run_kiln("detect " + cb.string() + " --image " + f.images[0]);
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("not detection"), std::string::npos) << r.err;
}

TEST(DetectCli, CocoEvalOfItsOwnConfidentBoxesIsOne) {
  // Ground truth = the detector's own boxes above 0.5: every one of them is
  // found with IoU 1 ahead of the weaker ones, so AP is 1 wherever there is GT.
  CliFixture f;
  Detector det(Engine::load(f.bundle.string()));
  json gt = {{"images", json::array()}, {"annotations", json::array()},
             {"categories", {{{"id", 1}, {"name", "cat"}}, {{"id", 2}, {"name", "dog"}}, {{"id", 3}, {"name", "bird"}}}}};
  int ann = 1;
  for (size_t i = 0; i < f.images.size(); ++i) {
    const Detections d = det.detect_file(f.images[i], 0.5f);
    gt["images"].push_back({{"id", 10 + i}, {"file_name", fs::path(f.images[i]).filename().string()},
                            {"width", d.image_width}, {"height", d.image_height}});
    for (const auto& b : d.boxes) {
      const double w = double(b.x_max) - b.x_min, h = double(b.y_max) - b.y_min;
      gt["annotations"].push_back({{"id", ann++}, {"image_id", 10 + i}, {"category_id", b.class_id + 1},
                                   {"bbox", {b.x_min, b.y_min, w, h}}, {"area", w * h}, {"iscrowd", 0}});
    }
  }
  ASSERT_GT(ann, 3);
  const fs::path ann_file = f.tmp.path() / "gt.json", res_file = f.tmp.path() / "res.json";
  std::ofstream(ann_file) << gt.dump();
  auto r = testing::run_kiln("eval " + f.bundle.string() + " --coco " + ann_file.string() + " --batch 3 --json --quiet" +
                             " --detections-out " + res_file.string());
  ASSERT_EQ(r.code, 0) << r.all();
  const json j = json::parse(r.out);
  EXPECT_DOUBLE_EQ(j["map"].get<double>(), 1.0);
  EXPECT_DOUBLE_EQ(j["map50"].get<double>(), 1.0);
  EXPECT_EQ(j["images"], 4);
  EXPECT_EQ(j["category_mapping"], "name");
  // The results file holds what was evaluated.
  std::ifstream rf(res_file);
  const std::string text((std::istreambuf_iterator<char>(rf)), {});
  const auto dets = parse_coco_results(text, "res.json");
  EXPECT_EQ(dets.size(), j["detections"].get<size_t>());
  const auto again = coco_evaluate(parse_coco_dataset(gt.dump(), "gt.json"), dets);
  for (size_t s = 0; s < 12; ++s) EXPECT_DOUBLE_EQ(again.stats[s], j["stats"][s].get<double>()) << s;
  // --limit 2: only those images (and their GT) count; still 1.
  r = testing::run_kiln("eval " + f.bundle.string() + " --coco " + ann_file.string() + " --limit 2 --json --quiet");
  ASSERT_EQ(r.code, 0) << r.all();
  EXPECT_EQ(json::parse(r.out)["images"], 2);
  // Text output, and a size mismatch named.
  gt["images"][1]["width"] = 999;
  std::ofstream(ann_file) << gt.dump();
  r = testing::run_kiln("eval " + f.bundle.string() + " --coco " + ann_file.string() + " --quiet");
  EXPECT_EQ(r.code, 0) << r.all();
  EXPECT_NE(r.out.find("mAP50-95 "), std::string::npos);
  EXPECT_NE(r.out.find("the annotation file says 999x"), std::string::npos) << r.out;
  r = testing::run_kiln("eval " + f.bundle.string() + " --coco " + ann_file.string() + " --quiet --strict");
  EXPECT_EQ(r.code, 2);
  // A broken annotation file is named; --coco with a classification bundle names the task.
  std::ofstream(ann_file) << R"({"images": [{"id": 1}]})";
  r = testing::run_kiln("eval " + f.bundle.string() + " --coco " + ann_file.string());
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("gt.json: images[0]: missing key 'file_name'"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace kiln
