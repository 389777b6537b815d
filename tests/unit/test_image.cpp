// Image decoding, PIL-exact resizing and timm eval pre-processing, checked
// against references made by PIL / timm (tools/reference/make_image_fixtures.py).
// Set KILN_RESIZE_CASES_DIR to a directory written by that script's
// --resize-dir option to run many more random resize comparisons.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <random>
#include <nlohmann/json.hpp>
#include <string>
#include <unistd.h>
#include <vector>

#include "core/error.hpp"
#include "image/image.hpp"

#ifndef KILN_FIXTURES_DIR
#error "compile with -DKILN_FIXTURES_DIR=\"/path/to/tests/fixtures\""
#endif

namespace fs = std::filesystem;
using kiln::ImageU8;
using kiln::Interpolation;

namespace {

const fs::path kImages = fs::path(KILN_FIXTURES_DIR) / "images";

std::vector<uint8_t> read_bytes(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  if (!f) throw std::runtime_error("cannot open " + p.string());
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), {});
}

void write_bytes(const fs::path& p, const uint8_t* data, size_t size) {
  std::ofstream f(p, std::ios::binary);
  f.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
}

// Minimal .npy reader (C order, '|u1' or '<f4'); the project's npy module
// belongs to another component, so the test carries its own.
struct Npy {
  std::string descr;
  std::vector<int64_t> shape;
  std::vector<uint8_t> data;
};

Npy read_npy(const fs::path& p) {
  const std::vector<uint8_t> b = read_bytes(p);
  if (b.size() < 10 || std::memcmp(b.data(), "\x93NUMPY", 6) != 0)
    throw std::runtime_error(p.string() + ": not an npy file");
  size_t header_len, offset;
  if (b[6] == 1) {
    header_len = b[8] | (b[9] << 8);
    offset = 10;
  } else {
    header_len = b[8] | (b[9] << 8) | (size_t{b[10]} << 16) | (size_t{b[11]} << 24);
    offset = 12;
  }
  const std::string h(b.begin() + offset, b.begin() + offset + header_len);
  Npy n;
  const auto field = [&](const std::string& key) {
    const size_t k = h.find("'" + key + "'");
    if (k == std::string::npos) throw std::runtime_error(p.string() + ": no " + key);
    return h.find(':', k) + 1;
  };
  size_t d = h.find('\'', field("descr")) + 1;
  n.descr = h.substr(d, h.find('\'', d) - d);
  if (h.find("True", field("fortran_order")) == h.find_first_not_of(' ', field("fortran_order")))
    throw std::runtime_error(p.string() + ": fortran order");
  size_t s = h.find('(', field("shape")) + 1;
  const size_t e = h.find(')', s);
  while (s < e) {
    const size_t comma = std::min(h.find(',', s), e);
    const std::string tok = h.substr(s, comma - s);
    if (tok.find_first_not_of(' ') != std::string::npos) n.shape.push_back(std::stoll(tok));
    s = comma + 1;
  }
  n.data.assign(b.begin() + offset + header_len, b.end());
  return n;
}

ImageU8 npy_to_image(const Npy& n) {
  EXPECT_EQ(n.descr, "|u1");
  EXPECT_EQ(n.shape.size(), 3u);
  ImageU8 img;
  img.height = static_cast<int>(n.shape[0]);
  img.width = static_cast<int>(n.shape[1]);
  img.rgb = n.data;
  EXPECT_EQ(img.rgb.size(), static_cast<size_t>(img.width) * img.height * 3);
  return img;
}

struct DiffStats {
  int max_diff = 0;
  size_t differing = 0, over_one = 0, total = 0;
};

DiffStats compare(const ImageU8& a, const ImageU8& b) {
  DiffStats s;
  if (a.width != b.width || a.height != b.height) {
    ADD_FAILURE() << "size " << a.width << "x" << a.height << " vs " << b.width << "x" << b.height;
    s.max_diff = 256;
    return s;
  }
  s.total = a.rgb.size();
  for (size_t i = 0; i < a.rgb.size(); ++i) {
    const int d = std::abs(int{a.rgb[i]} - int{b.rgb[i]});
    s.max_diff = std::max(s.max_diff, d);
    s.differing += d != 0;
    s.over_one += d > 1;
  }
  return s;
}

// The acceptance bar: at most 1 level of 255 on >= 99.9% of values.
void expect_within_bar(const DiffStats& s, const std::string& what) {
  EXPECT_LE(static_cast<double>(s.over_one), 0.001 * static_cast<double>(s.total)) << what;
}

