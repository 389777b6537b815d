// Decoding against PIL, case by case: every JPEG colour space (gray, YCbCr,
// stored RGB, CMYK and YCCK with and without the Adobe marker) and every PNG
// bit depth and colour type (tRNS, short PLTE, Adam7). References are
// Image.open(f).convert("RGB") from tools/reference/make_pil_decode_fixtures.py;
// PNG must match exactly, JPEG within 1 level (PIL's wheel bundles another
// libjpeg-turbo than the system one kiln links; docs/preprocessing.md).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "image/image.hpp"

namespace fs = std::filesystem;

namespace {

// KILN_PIL_DECODE_DIR: a folder written by the script with other --sizes, for
// a one-off check on more cases than are committed.
const fs::path kDir = std::getenv("KILN_PIL_DECODE_DIR") ? fs::path(std::getenv("KILN_PIL_DECODE_DIR"))
                                                         : fs::path(KILN_FIXTURES_DIR) / "images" / "pil_decode";

nlohmann::json manifest() {
  std::ifstream f(kDir / "manifest.json");
  return nlohmann::json::parse(f);
}

// The H x W x 3 uint8 .npy files the fixture script writes (numpy's v1
// header, C order); anything else is a fixture error.
kiln::ImageU8 read_rgb_npy(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::vector<uint8_t> b((std::istreambuf_iterator<char>(f)), {});
  if (b.size() < 10 || std::memcmp(b.data(), "\x93NUMPY\x01", 7) != 0) throw std::runtime_error(p.string() + ": not npy v1");
  const size_t len = b[8] | (b[9] << 8);
  const std::string h(b.begin() + 10, b.begin() + 10 + len);
  if (h.find("'|u1'") == std::string::npos) throw std::runtime_error(p.string() + ": not uint8");
  kiln::ImageU8 img;
  if (std::sscanf(h.c_str() + h.find('(') + 1, "%d, %d, 3)", &img.height, &img.width) != 2)
    throw std::runtime_error(p.string() + ": not H x W x 3");
  img.rgb.assign(b.begin() + 10 + len, b.end());
  if (img.rgb.size() != size_t{3} * img.width * img.height) throw std::runtime_error(p.string() + ": short data");
  return img;
}

bool is_jpeg(const std::string& f) { return f.size() > 4 && f.substr(f.size() - 4) == ".jpg"; }

}  // namespace

TEST(ImagePilDecode, EveryCaseMatchesPil) {
  const nlohmann::json m = manifest();
  std::printf("  references: Pillow %s (libjpeg-turbo %s)\n", m["pillow"].get<std::string>().c_str(),
              m["pillow_libjpeg_turbo"].get<std::string>().c_str());
  ASSERT_GE(m["decoded"].size(), 90u);
  int worst_jpeg = 0;
  size_t cmyk_cases = 0;
  for (const auto& e : m["decoded"]) {
    const std::string file = e["file"];
    SCOPED_TRACE(file);
    const kiln::ImageU8 want = read_rgb_npy(kDir / e["reference"].get<std::string>());
    kiln::ImageU8 got;
    try {
      got = kiln::decode_image(kDir / file);
    } catch (const kiln::Error& err) {
      ADD_FAILURE() << err.what();
      continue;
    }
    ASSERT_EQ(got.width, want.width);
    ASSERT_EQ(got.height, want.height);
    int max_diff = 0;
    size_t differing = 0;
    for (size_t i = 0; i < got.rgb.size(); ++i) {
      const int d = std::abs(int{got.rgb[i]} - int{want.rgb[i]});
      max_diff = std::max(max_diff, d);
      differing += d != 0;
    }
    if (max_diff) std::printf("  %-40s %-5s max diff %d, %zu of %zu values\n", file.c_str(),
                              e["pil_mode"].get<std::string>().c_str(), max_diff, differing, got.rgb.size());
    if (is_jpeg(file)) {
      EXPECT_LE(max_diff, 1);  // IDCT/upsampling of two libjpeg-turbo builds
      worst_jpeg = std::max(worst_jpeg, max_diff);
    } else {
      EXPECT_EQ(max_diff, 0);  // PNG: PIL is exact, so is kiln
    }
    cmyk_cases += e["pil_mode"] == "CMYK";
  }
  std::printf("  JPEG worst max diff %d; %zu CMYK/YCCK cases\n", worst_jpeg, cmyk_cases);
  EXPECT_GE(cmyk_cases, 12u);
}

// The CMYK path is held to more than "within 1": on every CMYK and YCCK file
// the two libjpeg-turbo builds were measured to agree (same ISLOW IDCT and
// fancy upsampling), so kiln must equal PIL exactly, which pins the Adobe
// inversion and PIL's integer CMYK -> RGB formula.
TEST(ImagePilDecode, CmykAndYcckAreExact) {
  size_t checked = 0;
  const nlohmann::json m = manifest();
  for (const auto& e : m["decoded"]) {
    const std::string file = e["file"];
    if (e["pil_mode"] != "CMYK") continue;
    SCOPED_TRACE(file);
    EXPECT_EQ(kiln::decode_image(kDir / file).rgb, read_rgb_npy(kDir / e["reference"].get<std::string>()).rgb);
    ++checked;
  }
  EXPECT_GE(checked, 14u);
}

TEST(ImagePilDecode, FilesPilRefusesAreInputErrorsNamingTheFile) {
  const nlohmann::json m = manifest();
  ASSERT_GE(m["refused"].size(), 5u);
  for (const auto& e : m["refused"]) {
    const fs::path path = kDir / e["file"].get<std::string>();
    SCOPED_TRACE(path.string() + " (PIL: " + e["pil_error"].get<std::string>() + ")");
    try {
      kiln::decode_image(path);
      ADD_FAILURE() << "decoded without error";
    } catch (const kiln::Error& err) {
      EXPECT_EQ(err.kind(), kiln::ErrorKind::Input) << err.what();
      EXPECT_EQ(std::string(err.what()).rfind(path.string() + ": ", 0), 0u) << err.what();
    }
  }
}

// Every cut of a CMYK/YCCK file fails cleanly (the 4-byte row lives in
// libjpeg's pool, freed on the error path too; run under ASan to see it).
TEST(ImagePilDecode, EveryTruncationOfCmykAndYcckIsAnInputError) {
  const fs::path tmp = fs::temp_directory_path() / ("kiln_cmyk_cuts_" + std::to_string(::getpid()));
  fs::create_directories(tmp);
  for (const char* name : {"jpeg_ycck_40x31.jpg", "jpeg_cmyk_progressive_40x31.jpg", "jpeg_ycck_progressive_17x13.jpg"}) {
    std::ifstream f(kDir / name, std::ios::binary);
    const std::vector<char> full((std::istreambuf_iterator<char>(f)), {});
    ASSERT_GT(full.size(), 100u) << name;
    for (size_t cut = 1; cut + 2 <= full.size(); cut += 5) {
      const fs::path p = tmp / (std::to_string(cut) + ".jpg");
      std::ofstream(p, std::ios::binary).write(full.data(), static_cast<std::streamsize>(cut));
      try {
        kiln::decode_image(p);
        ADD_FAILURE() << name << " cut at " << cut << " decoded";
      } catch (const kiln::Error& e) {
        EXPECT_EQ(e.kind(), kiln::ErrorKind::Input);
        EXPECT_EQ(std::string(e.what()).rfind(p.string() + ": ", 0), 0u) << e.what();
      }
    }
  }
  fs::remove_all(tmp);
}
