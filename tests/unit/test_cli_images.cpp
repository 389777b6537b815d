// `kiln classify` and `kiln eval` on real file sets through the binary: bad
// images reported and skipped, label files, --limit, top-1/top-5 against
// PyTorch's own logits, --strict, and the progress bar (only on a terminal).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>

#include "cli_test_util.hpp"
#include "core/file.hpp"

namespace kiln {
namespace {

namespace fs = std::filesystem;
const fs::path kRepo = fs::path(KILN_FIXTURES_DIR).parent_path().parent_path();
const fs::path kDigits = kRepo / "models" / "digits_resnet";

struct Result {
  int code;
  std::string out, err;
};

// stdout and stderr apart: the progress bar must stay off stdout.
Result kiln(const std::string& args) {
  const testing::CliRun r = testing::run_kiln(args);
  return {r.code, r.out, r.err};
}

nlohmann::json json_of(const Result& r) { return nlohmann::json::parse(r.out.substr(r.out.find_first_of("{["))); }

class CliImages : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = fs::temp_directory_path() / ("kiln_cli_images_" + std::to_string(::getpid()) + "_dir");
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    Result r = kiln("build " + kDigits.string() + " -o " + (dir_ / "digits.bundle").string());
    ASSERT_EQ(r.code, 0) << r.out << r.err;
    // A small ImageFolder: 3 classes x 4 images, plus two unreadable files.
    for (const char* c : {"1", "4", "8"}) {
      fs::create_directories(dir_ / "set" / c);
      int k = 0;
      for (const auto& e : fs::directory_iterator(kDigits / "heldout" / c))
        if (k++ < 4) fs::copy_file(e.path(), dir_ / "set" / c / e.path().filename());
    }
    fs::copy(dir_ / "set", dir_ / "clean", fs::copy_options::recursive);
    std::ofstream(dir_ / "set" / "4" / "zz_text.png") << "not an image at all";
    const auto png = read_file_bytes(fs::directory_iterator(kDigits / "heldout" / "8")->path());
    std::ofstream(dir_ / "set" / "8" / "zz_cut.png", std::ios::binary).write(reinterpret_cast<const char*>(png.data()), 40);
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }
  static std::string bundle() { return (dir_ / "digits.bundle").string(); }
  static fs::path dir_;
};
fs::path CliImages::dir_;

TEST_F(CliImages, ClassifyReportsEachBadImageAndContinues) {
  const std::string good1 = (kDigits / "samples" / "digit7_0094.png").string();
  const std::string good2 = (kDigits / "samples" / "digit3_0060.png").string();
  const std::string bad = (dir_ / "set" / "4" / "zz_text.png").string();
  Result r = kiln("classify " + bundle() + " --top-k 2 --image " + good1 + " " + bad + " " + good2);
  EXPECT_EQ(r.code, 2) << r.out << r.err;
  EXPECT_NE(r.out.find(good1), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(good2), std::string::npos) << r.out;  // after the bad one
  EXPECT_NE(r.err.find(bad + ": not a JPEG or PNG image"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("1 of 3 images could not be classified"), std::string::npos) << r.err;

  r = kiln("classify " + bundle() + " --json --image " + good1 + " " + bad + " " + good2);
  EXPECT_EQ(r.code, 2) << r.err;
  const auto j = json_of(r);
  ASSERT_EQ(j.size(), 3u);
  EXPECT_EQ(j[0]["top_k"][0]["label"], "7");
  EXPECT_EQ(j[1]["image"], bad);
  EXPECT_NE(j[1]["error"].get<std::string>().find(bad), std::string::npos);
  EXPECT_FALSE(j[1].contains("top_k"));
  EXPECT_EQ(j[2]["top_k"][0]["label"], "3");
  EXPECT_EQ(kiln("classify " + bundle() + " --image " + good1).code, 0);
}

TEST_F(CliImages, EvalListsUnreadableFilesAndLeavesThemOut) {
  Result r = kiln("eval " + bundle() + " --json --batch 5 --dataset " + (dir_ / "set").string());
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = json_of(r);
  EXPECT_EQ(j["images"], 12);
  EXPECT_EQ(j["failed"], 2);
  ASSERT_EQ(j["errors"].size(), 2u);
  EXPECT_EQ(j["errors"][0]["path"], (dir_ / "set" / "4" / "zz_text.png").string());
  EXPECT_NE(j["errors"][1]["error"].get<std::string>().find("zz_cut.png: truncated PNG data"), std::string::npos);
  // Same accuracy as the set without the bad files, whatever the batch size.
  const auto clean = json_of(kiln("eval " + bundle() + " --json --batch 16 --dataset " + (dir_ / "clean").string()));
  EXPECT_EQ(j["top1"], clean["top1"]);
  EXPECT_EQ(j["correct"], clean["correct"]);
  EXPECT_EQ(clean["errors"].size(), 0u);
  // Decode threads change nothing but speed: same counts, same error list.
  for (const char* t : {"1", "5"}) {
    const auto k = json_of(kiln("eval " + bundle() + " --json --batch 3 --threads " + t + " --dataset " + (dir_ / "set").string()));
    EXPECT_EQ(k["correct"], j["correct"]) << t;
    EXPECT_EQ(k["correct_top5"], j["correct_top5"]) << t;
    EXPECT_EQ(k["errors"], j["errors"]) << t;
  }
  // Text output lists them too.
  r = kiln("eval " + bundle() + " --dataset " + (dir_ / "set").string());
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("2 of 14 images could not be read"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("zz_text.png"), std::string::npos) << r.out;
  // --strict: the first one is fatal, named.
  r = kiln("eval " + bundle() + " --strict --dataset " + (dir_ / "set").string());
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.err.find("zz_text.png: not a JPEG or PNG image"), std::string::npos) << r.err;
}