nlohmann::json manifest() {
  std::ifstream f(kImages / "manifest.json");
  return nlohmann::json::parse(f);
}

kiln::TimmPreprocess config_from_json(const nlohmann::json& c) {
  kiln::TimmPreprocess p;
  p.height = c["height"];
  p.width = c["width"];
  p.crop_pct = c["crop_pct"].get<float>();
  p.interpolation = kiln::interpolation_from_name(c["interpolation"].get<std::string>());
  for (int i = 0; i < 3; ++i) {
    p.mean[i] = c["mean"][i].get<float>();
    p.std[i] = c["std"][i].get<float>();
  }
  p.crop_mode = c["crop_mode"];
  return p;
}

// The references record the Pillow that made them; its major version decides
// the two-pass order (see kiln::PilPassOrder).
kiln::PilPassOrder pass_order_for(const nlohmann::json& m) {
  const std::string v = m.value("pillow", "13");
  return std::stoi(v) >= 13 ? kiln::PilPassOrder::Pillow13 : kiln::PilPassOrder::Pillow12;
}

bool is_jpeg(const std::string& f) { return f.size() > 4 && f.substr(f.size() - 4) == ".jpg"; }

// A scratch directory for the bad-input files.
struct TempDir {
  fs::path path;
  TempDir() {
    char tmpl[] = "/tmp/kiln_test_image_XXXXXX";
    path = mkdtemp(tmpl);
  }
  ~TempDir() { fs::remove_all(path); }
};

// Asserts Error(Input) whose message names `path` (and contains `needle`).
void expect_input_error(const fs::path& path, const std::string& needle = "") {
  try {
    kiln::decode_image(path);
    ADD_FAILURE() << path << ": decoded without error";
  } catch (const kiln::Error& e) {
    EXPECT_EQ(e.kind(), kiln::ErrorKind::Input) << e.what();
    EXPECT_NE(std::string(e.what()).find(path.string()), std::string::npos) << e.what();
    if (!needle.empty()) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  }
}

uint32_t crc32(const uint8_t* p, size_t n, uint32_t crc = 0) {
  crc = ~crc;
  for (size_t i = 0; i < n; ++i) {
    crc ^= p[i];
    for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0xEDB88320u & (0u - (crc & 1u)));
  }
  return ~crc;
}

void put_be32(uint8_t* p, uint32_t v) {
  p[0] = v >> 24; p[1] = v >> 16; p[2] = v >> 8; p[3] = v;
}

}  // namespace

// ------------------------------------------------------------- decoding --

TEST(ImageDecode, MatchesPilConvertRgb) {
  const nlohmann::json m = manifest();
  ASSERT_FALSE(m["decode"].empty());
  for (const auto& e : m["decode"]) {
    const std::string file = e["file"];
    if (e.contains("expect_error")) {
      expect_input_error(kImages / file, e["expect_error"].get<std::string>());
      continue;
    }
    const ImageU8 got = kiln::decode_image(kImages / file);
    const DiffStats s = compare(got, npy_to_image(read_npy(kImages / e["reference"].get<std::string>())));
    std::printf("  decode %-28s max diff %d, %zu of %zu values differ\n", file.c_str(), s.max_diff,
                s.differing, s.total);
    if (is_jpeg(file)) {
      expect_within_bar(s, file);
    } else {
      EXPECT_EQ(s.differing, 0u) << file;
    }
  }
}

TEST(ImageDecode, BadInputsThrowInputErrors) {
  TempDir tmp;
  const auto text = tmp.path / "notes.jpg";
  const std::string words = "this is plainly not an image\n";
  write_bytes(text, reinterpret_cast<const uint8_t*>(words.data()), words.size());
  expect_input_error(text, "not a JPEG or PNG image");

  const auto empty = tmp.path / "empty.png";
  write_bytes(empty, nullptr, 0);
  expect_input_error(empty, "empty");

  expect_input_error(tmp.path / "missing.png");

  for (const char* name : {"images/astronaut.jpg", "images/astronaut.png", "decode/progressive.jpg",
                           "decode/interlaced.png", "decode/rgb16.png"}) {
    const std::vector<uint8_t> full = read_bytes(kImages / name);
    const bool png = !is_jpeg(name);
    // PIL (and kiln) accept a PNG that stops right after its image data, so
    // PNG cuts stay before the 12-byte IEND chunk.
    const size_t limit = png ? full.size() - 13 : full.size() - 2;
    for (size_t cut : {size_t{1}, size_t{2}, size_t{5}, size_t{8}, size_t{20}, size_t{40},
                       full.size() / 4, full.size() / 2, full.size() * 9 / 10, limit}) {
      const auto path = tmp.path / (std::string("cut_") + std::to_string(cut) + (png ? ".png" : ".jpg"));
      write_bytes(path, full.data(), cut);
      SCOPED_TRACE(std::string(name) + " cut at " + std::to_string(cut));
      expect_input_error(path);
    }
  }
}

