// Bad input through every public door of a loaded engine — the C++ API, the
// C ABI and the CLI — and bundles changed under a running engine. Each case
// expects a clear error that names what is wrong and leaves the caller's
// buffers and output folders untouched. (Bad bundles, checkpoints, configs
// and images at load time are covered by test_bundle, test_checkpoint,
// test_hf_config, test_image and the fuzzers.)
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "bundle/builder.hpp"
#include "cli_test_util.hpp"
#include "bundle/bundle.hpp"
#include "core/npy.hpp"
#include "engine_test_util.hpp"
#include "kiln/kiln.h"
#include "kiln/kiln.hpp"

namespace kiln {
namespace {

namespace fs = std::filesystem;
using testing::error_of;
const fs::path kDigits = fs::path(KILN_FIXTURES_DIR).parent_path().parent_path() / "models" / "digits_resnet";
constexpr int64_t kSide = 32;  // the demo model's input is [N, 3, 32, 32]
constexpr size_t kPixels = 3 * kSide * kSide;

class Doors : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = fs::temp_directory_path() / ("kiln_doors_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    BuildOptions o;
    o.model = kDigits.string();
    o.max_batch = 4;
    build_bundle(o, bundle());
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }
  static fs::path bundle() { return dir_ / "digits_max4.bundle"; }
  static fs::path dir_;
};
fs::path Doors::dir_;

Tensor pixels(int64_t batch, float value = 0.25f) {
  return {"pixel_values", {batch, 3, kSide, kSide}, std::vector<float>(static_cast<size_t>(batch) * kPixels, value)};
}

void expect_input_error(const Error& e, const std::string& needle) {
  EXPECT_EQ(e.kind(), ErrorKind::Input) << e.what();
  EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
}

// ---------------------------------------------------------------- C++ API

TEST_F(Doors, CppWrongNameRankShapeSizeAndBatch) {
  auto engine = Engine::load(bundle().string());
  EXPECT_EQ(engine->max_batch(), 4);
  auto ctx = engine->create_context();
  Tensor t = pixels(1);
  t.name = "image";
  expect_input_error(error_of([&] { ctx->run({t}); }), "'image' is not an input");
  expect_input_error(error_of([&] { ctx->run({}); }), "'pixel_values' is missing");
  expect_input_error(error_of([&] { ctx->run({pixels(1), pixels(1)}); }), "given twice");
  expect_input_error(error_of([&] { ctx->run({{"pixel_values", {3, kSide, kSide}, std::vector<float>(kPixels)}}); }),
                     "expected [N,3,32,32]");
  expect_input_error(error_of([&] { ctx->run({{"pixel_values", {1, 3, kSide, kSide + 1}, std::vector<float>(kPixels)}}); }),
                     "has shape [1,3,32,33]");
  expect_input_error(error_of([&] { ctx->run({{"pixel_values", {1, 3, kSide, kSide}, std::vector<float>(kPixels - 1)}}); }),
                     "values for shape");
  expect_input_error(error_of([&] { ctx->run({{"pixel_values", {0, 3, kSide, kSide}, {}}}); }), "has shape [0,3,32,32]");
  expect_input_error(error_of([&] { ctx->run({pixels(5)}); }), "above this engine's largest batch 4");
  // The context still works after every refusal, with the same numbers.
  auto fresh = engine->create_context()->run({pixels(4)}).at(0).data;
  EXPECT_EQ(ctx->run({pixels(4)}).at(0).data, fresh);
}

TEST_F(Doors, MaxBatchIsABuildOptionRecordedInTheBundle) {
  BuildOptions o;
  o.model = kDigits.string();
  o.batch = 8;
  o.max_batch = 4;
  const Error e = error_of([&] { build_bundle(o, dir_ / "never.bundle"); });
  EXPECT_EQ(e.kind(), ErrorKind::Usage) << e.what();
  EXPECT_NE(std::string(e.what()).find("--max-batch"), std::string::npos) << e.what();
  EXPECT_FALSE(fs::exists(dir_ / "never.bundle"));
  const auto prov = nlohmann::json::parse(Bundle::open(bundle()).section_text("provenance.json"));
  EXPECT_EQ(prov["build"]["max_batch"], 4);
}

// ---------------------------------------------------------------- C ABI

TEST_F(Doors, CNullPointersAreUsageErrors) {
  kiln_engine* e = nullptr;
  EXPECT_EQ(kiln_engine_load(nullptr, nullptr, &e), KILN_ERROR_USAGE);
  EXPECT_EQ(kiln_engine_load(bundle().c_str(), nullptr, nullptr), KILN_ERROR_USAGE);
  EXPECT_EQ(kiln_engine_num_inputs(nullptr), 0);
  EXPECT_EQ(kiln_engine_num_outputs(nullptr), 0);
  EXPECT_EQ(kiln_engine_input(nullptr, 0, nullptr, nullptr, nullptr), KILN_ERROR_USAGE);
  EXPECT_EQ(kiln_engine_output(nullptr, 0, nullptr, nullptr, nullptr), KILN_ERROR_USAGE);
  kiln_context* c = nullptr;
  EXPECT_EQ(kiln_context_create(nullptr, &c), KILN_ERROR_USAGE);
  kiln_engine_free(nullptr);  // like free(NULL): nothing happens
  kiln_context_free(nullptr);

  ASSERT_EQ(kiln_engine_load(bundle().c_str(), nullptr, &e), KILN_OK) << kiln_last_error();
  EXPECT_EQ(kiln_context_create(e, nullptr), KILN_ERROR_USAGE);
  EXPECT_EQ(kiln_engine_input(e, -1, nullptr, nullptr, nullptr), KILN_ERROR_USAGE);
  EXPECT_EQ(kiln_engine_input(e, 1, nullptr, nullptr, nullptr), KILN_ERROR_USAGE);
  EXPECT_EQ(kiln_engine_output(e, 1, nullptr, nullptr, nullptr), KILN_ERROR_USAGE);
  ASSERT_EQ(kiln_context_create(e, &c), KILN_OK);
  std::vector<float> x(kPixels, 0.25f), y(10, -7.f);
  const int64_t shape[4] = {1, 3, kSide, kSide};
  size_t count = 0;
  EXPECT_EQ(kiln_context_run(nullptr, "pixel_values", x.data(), shape, 4, y.data(), 10, &count), KILN_ERROR_USAGE);
  EXPECT_EQ(kiln_context_run(c, nullptr, x.data(), shape, 4, y.data(), 10, &count), KILN_ERROR_USAGE);
  EXPECT_EQ(kiln_context_run(c, "pixel_values", nullptr, shape, 4, y.data(), 10, &count), KILN_ERROR_USAGE);
  EXPECT_EQ(kiln_context_run(c, "pixel_values", x.data(), nullptr, 4, y.data(), 10, &count), KILN_ERROR_USAGE);
  EXPECT_EQ(kiln_context_run(c, "pixel_values", x.data(), shape, 0, y.data(), 10, &count), KILN_ERROR_USAGE);
  EXPECT_EQ(kiln_context_run(c, "pixel_values", x.data(), shape, 9, y.data(), 10, &count), KILN_ERROR_USAGE);
  EXPECT_EQ(kiln_context_run(c, "pixel_values", x.data(), shape, 4, y.data(), 10, nullptr), KILN_ERROR_USAGE);
  EXPECT_EQ(y, std::vector<float>(10, -7.f)) << "a refused call wrote into the output buffer";
  int ids[3] = {-1, -1, -1}, n = -1;
  float scores[3] = {-1, -1, -1};
  const std::string img = (kDigits / "samples" / "digit7_0094.png").string();
  EXPECT_EQ(kiln_classify_file(nullptr, img.c_str(), 3, ids, scores, &n), KILN_ERROR_USAGE);
  EXPECT_EQ(kiln_classify_file(e, nullptr, 3, ids, scores, &n), KILN_ERROR_USAGE);
  EXPECT_EQ(kiln_classify_file(e, img.c_str(), 0, ids, scores, &n), KILN_ERROR_USAGE);
  EXPECT_EQ(kiln_classify_file(e, img.c_str(), 3, nullptr, scores, &n), KILN_ERROR_USAGE);
  EXPECT_EQ(kiln_classify_file(e, img.c_str(), 3, ids, nullptr, &n), KILN_ERROR_USAGE);
  EXPECT_EQ(kiln_classify_file(e, img.c_str(), 3, ids, scores, nullptr), KILN_ERROR_USAGE);
  EXPECT_EQ(n, -1);
  EXPECT_EQ(ids[0], -1);
  kiln_context_free(c);
  kiln_engine_free(e);
}

TEST_F(Doors, CShapesAreCheckedBeforeTheBufferIsReadAndOutputsBeforeWriting) {
  kiln_engine* e = nullptr;
  kiln_context* c = nullptr;
  ASSERT_EQ(kiln_engine_load(bundle().c_str(), nullptr, &e), KILN_OK) << kiln_last_error();
  ASSERT_EQ(kiln_context_create(e, &c), KILN_OK);
  // One image's worth of input. Shapes that claim more (a larger batch, a
  // product that overflows int64) must be refused without reading past it:
  // under ASan an over-read here fails the test.
  std::vector<float> x(kPixels, 0.25f), y(10, -7.f);
  size_t count = 0;
  auto run = [&](std::vector<int64_t> shape, const char* name = "pixel_values", size_t cap = 10) {
    return kiln_context_run(c, name, x.data(), shape.data(), static_cast<int>(shape.size()), y.data(), cap, &count);
  };
  EXPECT_EQ(run({5, 3, kSide, kSide}), KILN_ERROR_INPUT);
  EXPECT_NE(std::string(kiln_last_error()).find("expected [1..4,3,32,32]"), std::string::npos) << kiln_last_error();
  EXPECT_EQ(run({int64_t{1} << 40, int64_t{1} << 40, int64_t{1} << 40, 8}), KILN_ERROR_INPUT);
  EXPECT_EQ(run({1, 3, kSide, -kSide}), KILN_ERROR_INPUT);
  EXPECT_EQ(run({1, 3 * kSide * kSide}), KILN_ERROR_INPUT);
  EXPECT_EQ(run({1, 3, kSide, kSide}, "image"), KILN_ERROR_INPUT);
  EXPECT_NE(std::string(kiln_last_error()).find("'image'"), std::string::npos) << kiln_last_error();
  EXPECT_EQ(y, std::vector<float>(10, -7.f));
  // Undersized output: a usage error, the size needed in *count, nothing written.
  EXPECT_EQ(run({1, 3, kSide, kSide}, "pixel_values", 9), KILN_ERROR_USAGE);
  EXPECT_EQ(count, 10u);
  EXPECT_NE(std::string(kiln_last_error()).find("needs 10 floats"), std::string::npos) << kiln_last_error();
  EXPECT_EQ(y, std::vector<float>(10, -7.f)) << "an undersized output buffer was written";
  count = 0;
  EXPECT_EQ(kiln_context_run(c, "pixel_values", x.data(), std::vector<int64_t>{1, 3, kSide, kSide}.data(), 4, nullptr, 0,
                             &count),
            KILN_ERROR_USAGE);  // NULL output: asks for the size
  EXPECT_EQ(count, 10u);
  EXPECT_EQ(run({1, 3, kSide, kSide}), KILN_OK) << kiln_last_error();
  EXPECT_NE(y, std::vector<float>(10, -7.f));
  kiln_context_free(c);
  kiln_engine_free(e);
}

// ---------------------------------------------------------------- bundles under a running engine

// The bundle is read whole at load, never mapped, so truncating or rewriting
// the file afterwards (a mapped file would raise SIGBUS on the next weight
// read) changes nothing the engine computes.
TEST_F(Doors, BundleTruncatedOrRewrittenAfterLoadChangesNothing) {
  const fs::path copy = dir_ / "moving.bundle";
  fs::copy_file(bundle(), copy, fs::copy_options::overwrite_existing);
  auto engine = Engine::load(copy.string());
  auto ctx = engine->create_context();
  const auto before = ctx->run({pixels(2, 0.5f)}).at(0).data;
  fs::resize_file(copy, 100);
  EXPECT_EQ(ctx->run({pixels(2, 0.5f)}).at(0).data, before);
  {
    std::ofstream f(copy, std::ios::binary | std::ios::trunc);
    const std::string junk(static_cast<size_t>(fs::file_size(bundle())), '\x5a');
    f << junk;
  }
  EXPECT_EQ(ctx->run({pixels(2, 0.5f)}).at(0).data, before);
  EXPECT_EQ(engine->create_context()->run({pixels(2, 0.5f)}).at(0).data, before);
  // The damaged file itself is refused, naming it.
  const Error e = error_of([&] { Engine::load(copy.string()); });
  EXPECT_EQ(e.kind(), ErrorKind::Input);
  EXPECT_NE(std::string(e.what()).find(copy.string()), std::string::npos) << e.what();
}

// A rewritten provenance.json: a bundle by another kiln version with the same
// format loads (the format number is the compatibility contract), a newer
// format is refused naming the versions, and an unknown engine switch (from
// a newer kiln) is refused naming it.
TEST_F(Doors, BundlesFromOtherKilnVersions) {
  const Bundle b = Bundle::open(bundle());
  auto rewrite = [&](const fs::path& out, BundleInfo info, const nlohmann::json& provenance) {
    BundleWriter w(info);
    for (const auto& s : b.section_names()) {
      Blob blob = b.section(s);
      if (s == "provenance.json") w.add_section(s, provenance.dump());
      else w.add_section(s, std::vector<uint8_t>(blob.data, blob.data + blob.size));
    }
    w.write(out);
  };
  auto prov = nlohmann::json::parse(b.section_text("provenance.json"));
  BundleInfo older = b.info();
  older.kiln_version = "0.0.9";
  prov["kiln_version"] = "0.0.9";
  rewrite(dir_ / "older.bundle", older, prov);
  EXPECT_EQ(Engine::load((dir_ / "older.bundle").string())->create_context()->run({pixels(1)}).at(0).data,
            Engine::load(bundle().string())->create_context()->run({pixels(1)}).at(0).data);

  auto newer = prov;
  newer["build"]["switches"]["fuse_everything"] = "on";
  rewrite(dir_ / "newer_switch.bundle", b.info(), newer);
  expect_input_error(error_of([&] { Engine::load((dir_ / "newer_switch.bundle").string()); }),
                     "unknown engine switch 'fuse_everything'");
  auto bad_batch = prov;
  bad_batch["build"]["max_batch"] = 0;
  rewrite(dir_ / "bad_batch.bundle", b.info(), bad_batch);
  expect_input_error(error_of([&] { Engine::load((dir_ / "bad_batch.bundle").string()); }), "max_batch");
  for (const char* key : {"precision", "opt_level", "allow_tf32"}) {
    auto bad = prov;
    bad["build"][key] = nlohmann::json::array({1, 2});
    rewrite(dir_ / "bad_field.bundle", b.info(), bad);
    expect_input_error(error_of([&] { Engine::load((dir_ / "bad_field.bundle").string()); }), std::string("build.") + key);
  }
}

// ---------------------------------------------------------------- CLI

struct CliResult {
  int code;
  std::string out;
};
CliResult kiln_cli(const std::string& args) {
  const testing::CliRun r = testing::run_kiln(args);
  return {r.code, r.all()};
}

TEST_F(Doors, CliRunRefusesWrongNameDtypeShapeAndBatchWritingNothing) {
  auto npy = [&](const std::string& name, DType dt, const Shape& shape) {
    const fs::path p = dir_ / name;
    const size_t n = static_cast<size_t>(shape_numel(shape));
    if (dt == DType::I32) write_npy(p, HostTensor{dt, shape, Blob::from_vector(std::vector<uint8_t>(n * 4, 1))});
    else write_npy(p, HostTensor::from_f32_as(dt, shape, std::vector<float>(n, 0.25f)));
    return p.string();
  };
  const std::string good = npy("good.npy", DType::F32, {1, 3, kSide, kSide});
  struct Case {
    std::string input, needle;
  };
  const std::vector<Case> cases = {
      {"image=" + good, "'image' is not an input"},
      {"pixel_values=" + npy("i32.npy", DType::I32, {1, 3, kSide, kSide}), "dtype i32"},
      {"pixel_values=" + npy("rank3.npy", DType::F32, {3, kSide, kSide}), "expected [N,3,32,32]"},
      {"pixel_values=" + npy("wide.npy", DType::F32, {1, 3, kSide, kSide + 2}), "has shape [1,3,32,34]"},
      {"pixel_values=" + npy("batch5.npy", DType::F32, {5, 3, kSide, kSide}), "largest batch 4"},
      {"pixel_values=" + (dir_ / "missing.npy").string(), "missing.npy"},
      {"pixel_values", "NAME=FILE.npy"},
  };
  for (const Case& c : cases) {
    const fs::path out = dir_ / "out_never";
    const CliResult r = kiln_cli("run " + bundle().string() + " --input " + c.input + " --output-dir " + out.string());
    EXPECT_TRUE(r.code == 1 || r.code == 2) << c.input << ": exit " << r.code << "\n" << r.out;
    EXPECT_NE(r.out.find(c.needle), std::string::npos) << c.input << ":\n" << r.out;
    EXPECT_FALSE(fs::exists(out)) << c.input << ": the output folder was made";
  }
  EXPECT_EQ(kiln_cli("run " + bundle().string() + " --input pixel_values=" + good + " --output-dir " +
                     (dir_ / "out_ok").string())
                .code,
            0);
}

}  // namespace
}  // namespace kiln