// PyTorch's logits for every held-out image (reference_predictions.json) give
// its top-1 and top-5; kiln's eval over a label file must agree on both.
TEST_F(CliImages, EvalLabelFileTop1Top5MatchPyTorch) {
  const auto preds = nlohmann::json::parse(std::ifstream(kDigits / "reference_predictions.json"));
  std::ofstream labels(dir_ / "val.txt");
  labels << "# path class_id, relative to --images\n";
  size_t top1 = 0, top5 = 0;
  for (const auto& p : preds) {
    labels << p["file"].get<std::string>() << " " << p["label"].get<int>() << "\n";
    std::vector<float> logits = p["logits"].get<std::vector<float>>();
    std::vector<int> order(logits.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return logits[a] > logits[b]; });
    top1 += order[0] == p["label"].get<int>();
    top5 += std::find(order.begin(), order.begin() + 5, p["label"].get<int>()) != order.begin() + 5;
  }
  labels.close();
  Result r = kiln("eval " + bundle() + " --json --labels " + (dir_ / "val.txt").string() + " --images " + kDigits.string());
  ASSERT_EQ(r.code, 0) << r.err;
  auto j = json_of(r);
  EXPECT_EQ(j["images"], preds.size());
  EXPECT_EQ(j["correct"], top1);
  EXPECT_EQ(j["correct_top5"], top5);
  EXPECT_GE(j["top5"].get<double>(), j["top1"].get<double>());
  EXPECT_EQ(j["errors"].size(), 0u);
  EXPECT_EQ(j["preprocess"], "host");  // a CPU bundle
  EXPECT_GE(j["first_batch_seconds"].get<double>(), 0.0);
  EXPECT_LE(j["first_batch_seconds"].get<double>(), j["seconds"].get<double>());
  if (j["images"].get<size_t>() > j["batch"].get<size_t>())  // more than one batch: a steady rate
    EXPECT_GT(j["ms_per_image_after_first_batch"].get<double>(), 0.0);
  // --limit: the first N lines only.
  j = json_of(kiln("eval " + bundle() + " --json --limit 7 --labels " + (dir_ / "val.txt").string() + " --images " +
                   kDigits.string()));
  EXPECT_EQ(j["images"], 7);
  // Paths relative to the label file's own folder when --images is absent.
  std::ofstream(dir_ / "set" / "here.txt") << "1/" << fs::directory_iterator(dir_ / "clean" / "1")->path().filename().string()
                                           << " 1\n4/zz_text.png 4\n";
  j = json_of(kiln("eval " + bundle() + " --json --labels " + (dir_ / "set" / "here.txt").string()));
  EXPECT_EQ(j["images"], 1);
  EXPECT_EQ(j["failed"], 1);
}

TEST_F(CliImages, EvalLabelFileErrorsNameFileAndLine) {
  std::ofstream(dir_ / "bad.txt") << "heldout/0/0020.png 0\nheldout/0/0030.png zero\n";
  Result r = kiln("eval " + bundle() + " --labels " + (dir_ / "bad.txt").string() + " --images " + kDigits.string());
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find((dir_ / "bad.txt").string() + ":2: class id 'zero'"), std::string::npos) << r.err;
  std::ofstream(dir_ / "range.txt") << "heldout/0/0020.png 10\n";  // the model has 10 classes
  r = kiln("eval " + bundle() + " --labels " + (dir_ / "range.txt").string() + " --images " + kDigits.string());
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("range.txt:1: class id 10 is out of range"), std::string::npos) << r.err;
  // Usage: neither or both of --dataset/--labels, --images without --labels.
  EXPECT_EQ(kiln("eval " + bundle()).code, 1);
  EXPECT_EQ(kiln("eval " + bundle() + " --dataset a --labels b").code, 1);
  EXPECT_EQ(kiln("eval " + bundle() + " --dataset a --images b").code, 1);
  // Every image unreadable: no accuracy to report.
  std::ofstream(dir_ / "allbad.txt") << "set/4/zz_text.png 4\n";
  r = kiln("eval " + bundle() + " --labels " + (dir_ / "allbad.txt").string());
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("none of the 1 images could be read"), std::string::npos) << r.err;
}