TEST(ImageDecode, PngIdatCrcIsIgnoredLikePil) {
  TempDir tmp;
  std::vector<uint8_t> png = read_bytes(kImages / "decode/rgb8.png");
  const ImageU8 want = kiln::decode_image(kImages / "decode/rgb8.png");
  size_t i = 8;
  while (std::memcmp(&png[i + 4], "IDAT", 4) != 0)
    i += 12 + ((size_t{png[i]} << 24) | (png[i + 1] << 16) | (png[i + 2] << 8) | png[i + 3]);
  const size_t len = (size_t{png[i]} << 24) | (png[i + 1] << 16) | (png[i + 2] << 8) | png[i + 3];
  png[i + 8 + len] ^= 0xFF;  // first CRC byte of the IDAT chunk
  write_bytes(tmp.path / "idat_crc.png", png.data(), png.size());
  EXPECT_EQ(kiln::decode_image(tmp.path / "idat_crc.png").rgb, want.rgb);
  // The IHDR CRC is checked, as PIL does.
  png = read_bytes(kImages / "decode/rgb8.png");
  png[29] ^= 0xFF;
  write_bytes(tmp.path / "ihdr_crc.png", png.data(), png.size());
  expect_input_error(tmp.path / "ihdr_crc.png", "CRC");
}

TEST(ImageDecode, TruncationMessagesAreSpecific) {
  TempDir tmp;
  for (const char* name : {"images/astronaut.jpg", "images/astronaut.png"}) {
    const std::vector<uint8_t> full = read_bytes(kImages / name);
    const auto path = tmp.path / fs::path(name).filename();
    write_bytes(path, full.data(), full.size() / 2);
    expect_input_error(path, is_jpeg(name) ? "truncated JPEG data" : "truncated PNG data");
  }
}

TEST(ImageDecode, HugeDeclaredDimensionsAreRejected) {
  TempDir tmp;
  // PNG: rewrite IHDR (and its CRC) to 100000 x 100000.
  std::vector<uint8_t> png = read_bytes(kImages / "decode/rgb8.png");
  put_be32(&png[16], 100000);
  put_be32(&png[20], 100000);
  put_be32(&png[29], crc32(&png[12], 17));
  write_bytes(tmp.path / "huge.png", png.data(), png.size());
  expect_input_error(tmp.path / "huge.png", "too large");
  // Within the per-side limit but over 2^28 pixels.
  put_be32(&png[16], 32768);
  put_be32(&png[20], 16385);
  put_be32(&png[29], crc32(&png[12], 17));
  write_bytes(tmp.path / "wide.png", png.data(), png.size());
  expect_input_error(tmp.path / "wide.png", "too large");

  // JPEG: patch the SOF0 height/width fields to 60000 x 60000.
  std::vector<uint8_t> jpg = read_bytes(kImages / "decode/q90_420.jpg");
  size_t i = 2;
  while (i + 9 < jpg.size() && !(jpg[i] == 0xFF && (jpg[i + 1] == 0xC0 || jpg[i + 1] == 0xC2)))
    i += 2 + ((jpg[i + 2] << 8) | jpg[i + 3]);
  ASSERT_LT(i + 9, jpg.size());
  jpg[i + 5] = 60000 >> 8; jpg[i + 6] = 60000 & 0xFF;
  jpg[i + 7] = 60000 >> 8; jpg[i + 8] = 60000 & 0xFF;
  write_bytes(tmp.path / "huge.jpg", jpg.data(), jpg.size());
  expect_input_error(tmp.path / "huge.jpg", "too large");
}

TEST(ImageDecode, BytesApiNamesTheSource) {
  const uint8_t junk[] = {'G', 'I', 'F', '8', '9', 'a', 0, 0};
  try {
    kiln::decode_image_bytes(junk, sizeof(junk), "upload#3");
    FAIL();
  } catch (const kiln::Error& e) {
    EXPECT_EQ(std::string(e.what()), "upload#3: not a JPEG or PNG image");
  }
}

