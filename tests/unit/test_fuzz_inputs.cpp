// Replays the fuzzers' inputs through the same entry points
// (tests/fuzz/entry_points.hpp) in the ordinary test suite, so the seed
// corpus and every input a fuzzer once crashed on are checked on every
// build, sanitizer builds included:
//   tests/fuzz/corpus/<target>/*      accepted, or rejected with kiln::Error
//   tests/fuzz/regressions/<target>/* rejected with kiln::Error (each was a crash)
// Plus the in-memory readers the fuzzers use agree with the file readers.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "bundle/bundle.hpp"
#include "checkpoint/hf_config.hpp"
#include "checkpoint/safetensors.hpp"
#include "core/error.hpp"
#include "core/file.hpp"
#include "kiln/kiln.hpp"
#include "temp_dir.hpp"
#include "tests/fuzz/entry_points.hpp"

namespace kiln {
namespace {

namespace fs = std::filesystem;

const fs::path kFuzzDir = KILN_FUZZ_DIR;

std::vector<fs::path> files_in(const fs::path& dir) {
  std::vector<fs::path> out;
  if (!fs::is_directory(dir)) return out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_regular_file()) out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

// Empty when the entry point accepted the input or threw kiln::Error;
// otherwise what else it threw.
std::string run_entry(const fuzz::Target& t, const std::vector<uint8_t>& bytes, bool* rejected) {
  *rejected = false;
  try {
    t.run(bytes.data(), bytes.size());
  } catch (const Error& e) {
    *rejected = true;
    // Messages name the input at fault: every entry point labels its source "fuzz...".
    if (std::string(e.what()).find("fuzz") == std::string::npos) return std::string("unlabelled error: ") + e.what();
  } catch (const std::exception& e) {
    return std::string("non-kiln exception: ") + e.what();
  }
  return "";
}

TEST(FuzzInputs, EveryTargetHasSeeds) {
  for (const auto& t : fuzz::targets()) EXPECT_GE(files_in(kFuzzDir / "corpus" / t.name).size(), 2u) << t.name;
}

TEST(FuzzInputs, SeedsAreAcceptedOrRejectedCleanly) {
  size_t accepted = 0, total = 0;
  for (const auto& t : fuzz::targets())
    for (const auto& f : files_in(kFuzzDir / "corpus" / t.name)) {
      bool rejected = false;
      EXPECT_EQ(run_entry(t, read_file_bytes(f), &rejected), "") << f;
      accepted += !rejected;
      ++total;
    }
  // Most seeds are real, valid files; a reader that rejected them all would
  // leave the fuzzers exploring nothing but error paths.
  EXPECT_GT(accepted, total / 2) << accepted << " of " << total << " seeds accepted";
}

TEST(FuzzInputs, TinyBundlesLoadAndRun) {
  for (const char* name : {"tiny_f32", "tiny_f16"}) {
    const auto bytes = read_file_bytes(kFuzzDir / "corpus" / "bundle" / name);
    auto engine = Engine::load_from_memory(bytes.data(), bytes.size(), {}, name);
    EXPECT_EQ(engine->labels(), (std::vector<std::string>{"zero", "one", "two"}));
    auto out = engine->create_context()->run({{"pixel_values", {1, 3, 8, 8}, std::vector<float>(192, 0.5f)}});
    ASSERT_EQ(out.at(0).data.size(), 3u) << name;
  }
}

TEST(FuzzInputs, RegressionsAreRejectedCleanly) {
  for (const auto& t : fuzz::targets())
    for (const auto& f : files_in(kFuzzDir / "regressions" / t.name)) {
      bool rejected = false;
      EXPECT_EQ(run_entry(t, read_file_bytes(f), &rejected), "") << f;
      EXPECT_TRUE(rejected) << f << " was accepted";
    }
}

// A 16384x16384 header on a file of a few hundred bytes: refused before the
// 768 MB image (and, interlaced, a 2 GB row buffer) is allocated and decoded.
TEST(FuzzInputs, HugeImageHeaderOnTinyFileIsRefused) {
  const std::pair<const char*, const char*> cases[] = {
      {"png/png_interlaced_huge", "fuzz image: truncated PNG data ("},
      {"png/png_huge", "fuzz image: truncated PNG data ("},
      {"jpeg/jpeg_huge", "fuzz image: truncated JPEG data (1314 bytes of image data, the JPEG header needs at least 524288)"}};
  for (const auto& [file, want] : cases) {
    const auto bytes = read_file_bytes(kFuzzDir / "regressions" / file);
    try {
      fuzz::image(bytes.data(), bytes.size());
      ADD_FAILURE() << file << " accepted";
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()).rfind(want, 0), 0u) << e.what();
    }
  }
}

// ---- the in-memory readers match the file readers

TEST(FuzzInputs, BundleFromBytesMatchesOpen) {
  testing::TempDir dir;
  BundleWriter w(BundleInfo{kBundleFormat, "0.1.0", "resnet", "classification", "cpu"});
  w.add_section("graph.json", std::string("{}"));
  w.add_section("weights.bin", std::vector<uint8_t>(100, 7));
  const fs::path p = dir.path() / "m.kiln";
  w.write(p);
  const std::vector<uint8_t> bytes = w.to_bytes();
  EXPECT_EQ(bytes, read_file_bytes(p));
  const Bundle a = Bundle::open(p), b = Bundle::from_bytes(Blob::copy_of(bytes.data(), bytes.size()), "mem");
  EXPECT_EQ(a.section_names(), b.section_names());
  EXPECT_EQ(b.section_text("graph.json"), "{}");
  EXPECT_EQ(b.path(), fs::path("mem"));
  std::vector<uint8_t> bad = bytes;
  bad.back() ^= 1;
  try {
    Bundle::from_bytes(Blob::copy_of(bad.data(), bad.size()), "mem.bundle");
    ADD_FAILURE() << "damaged bundle accepted";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "mem.bundle: section 'weights.bin' is corrupt: sha256 mismatch (file damaged or modified)");
  }
}

TEST(FuzzInputs, SafetensorsIndexBytes) {
  const std::string ok = R"({"metadata": {}, "weight_map": {"a": "x.safetensors", "b": "y.safetensors"}})";
  const auto m = parse_safetensors_index(reinterpret_cast<const uint8_t*>(ok.data()), ok.size(), "i.json");
  EXPECT_EQ(m, (std::map<std::string, std::string>{{"a", "x.safetensors"}, {"b", "y.safetensors"}}));
  const std::string escape = R"({"weight_map": {"a": "../x.safetensors"}})";
  try {
    parse_safetensors_index(reinterpret_cast<const uint8_t*>(escape.data()), escape.size(), "i.json");
    ADD_FAILURE() << "path escape accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("i.json: tensor 'a' maps to file name '../x.safetensors'"), std::string::npos)
        << e.what();
  }
}

TEST(FuzzInputs, ConfigBytesMatchesFile) {
  const fs::path p = fs::path(KILN_FIXTURES_DIR) / "resnet" / "basic" / "config.json";
  const auto bytes = read_file_bytes(p);
  const TimmConfig a = read_timm_config(p), b = parse_timm_config_bytes(bytes.data(), bytes.size(), "c.json");
  EXPECT_EQ(a.architecture, b.architecture);
  EXPECT_EQ(a.num_classes, b.num_classes);
  EXPECT_EQ(a.mean, b.mean);
  const std::string junk = "{\"architecture\": ";
  EXPECT_THROW(parse_timm_config_bytes(reinterpret_cast<const uint8_t*>(junk.data()), junk.size(), "c.json"), Error);
}

}  // namespace
}  // namespace kiln