TEST_F(CliImages, BenchTaskBreakdown) {
  const std::string img = (kDigits / "samples" / "digit7_0094.png").string();
  Result r = kiln("bench " + bundle() + " --iterations 10 --warmup 1 --json --image " + img);
  ASSERT_EQ(r.code, 0) << r.err;
  auto b = json_of(r)["results"][0]["task_breakdown_ms"];
  for (const char* k : {"decode", "preprocess", "engine"}) EXPECT_GT(b[k].get<double>(), 0.0) << k;
  EXPECT_GE(b["postprocess"].get<double>(), 0.0);
  EXPECT_EQ(b["input"], img);
  // The same call from the file's pixels decoded once: decode excluded, the image's own size.
  auto d = json_of(r)["results"][0]["task_decode_excluded_ms"];
  ASSERT_TRUE(d.is_object()) << r.out;
  EXPECT_GT(d["p50"].get<double>(), 0.0);
  EXPECT_GE(d["p95"].get<double>(), d["p50"].get<double>());
  EXPECT_EQ(d["input"].get<std::string>().rfind(img + " (", 0), 0u) << d["input"];
  // The synthetic default has nothing to decode.
  auto synthetic = json_of(kiln("bench " + bundle() + " --iterations 10 --warmup 1 --json"))["results"][0];
  EXPECT_TRUE(synthetic["task_decode_excluded_ms"].is_null());
  b = synthetic["task_breakdown_ms"];
  EXPECT_EQ(b["decode"].get<double>(), 0.0);
  EXPECT_GT(b["preprocess"].get<double>(), 0.0);
  // A bad --image is an input error naming it.
  r = kiln("bench " + bundle() + " --iterations 10 --warmup 0 --image " + (dir_ / "set" / "4" / "zz_text.png").string());
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("zz_text.png"), std::string::npos) << r.err;
}

TEST_F(CliImages, BuildQuietPrintsNothingOnStderr) {
  Result r = kiln("build " + kDigits.string() + " -o " + (dir_ / "q.bundle").string());
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("family: timm_resnet"), std::string::npos) << r.err;
  r = kiln("build " + kDigits.string() + " --quiet -o " + (dir_ / "q.bundle").string());
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.err, "");
  EXPECT_NE(r.out.find("built "), std::string::npos) << r.out;
}

// The bar is drawn on a terminal only: `script` gives the command a pty.
TEST_F(CliImages, EvalProgressOnlyOnATerminal) {
  const std::string eval = "eval " + bundle() + " --dataset " + (kDigits / "heldout").string();
  Result r = kiln(eval);  // stderr is a file here
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.err.find('\r'), std::string::npos) << r.err;
  EXPECT_EQ(r.out.find('\r'), std::string::npos);
  if (std::system("command -v script > /dev/null 2>&1") != 0) GTEST_SKIP() << "no `script` to make a pty";
  const fs::path log = dir_ / "tty.log";
  const auto run_tty = [&](const std::string& extra) {
    const std::string cmd = "script -qec \"" + std::string(KILN_BINARY) + " " + eval + extra + "\" /dev/null > " +
                            log.string() + " 2>&1 < /dev/null";
    EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
    std::ifstream f(log);
    return std::string((std::istreambuf_iterator<char>(f)), {});
  };
  std::string tty = run_tty("");
  EXPECT_NE(tty.find("eval ["), std::string::npos) << tty;
  EXPECT_NE(tty.find("360/360 100%"), std::string::npos) << tty;
  EXPECT_NE(tty.find("img/s"), std::string::npos) << tty;
  EXPECT_NE(tty.find("top-1 0.99"), std::string::npos) << tty;
  tty = run_tty(" --quiet");
  EXPECT_EQ(tty.find("eval ["), std::string::npos) << tty;
  tty = run_tty(" --json");
  EXPECT_EQ(tty.find("eval ["), std::string::npos) << tty;
  EXPECT_NE(tty.find("\"top5\""), std::string::npos) << tty;
}

}  // namespace
}  // namespace kiln