// ------------------------------------------------------------- resizing --

namespace {
void run_resize_cases(const fs::path& dir, const nlohmann::json& m) {
  size_t checked = 0, failed = 0;
  const kiln::PilPassOrder order = pass_order_for(m);
  for (const auto& c : m["resize"]) {
    const ImageU8 in = npy_to_image(read_npy(dir / c["input"].get<std::string>()));
    const ImageU8 want = npy_to_image(read_npy(dir / c["reference"].get<std::string>()));
    const ImageU8 got = kiln::resize_pil(in, c["width"], c["height"],
                                         kiln::interpolation_from_name(c["interpolation"].get<std::string>()),
                                         order);
    const DiffStats s = compare(got, want);
    ++checked;
    if (s.differing) {
      ++failed;
      ADD_FAILURE() << c["input"] << " " << in.width << "x" << in.height << " -> " << c["width"] << "x"
                    << c["height"] << " " << c["interpolation"] << ": " << s.differing
                    << " values differ, max " << s.max_diff;
    }
  }
  std::printf("  resize: %zu cases, %zu not bit-exact\n", checked, failed);
}
}  // namespace

TEST(ImageResize, BitExactWithPilFixtures) {
  const nlohmann::json m = manifest();
  ASSERT_GE(m["resize"].size(), 20u);
  run_resize_cases(kImages, m);
}

TEST(ImageResize, BitExactWithPilExtraCases) {
  const char* dir = std::getenv("KILN_RESIZE_CASES_DIR");
  if (!dir) GTEST_SKIP() << "set KILN_RESIZE_CASES_DIR to run the large random set";
  std::ifstream f(fs::path(dir) / "manifest.json");
  run_resize_cases(dir, nlohmann::json::parse(f));
}

TEST(ImageResize, PassOrderFollowsPillowVersion) {
  // 69x70 -> 86x19: the height loses 51 px, more than twice the width's -17,
  // so Pillow 13 goes vertical first; Pillow 12 never does. The 8-bit
  // intermediate makes the results differ somewhere on noisy input.
  ImageU8 img;
  img.width = 69;
  img.height = 70;
  uint32_t state = 12345;
  for (int i = 0; i < 69 * 70 * 3; ++i) {
    state = state * 1664525u + 1013904223u;
    img.rgb.push_back(static_cast<uint8_t>(state >> 24));
  }
  const ImageU8 a = kiln::resize_pil(img, 86, 19, Interpolation::Bilinear, kiln::PilPassOrder::Pillow13);
  const ImageU8 b = kiln::resize_pil(img, 86, 19, Interpolation::Bilinear, kiln::PilPassOrder::Pillow12);
  EXPECT_NE(a.rgb, b.rgb);
  EXPECT_LE(compare(a, b).max_diff, 2);
  // 69x70 -> 40x50: 20 < 2 * 29, horizontal first in both.
  EXPECT_EQ(kiln::resize_pil(img, 40, 50, Interpolation::Bicubic, kiln::PilPassOrder::Pillow13).rgb,
            kiln::resize_pil(img, 40, 50, Interpolation::Bicubic, kiln::PilPassOrder::Pillow12).rgb);
}

TEST(ImageResize, SameSizeIsACopyAndBadSizesThrow) {
  ImageU8 img{2, 1, {1, 2, 3, 4, 5, 6}};
  EXPECT_EQ(kiln::resize_pil(img, 2, 1, Interpolation::Bicubic).rgb, img.rgb);
  EXPECT_THROW(kiln::resize_pil(img, 0, 3, Interpolation::Bilinear), kiln::Error);
  EXPECT_THROW(kiln::resize_pil(ImageU8{}, 3, 3, Interpolation::Bilinear), kiln::Error);
}

// ------------------------------------------------------- pre-processing --

