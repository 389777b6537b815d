// What `kiln eval` and `kiln classify` stand on: per-image outcomes of a
// batch (a bad file does not lose the others), the label-file reader, the
// decode-ahead queue (input order, per-item errors) and the progress bar.
#include <gtest/gtest.h>

#include <atomic>
#include <fstream>
#include <sstream>
#include <thread>

#include "bundle/builder.hpp"
#include "core/error.hpp"
#include "core/file.hpp"
#include "core/progress.hpp"
#include "image/image.hpp"
#include "runtime/engine_impl.hpp"
#include "tasks/runtime_config.hpp"
#include "kiln/kiln.hpp"
#include "tasks/eval_set.hpp"
#include "tasks/preprocess_ahead.hpp"
#include "temp_dir.hpp"

namespace kiln {
namespace {

namespace fs = std::filesystem;
const fs::path kDigits = fs::path(KILN_FIXTURES_DIR).parent_path().parent_path() / "models" / "digits_resnet";

// The digits demo model built into a CPU bundle in `tmp`, loaded.
std::shared_ptr<const Engine> load_digits(const testing::TempDir& tmp) {
  BuildOptions b;
  b.model = kDigits.string();
  build_bundle(b, tmp.path() / "d.bundle");
  return Engine::load((tmp.path() / "d.bundle").string());
}

// ------------------------------------------------------------ outcomes --

TEST(ClassifierOutcomes, BadImagesInABatchKeepTheOthers) {
  testing::TempDir tmp;
  BuildOptions b;
  b.model = kDigits.string();
  build_bundle(b, tmp.path() / "d.bundle");
  Classifier clf(Engine::load((tmp.path() / "d.bundle").string()));
  const std::string a = (kDigits / "heldout" / "0" / "0020.png").string();
  const std::string c = (kDigits / "heldout" / "7" / "0094.png").string();
  std::ofstream(tmp.path() / "junk.png") << "not an image";
  const auto png = read_file_bytes(a);
  std::ofstream(tmp.path() / "cut.png", std::ios::binary).write(reinterpret_cast<const char*>(png.data()), png.size() / 2);
  const std::string junk = (tmp.path() / "junk.png").string(), cut = (tmp.path() / "cut.png").string();
  const std::string missing = (tmp.path() / "missing.jpg").string();

  const auto out = clf.try_classify_files({junk, a, cut, missing, c}, 3);
  ASSERT_EQ(out.size(), 5u);
  const auto want = clf.classify_files({a, c}, 3);  // the good ones alone, one batch
  EXPECT_TRUE(out[1].ok);
  EXPECT_TRUE(out[4].ok);
  EXPECT_EQ(out[1].result.logits, want[0].logits);  // same numbers as without the bad files
  EXPECT_EQ(out[4].result.logits, want[1].logits);
  for (size_t i : {0u, 2u, 3u}) {
    EXPECT_FALSE(out[i].ok);
    EXPECT_EQ(out[i].error.rfind(out[i].path + ": ", 0), 0u) << out[i].error;  // names the file
  }
  EXPECT_NE(out[2].error.find("truncated"), std::string::npos) << out[2].error;
  clf.try_classify_files({junk, a}, 3);
  EXPECT_GT(clf.last_timings().decode_ms, 0.0);
  EXPECT_GT(clf.last_timings().preprocess_ms, 0.0);
  EXPECT_GT(clf.last_timings().engine_ms, 0.0);
  EXPECT_EQ(clf.last_timings().copy_ms, 0.0);  // host pre-processing: the engine call holds its copies
  clf.try_classify_files({junk}, 3);
  EXPECT_EQ(clf.last_timings().engine_ms, 0.0);  // nothing decoded, no engine call
  // The throwing batch API still stops at the first bad file.
  EXPECT_THROW(clf.classify_files({a, junk}), Error);
  // All bad: outcomes, no engine call, no exception.
  EXPECT_FALSE(clf.try_classify_files({junk})[0].ok);
  // The two halves give the batch API's numbers.
  std::vector<float> px = clf.preprocess_file(a);
  const auto c2 = clf.preprocess_file(c);
  px.insert(px.end(), c2.begin(), c2.end());
  EXPECT_EQ(clf.classify_preprocessed(px, 2, 3)[1].logits, want[1].logits);
  EXPECT_THROW(clf.classify_preprocessed(std::vector<float>(7), 1), Error);
  // prepare_file / classify_prepared (kiln eval's halves): a CPU engine
  // pre-processes on the host, with the same numbers.
  EXPECT_FALSE(clf.preprocesses_on_device());
  const auto prepared = clf.classify_prepared({clf.prepare_file(a), clf.prepare_file(c)}, 3);
  EXPECT_EQ(prepared[0].logits, want[0].logits);
  EXPECT_EQ(prepared[1].logits, want[1].logits);
  EXPECT_THROW(clf.prepare_file(junk), Error);
  EXPECT_THROW(clf.classify_prepared({nullptr}), Error);
}

// run_images (the pre-processing entry of the runtime; on CPU engines the
// host executor of the plans): the same logits as the engine fed
// run_preprocess_plan's floats, and every mismatch between images, plans and
// the engine's input refused naming what is wrong, before anything runs.
// The classifier caches pre-processing plans per image size (the last 8):
// twelve sizes, each seen twice in an order that evicts and revisits, give
// the logits of the uncached pre-processing (timm_preprocess) every time.
TEST(ClassifierPlans, CachedPlansGiveTheUncachedNumbersAcrossEvictions) {
  testing::TempDir tmp;
  auto engine = load_digits(tmp);
  Classifier clf(engine);
  const ClassificationRuntime rt = parse_classification_runtime(nlohmann::json::parse(engine->runtime_json()), "runtime.json");
  const TimmPreprocess pre = timm_preprocess_of(rt.preprocess);
  const ImageU8 src = decode_image(kDigits / "heldout" / "7" / "0094.png");
  std::vector<ImageU8> sized;
  for (int i = 0; i < 12; ++i) sized.push_back(resize_pil(src, 20 + 7 * i, 45 - 2 * i, Interpolation::Bilinear));
  for (int round = 0; round < 2; ++round)
    for (int j = 0; j < 12; ++j) {
      const ImageU8& img = sized[(j * 5 + round) % 12];
      SCOPED_TRACE(std::to_string(img.width) + "x" + std::to_string(img.height));
      const auto want = clf.classify_preprocessed(timm_preprocess(img, pre), 1, 3)[0];
      const auto got = clf.classify_rgb(img.width, img.height, img.rgb.data(), 3);
      EXPECT_EQ(got.logits, want.logits);
      ASSERT_EQ(got.top_k.size(), want.top_k.size());
      for (size_t k = 0; k < want.top_k.size(); ++k) EXPECT_EQ(got.top_k[k].class_id, want.top_k[k].class_id);
    }
}

TEST(RunImages, HostPathEqualsTheEngineOnThePlansFloatsAndChecksItsInputs) {
  testing::TempDir tmp;
  auto engine = load_digits(tmp);
  auto ctx = engine->create_context();
  EXPECT_FALSE(preprocesses_on_device(*ctx));
  const ClassificationRuntime rt = parse_classification_runtime(nlohmann::json::parse(engine->runtime_json()), "runtime.json");
  const TimmPreprocess pre = timm_preprocess_of(rt.preprocess);
  const ImageU8 a = decode_image(kDigits / "heldout" / "0" / "0020.png");
  const ImageU8 c = decode_image(kDigits / "heldout" / "7" / "0094.png");
  const PreprocessPlan pa = plan_timm_preprocess(a.width, a.height, pre), pc = plan_timm_preprocess(c.width, c.height, pre);
  const auto got = run_images(*ctx, {view_of(a), view_of(c)}, {&pa, &pc});
  std::vector<float> px = run_preprocess_plan(a, pa);
  const std::vector<float> pxc = run_preprocess_plan(c, pc);
  px.insert(px.end(), pxc.begin(), pxc.end());
  const auto want = ctx->run({{rt.input, {2, 3, pre.height, pre.width}, px}});
  ASSERT_EQ(got.size(), want.size());
  EXPECT_EQ(got[0].data, want[0].data);
  auto error_of = [&](const std::vector<RgbView>& imgs, const std::vector<const PreprocessPlan*>& plans) {
    try {
      run_images(*ctx, imgs, plans);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const ImageU8 odd{a.width + 3, a.height, std::vector<uint8_t>(3ULL * (a.width + 3) * a.height, 7)};
  EXPECT_NE(error_of({view_of(odd)}, {&pa}).find("does not match its plan"), std::string::npos);  // another size's plan
  TimmPreprocess bigger = pre;
  bigger.height += 8;
  const PreprocessPlan wrong = plan_timm_preprocess(a.width, a.height, bigger);
  EXPECT_NE(error_of({view_of(a)}, {&wrong}).find("takes"), std::string::npos) << error_of({view_of(a)}, {&wrong});
  EXPECT_NE(error_of({view_of(a), view_of(c)}, {&pa}).find("2 images, 1 plans"), std::string::npos);
  EXPECT_NE(error_of({}, {}).find("0 images"), std::string::npos);
}

// ---------------------------------------------------------- label file --

EvalSet labels_from(const testing::TempDir& tmp, const std::string& text, const fs::path& images = {},
                    int classes = 0) {
  std::ofstream(tmp.path() / "val.txt", std::ios::binary) << text;
  return read_label_file(tmp.path() / "val.txt", images, classes);
}

std::string label_error(const testing::TempDir& tmp, const std::string& text, int classes = 0) {
  try {
    labels_from(tmp, text, {}, classes);
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Input);
    return e.what();
  }
  return "no error";
}

TEST(LabelFile, PathsIdsCommentsAndBases) {
  testing::TempDir tmp;
  EvalSet s = labels_from(tmp, "# ImageNet style\nILSVRC2012_val_00000001.JPEG 65\r\n\n  sub/my photo.png\t 3  \n/abs/x.jpg 0\n");
  ASSERT_EQ(s.items.size(), 3u);
  EXPECT_EQ(s.items[0].path, (tmp.path() / "ILSVRC2012_val_00000001.JPEG").string());
  EXPECT_EQ(s.items[0].class_id, 65);
  EXPECT_EQ(s.items[1].path, (tmp.path() / "sub/my photo.png").string());  // spaces kept
  EXPECT_EQ(s.items[1].class_id, 3);
  EXPECT_EQ(s.items[2].path, "/abs/x.jpg");
  EXPECT_EQ(s.classes, 3u);
  s = labels_from(tmp, "a.png 1\n", "/data/val");
  EXPECT_EQ(s.items[0].path, "/data/val/a.png");
}

TEST(LabelFile, BadLinesNameFileAndLine) {
  testing::TempDir tmp;
  const std::string f = (tmp.path() / "val.txt").string();
  EXPECT_EQ(label_error(tmp, "a.png 1\nb.png\n"), f + ":2: expected 'path class_id', got 'b.png'");
  EXPECT_EQ(label_error(tmp, "a.png 1\n\n# c\nb.png x7\n"), f + ":4: class id 'x7' is not a non-negative integer");
  EXPECT_NE(label_error(tmp, "a.png -1\n").find(":1: class id '-1'"), std::string::npos);
  EXPECT_NE(label_error(tmp, "a.png 2.5\n").find(":1: class id '2.5'"), std::string::npos);
  EXPECT_NE(label_error(tmp, "a.png 99999999999\n").find(":1:"), std::string::npos);
  EXPECT_EQ(label_error(tmp, "a.png 3\nb.png 10\n", 10), f + ":2: class id 10 is out of range: the model has 10 classes");
  EXPECT_EQ(label_error(tmp, "# only a comment\n"), f + ": no 'path class_id' lines");
  try {
    read_label_file(tmp.path() / "absent.txt", {}, 0);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("absent.txt"), std::string::npos);
  }
}

TEST(ImageFolderSet, SortedClassesAndImages) {
  const EvalSet s = read_image_folder(kDigits / "heldout", {});
  EXPECT_EQ(s.classes, 10u);
  EXPECT_EQ(s.items.size(), 360u);
  EXPECT_EQ(s.items.front().class_id, 0);
  EXPECT_EQ(s.items.back().class_id, 9);
  EXPECT_TRUE(std::is_sorted(s.items.begin(), s.items.end(),
                             [](const EvalItem& a, const EvalItem& b) { return a.path < b.path; }));
  EXPECT_THROW(read_image_folder(kDigits / "samples", {}), Error);  // no class folders
}

// ------------------------------------------------------- decode ahead --

TEST(PreprocessAhead, InOrderBoundedAndPerItemErrors) {
  std::atomic<int> started{0};
  int max_ahead = 0;
  std::mutex mu;
  size_t consumed = 0;
  PreprocessAhead ahead(
      50,
      [&](size_t i) {
        started++;
        {
          std::lock_guard<std::mutex> lock(mu);
          max_ahead = std::max(max_ahead, static_cast<int>(i) - static_cast<int>(consumed));
        }
        // Later items finish first, so order must come from the queue.
        std::this_thread::sleep_for(std::chrono::microseconds(50 * (i % 5 == 0 ? 20 : 1)));
        if (i % 7 == 3) fail_input("img", i, ".png: not a JPEG or PNG image");
        return std::vector<float>{static_cast<float>(i)};
      },
      4, 6);
  for (size_t i = 0; i < 50; ++i) {
    auto it = ahead.take(i);
    if (i % 7 == 3) {
      EXPECT_EQ(it.error, "img" + std::to_string(i) + ".png: not a JPEG or PNG image");
      EXPECT_TRUE(it.pixels.empty());
    } else {
      ASSERT_EQ(it.pixels.size(), 1u);
      EXPECT_EQ(it.pixels[0], static_cast<float>(i));
    }
    std::lock_guard<std::mutex> lock(mu);
    consumed = i + 1;
  }
  EXPECT_EQ(started.load(), 50);
  EXPECT_LE(max_ahead, 6);  // never more than the window ahead of the consumer
}

TEST(PreprocessAhead, RuntimeErrorsReachTheCallerAndEarlyExitJoins) {
  {
    PreprocessAhead ahead(3, [](size_t i) -> std::vector<float> {
      if (i == 1) fail_runtime("device lost");
      return {1.f};
    }, 2, 2);
    EXPECT_NO_THROW(ahead.take(0));
    EXPECT_THROW(ahead.take(1), Error);
  }
  // Destroyed with most items never taken: workers stop, nothing hangs.
  PreprocessAhead many(1000, [](size_t) { return std::vector<float>(10); }, 3, 4);
  many.take(0);
}

// ------------------------------------------------------- progress bar --

TEST(ProgressBar, FormatHasCountRateAndEta) {
  EXPECT_EQ(ProgressBar::format("eval", 0, 360, 0.0, "img", 10), "eval [          ] 0/360 0%");
  EXPECT_EQ(ProgressBar::format("eval", 90, 360, 2.0, "img", 10), "eval [##        ] 90/360 25% 45.0 img/s ETA 0:06");
  EXPECT_EQ(ProgressBar::format("eval", 360, 360, 3.0, "img", 10), "eval [##########] 360/360 100% 120 img/s in 0:03");
  EXPECT_EQ(ProgressBar::format("tactics", 5, 50000, 1.0, "node", 4), "tactics [    ] 5/50000 0% 5.0 node/s ETA 2:46:39");
  EXPECT_EQ(ProgressBar::format("scan", 7, 0, 1.0, "it"), "scan 7 7.0 it/s");  // unknown total
}

TEST(ProgressBar, DrawsOnlyWhenEnabled) {
  std::ostringstream off, on;
  {
    ProgressBar bar("eval", 3, false, off);
    for (int i = 1; i <= 3; ++i) bar.update(i);
    bar.finish();
  }
  EXPECT_EQ(off.str(), "");
  {
    ProgressBar bar("eval", 3, true, on, "img");
    bar.update(1);  // drawn or throttled, depending on the clock
    bar.update(3);  // the last item always draws
    bar.finish();
  }
  const std::string s = on.str();
  EXPECT_EQ(s.front(), '\r');
  EXPECT_NE(s.find("3/3 100%"), std::string::npos) << s;
  EXPECT_EQ(s.find("3/3"), s.rfind("3/3")) << s;  // finish does not draw the same line again
  EXPECT_EQ(s.back(), '\n');
  std::ostringstream idle;
  ProgressBar("tactics", 0, true, idle).finish();  // never updated: nothing at all
  EXPECT_EQ(idle.str(), "");
}

}  // namespace
}  // namespace kiln
