// The C ABI, driven from C (c_api_check.c) and its error paths from here.
#include <gtest/gtest.h>

#include <filesystem>

#include "bundle/builder.hpp"
#include "kiln/kiln.h"
#include "kiln/kiln.hpp"

extern "C" int kiln_c_smoke(const char* bundle, const char* image, int* top1, float* logits, size_t logits_capacity,
                            size_t* logits_count);

namespace kiln {
namespace {

namespace fs = std::filesystem;
const fs::path kDigits = fs::path(KILN_FIXTURES_DIR).parent_path().parent_path() / "models" / "digits_resnet";

fs::path digits_bundle() {
  fs::path out = fs::temp_directory_path() / ("kiln_capi_" + std::to_string(::getpid()) + ".bundle");
  if (!fs::exists(out)) {
    BuildOptions o;
    o.model = kDigits.string();
    build_bundle(o, out);
  }
  return out;
}

TEST(CApi, RunsAndClassifiesFromC) {
  const fs::path b = digits_bundle();
  int top1 = -1;
  float logits[10];
  size_t count = 0;
  ASSERT_EQ(kiln_c_smoke(b.c_str(), (kDigits / "samples" / "digit7_0094.png").c_str(), &top1, logits, 10, &count), 0)
      << kiln_last_error();
  EXPECT_EQ(top1, 7);
  EXPECT_EQ(count, 10u);
  // Same numbers as the C++ API.
  auto ctx = Engine::load(b.string())->create_context();
  auto out = ctx->run({{"pixel_values", {1, 3, 32, 32}, std::vector<float>(3 * 32 * 32, 0.25f)}});
  for (size_t i = 0; i < 10; ++i) EXPECT_EQ(logits[i], out[0].data[i]);
}

TEST(CApi, ErrorsAreStatusesWithMessages) {
  kiln_engine* e = nullptr;
  EXPECT_EQ(kiln_engine_load("/no/such.bundle", nullptr, &e), KILN_ERROR_INPUT);
  EXPECT_EQ(e, nullptr);
  EXPECT_NE(std::string(kiln_last_error()).find("/no/such.bundle"), std::string::npos) << kiln_last_error();
  EXPECT_EQ(kiln_engine_load(nullptr, nullptr, &e), KILN_ERROR_USAGE);

  ASSERT_EQ(kiln_engine_load(digits_bundle().c_str(), nullptr, &e), KILN_OK) << kiln_last_error();
  kiln_context* c = nullptr;
  ASSERT_EQ(kiln_context_create(e, &c), KILN_OK);
  float x[3 * 31 * 32] = {};
  float y[10];
  size_t count = 0;
  const int64_t bad[4] = {1, 3, 31, 32};
  EXPECT_EQ(kiln_context_run(c, "pixel_values", x, bad, 4, y, 10, &count), KILN_ERROR_INPUT);
  EXPECT_NE(std::string(kiln_last_error()).find("pixel_values"), std::string::npos);
  float x2[3 * 32 * 32] = {};
  const int64_t good[4] = {1, 3, 32, 32};
  EXPECT_EQ(kiln_context_run(c, "pixel_values", x2, good, 4, y, 5, &count), KILN_ERROR_USAGE);  // capacity too small
  EXPECT_EQ(count, 10u);
  int ids[3];
  float scores[3];
  int n = 0;
  EXPECT_EQ(kiln_classify_file(e, "/no/such.png", 3, ids, scores, &n), KILN_ERROR_INPUT);
  EXPECT_EQ(kiln_engine_input(e, 5, nullptr, nullptr, nullptr), KILN_ERROR_USAGE);
  kiln_context_free(c);
  kiln_engine_free(e);
}

}  // namespace
}  // namespace kiln