TEST(ImagePreprocess, CenterCropRoundsHalfToEvenAndPads) {
  ImageU8 img;
  img.width = 8;
  img.height = 6;
  for (int i = 0; i < 8 * 6; ++i) img.rgb.insert(img.rgb.end(), {uint8_t(i), uint8_t(i), uint8_t(i)});
  // Excess 5 horizontally: round(2.5) = 2; excess 1 vertically: round(0.5) = 0.
  ImageU8 c = kiln::center_crop(img, 3, 5);
  EXPECT_EQ(c.rgb[0], 2);
  // Excess 3 horizontally: round(1.5) = 2.
  c = kiln::center_crop(img, 5, 6);
  EXPECT_EQ(c.rgb[0], 2);
  // Larger than the image: pad (10-8)//2 = 1 left, (9-6)//2 = 1 top, rest right/bottom.
  c = kiln::center_crop(img, 10, 9, {7, 7, 7});
  EXPECT_EQ(c.width, 10);
  EXPECT_EQ(c.rgb[0], 7);
  EXPECT_EQ(c.rgb[(1 * 10 + 1) * 3], 0);       // input (0, 0)
  EXPECT_EQ(c.rgb[(6 * 10 + 8) * 3], 47);      // input (7, 5)
  EXPECT_EQ(c.rgb[(7 * 10 + 9) * 3], 7);
  // Padding in one dimension (0 left, 1 right), cropping in the other.
  c = kiln::center_crop(img, 9, 3);
  EXPECT_EQ(c.rgb[0], 2 * 8);                    // crop_top = round(1.5) = 2
  EXPECT_EQ(c.rgb[7 * 3], 2 * 8 + 7);
  EXPECT_EQ(c.rgb[8 * 3], 0);                    // right pad column
}

TEST(ImagePreprocess, ResizeStepFollowsTimmAndTorchvision) {
  kiln::TimmPreprocess p;  // 224, crop_pct 0.875 -> 256
  kiln::ResizeStep s = kiln::timm_resize_step(640, 427, p);
  EXPECT_EQ(s.width, 383);  // int(256 * 640 / 427) = int(383.7)
  EXPECT_EQ(s.height, 256);
  EXPECT_EQ(s.interpolation, Interpolation::Bicubic);
  s = kiln::timm_resize_step(427, 640, p);
  EXPECT_EQ(s.width, 256);
  EXPECT_EQ(s.height, 383);
  p.crop_pct = 0.95f;  // floor(224 / 0.95) = 235
  EXPECT_EQ(kiln::timm_resize_step(500, 500, p).width, 235);
  p.crop_pct = 0.9f;
  p.height = p.width = 288;  // Python: 288 / 0.9 == 320.0 -> 320
  EXPECT_EQ(kiln::timm_resize_step(500, 500, p).width, 320);
  p.crop_pct = 0.0f;  // `crop_pct or 0.875`
  EXPECT_EQ(kiln::timm_resize_step(500, 500, p).width, 329);
  // Non-square target: ResizeKeepRatio, always bilinear, round half-even.
  p = kiln::TimmPreprocess{};
  p.height = 96;
  p.width = 128;  // scale (109, 146)
  s = kiln::timm_resize_step(300, 200, p);
  EXPECT_EQ(s.interpolation, Interpolation::Bilinear);
  EXPECT_EQ(s.height, 109);  // ratio = min(200/109, 300/146)
  EXPECT_EQ(s.width, 164);   // round(300 / (200/109)) = round(163.5) = 164
  p.crop_mode = "squash";
  s = kiln::timm_resize_step(300, 200, p);
  EXPECT_EQ(s.width, 146);
  EXPECT_EQ(s.height, 109);
  p.crop_mode = "diagonal";
  EXPECT_THROW(kiln::timm_resize_step(300, 200, p), kiln::Error);
}

TEST(ImagePreprocess, MatchesTimmReferences) {
  const nlohmann::json m = manifest();
  std::printf("  references from: %s\n", m["generator"].get<std::string>().c_str());
  ASSERT_FALSE(m["preprocess"].empty());
  for (const auto& e : m["preprocess"]) {
    const std::string file = e["image"], cfg_name = e["config"];
    kiln::TimmPreprocess p = config_from_json(m["configs"][cfg_name]);
    p.pil_pass_order = pass_order_for(m);
    const ImageU8 img = kiln::decode_image(kImages / file);
    const ImageU8 want = npy_to_image(read_npy(kImages / e["reference"].get<std::string>()));
    const ImageU8 got = kiln::timm_resize_crop(img, p);
    const DiffStats s = compare(got, want);
    std::printf("  preprocess %-22s %-22s max diff %d, %zu of %zu values differ\n", file.c_str(),
                cfg_name.c_str(), s.max_diff, s.differing, s.total);
    expect_within_bar(s, file + " " + cfg_name);
    if (!is_jpeg(file)) {
      EXPECT_EQ(s.differing, 0u) << file << " " << cfg_name;
    }
    // The float tensor is exactly the normalization of that 8-bit crop.
    const std::vector<float> t = kiln::timm_preprocess(img, p);
    ASSERT_EQ(t.size(), size_t{3} * p.height * p.width);
    EXPECT_EQ(t, kiln::normalize_to_chw(got, p.mean, p.std));
  }
}

TEST(ImagePreprocess, NormalizationMatchesTorchFloat32) {
  const nlohmann::json m = manifest();
  for (const auto& e : m["normalize"]) {
    const kiln::TimmPreprocess p = config_from_json(m["configs"][e["config"].get<std::string>()]);
    const ImageU8 img = npy_to_image(read_npy(kImages / e["input"].get<std::string>()));
    const Npy ref = read_npy(kImages / e["reference"].get<std::string>());
    ASSERT_EQ(ref.descr, "<f4");
    const std::vector<float> got = kiln::normalize_to_chw(img, p.mean, p.std);
    ASSERT_EQ(got.size() * 4, ref.data.size());
    // Bitwise: every one of the 3 x 256 possible values.
    EXPECT_EQ(std::memcmp(got.data(), ref.data.data(), ref.data.size()), 0) << e["config"];
  }
}

// The pre-processing as data (PreprocessPlan, what a GPU executor applies)
// against the step-by-step CPU path, on synthetic images of awkward sizes:
// down- and upscales, one axis unchanged, crops larger than the image (pad
// with the fill), every interpolation and crop mode, both Pillow pass orders.
TEST(ImagePreprocess, PlanEqualsTheStepByStepPath) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> byte(0, 255);
  int cases = 0;
  for (const auto& [w, h] : std::vector<std::pair<int, int>>{{17, 23}, {300, 200}, {64, 64}, {1900, 260}, {240, 1500}, {56, 40}}) {
    ImageU8 img;
    img.width = w, img.height = h;
    img.rgb.resize(size_t(w) * h * 3);
    for (auto& v : img.rgb) v = static_cast<uint8_t>(byte(rng));
    for (const char* mode : {"center", "squash", "border"})
      for (Interpolation interp : {Interpolation::Nearest, Interpolation::Bilinear, Interpolation::Bicubic})
        for (kiln::PilPassOrder order : {kiln::PilPassOrder::Pillow13, kiln::PilPassOrder::Pillow12}) {
          kiln::TimmPreprocess p;
          p.height = 48, p.width = 56, p.crop_pct = mode == std::string("border") ? 1.2f : 0.9f;
          p.crop_mode = mode, p.interpolation = interp, p.pil_pass_order = order;
          p.mean = {0.5f, 0.25f, 0.125f};
          const kiln::PreprocessPlan plan = kiln::plan_timm_preprocess(w, h, p);
          const std::vector<float> want = kiln::normalize_to_chw(kiln::timm_resize_crop(img, p), p.mean, p.std);
          EXPECT_EQ(kiln::run_preprocess_plan(img, plan), want) << w << "x" << h << " " << mode << " " << kiln::interpolation_name(interp);
          // The resize alone, as data, is resize_pil.
          const kiln::ResizeStep st = kiln::timm_resize_step(w, h, p);
          EXPECT_EQ(kiln::run_resize_plan(img, plan.resize).rgb, kiln::resize_pil(img, st.width, st.height, st.interpolation, order).rgb);
          EXPECT_LE(plan.resize.passes.size(), 2u);
          for (const auto& pass : plan.resize.passes) {
            const int n = pass.horizontal ? pass.out_w : pass.out_h;
            ASSERT_EQ(pass.first.size(), size_t(n));
            ASSERT_EQ(pass.weights.size(), size_t(n) * pass.ksize);
          }
          ++cases;
        }
  }
  EXPECT_EQ(cases, 6 * 3 * 3 * 2);
  EXPECT_THROW(kiln::run_resize_plan(ImageU8{3, 3, std::vector<uint8_t>(27)}, kiln::plan_resize_pil(4, 4, 2, 2, Interpolation::Bilinear)),
               kiln::Error);
}

TEST(ImageInterpolation, NamesRoundTrip) {
  for (Interpolation i : {Interpolation::Nearest, Interpolation::Bilinear, Interpolation::Bicubic})
    EXPECT_EQ(kiln::interpolation_from_name(kiln::interpolation_name(i)), i);
  try {
    kiln::interpolation_from_name("lanczos");
    FAIL();
  } catch (const kiln::Error& e) {
    EXPECT_EQ(e.kind(), kiln::ErrorKind::Input);
  }
}
