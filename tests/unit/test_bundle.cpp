#include "bundle/bundle.hpp"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <fstream>
#include <thread>

#include "core/error.hpp"
#include "core/file.hpp"
#include "temp_dir.hpp"

namespace kiln {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

using testing::TempDir;

void write_bytes(const fs::path& p, const std::vector<uint8_t>& b) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

std::vector<uint8_t> bytes_of(const std::string& s) { return std::vector<uint8_t>(s.begin(), s.end()); }

BundleInfo test_info() { return BundleInfo{kBundleFormat, "0.1.0", "resnet", "classification", "cpu"}; }

// Three sections, one of them empty, with lengths that are not multiples of 64.
BundleWriter three_section_writer() {
  BundleWriter w(test_info());
  w.add_section("graph.json", std::string("{\"nodes\": []}"));
  std::vector<uint8_t> weights(100);
  for (size_t i = 0; i < weights.size(); ++i) weights[i] = static_cast<uint8_t>(i * 7 + 3);
  w.add_section("weights.bin", weights);
  w.add_section("labels.json", std::vector<uint8_t>{});
  return w;
}

// Expects open() to fail with Error(Input); returns the message.
std::string open_error(const fs::path& p) {
  try {
    Bundle::open(p);
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Input) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "bundle " << p << " was accepted";
  return "";
}

// Builds a bundle by hand with a correct header digest, so tests can reach
// the checks behind it. `placed` puts bytes at absolute offsets; gaps are zero.
std::vector<uint8_t> assemble(const std::string& header_text,
                              const std::vector<std::pair<uint64_t, std::vector<uint8_t>>>& placed = {},
                              uint64_t min_size = 0) {
  std::vector<uint8_t> out(16 + header_text.size());
  std::memcpy(out.data(), "KILNBNDL", 8);
  for (int i = 0; i < 8; ++i) out[8 + i] = static_cast<uint8_t>(static_cast<uint64_t>(header_text.size()) >> (8 * i));
  std::memcpy(out.data() + 16, header_text.data(), header_text.size());
  auto d = sha256(out.data(), out.size());
  out.insert(out.end(), d.begin(), d.end());
  for (const auto& [off, bytes] : placed) {
    if (out.size() < off + bytes.size()) out.resize(off + bytes.size(), 0);
    std::memcpy(out.data() + off, bytes.data(), bytes.size());
  }
  if (out.size() < min_size) out.resize(min_size, 0);
  return out;
}

json base_header(json sections = json::object()) {
  return {{"format", 1},   {"kiln_version", "0.1.0"}, {"family", "resnet"}, {"task", "detection"},
          {"backend", "cuda"}, {"sections", sections}};
}

json section_entry(uint64_t off, const std::vector<uint8_t>& bytes) {
  return {{"offset", off}, {"length", bytes.size()}, {"sha256", sha256_hex(bytes.data(), bytes.size())}};
}

TEST(Bundle, RoundTripThreeSections) {
  TempDir dir;
  const fs::path p = dir.path() / "m.kiln";
  three_section_writer().write(p);
  Bundle b = Bundle::open(p);
  EXPECT_EQ(b.info().format, 1);
  EXPECT_EQ(b.info().kiln_version, "0.1.0");
  EXPECT_EQ(b.info().family, "resnet");
  EXPECT_EQ(b.info().task, "classification");
  EXPECT_EQ(b.info().backend, "cpu");
  EXPECT_EQ(b.path(), p);
  EXPECT_EQ(b.file_size(), fs::file_size(p));
  EXPECT_EQ(b.section_names(), (std::vector<std::string>{"graph.json", "labels.json", "weights.bin"}));
  EXPECT_TRUE(b.has_section("weights.bin"));
  EXPECT_FALSE(b.has_section("runtime.json"));
  EXPECT_EQ(b.section_text("graph.json"), "{\"nodes\": []}");
  EXPECT_EQ(b.section("labels.json").size, 0u);
  Blob w = b.section("weights.bin");
  ASSERT_EQ(w.size, 100u);
  for (size_t i = 0; i < w.size; ++i) ASSERT_EQ(w.data[i], static_cast<uint8_t>(i * 7 + 3));
  EXPECT_TRUE(w.owner);  // keeps the mapping alive beyond the Bundle
  EXPECT_EQ(b.header()["sections"].size(), 3u);
  EXPECT_EQ(fs::file_size(p), b.header()["sections"]["labels.json"]["offset"].get<uint64_t>());
}

TEST(Bundle, EverySectionIs64ByteAligned) {
  TempDir dir;
  const fs::path p = dir.path() / "a.kiln";
  BundleWriter w(test_info());
  const std::vector<size_t> sizes = {1, 63, 64, 65, 0, 1000, 3};
  for (size_t i = 0; i < sizes.size(); ++i) w.add_section(cat("s", i), std::vector<uint8_t>(sizes[i], static_cast<uint8_t>(i + 1)));
  w.write(p);
  Bundle b = Bundle::open(p);
  const uint8_t* base = b.section("s0").data - b.header()["sections"]["s0"]["offset"].get<uint64_t>();
  for (size_t i = 0; i < sizes.size(); ++i) {
    const std::string n = cat("s", i);
    const uint64_t off = b.header()["sections"][n]["offset"].get<uint64_t>();
    EXPECT_EQ(off % 64, 0u) << n;
    Blob s = b.section(n);
    EXPECT_EQ(static_cast<size_t>(s.data - base), off);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(s.data) % 64, 0u) << n;  // mmap is page aligned
    ASSERT_EQ(s.size, sizes[i]);
    for (size_t k = 0; k < s.size; ++k) ASSERT_EQ(s.data[k], i + 1);
  }
}

TEST(Bundle, HeaderLayoutConvergesForEveryHeaderLength) {
  // The header length feeds back into the offsets it contains; sweep it
  // across several 64-byte and digit-count boundaries.
  TempDir dir;
  for (size_t n = 0; n < 200; ++n) {
    BundleInfo info = test_info();
    info.family = std::string(n, 'f');
    BundleWriter w(info);
    w.add_section("a", std::vector<uint8_t>(n * 13, 1));
    w.add_section("b", std::string("x"));
    const fs::path p = dir.path() / "c.kiln";
    w.write(p);
    Bundle b = Bundle::open(p);
    ASSERT_EQ(b.info().family.size(), n);
    ASSERT_EQ(b.section("a").size, n * 13);
  }
}

TEST(Bundle, NoSectionsAndDeterministicOutput) {
  TempDir dir;
  BundleWriter(test_info()).write(dir.path() / "e.kiln");
  Bundle b = Bundle::open(dir.path() / "e.kiln");
  EXPECT_TRUE(b.section_names().empty());
  three_section_writer().write(dir.path() / "x.kiln");
  three_section_writer().write(dir.path() / "y.kiln");
  EXPECT_EQ(read_file_bytes(dir.path() / "x.kiln"), read_file_bytes(dir.path() / "y.kiln"));
}

TEST(Bundle, MissingSectionNamesBundleAndSection) {
  TempDir dir;
  const fs::path p = dir.path() / "m.kiln";
  three_section_writer().write(p);
  Bundle b = Bundle::open(p);
  try {
    b.section("runtime.json");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Input);
    EXPECT_NE(std::string(e.what()).find(p.string()), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("'runtime.json'"), std::string::npos) << e.what();
  }
}

TEST(Bundle, EverySingleByteFlipIsRejected) {
  TempDir dir;
  const fs::path good = dir.path() / "good.kiln";
  three_section_writer().write(good);
  const std::vector<uint8_t> orig = read_file_bytes(good);
  ASSERT_GT(orig.size(), 256u);
  const fs::path bad = dir.path() / "bad.kiln";
  for (size_t i = 0; i < orig.size(); ++i) {
    std::vector<uint8_t> b = orig;
    b[i] ^= 0x01;
    write_bytes(bad, b);
    try {
      Bundle::open(bad);
      ADD_FAILURE() << "flip at offset " << i << " accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::Input) << "offset " << i << ": " << e.what();
    }
  }
}

TEST(Bundle, EveryTruncationIsRejected) {
  TempDir dir;
  const fs::path good = dir.path() / "good.kiln";
  three_section_writer().write(good);
  const std::vector<uint8_t> orig = read_file_bytes(good);
  const fs::path bad = dir.path() / "bad.kiln";
  for (size_t n = 0; n < orig.size(); ++n) {
    write_bytes(bad, std::vector<uint8_t>(orig.begin(), orig.begin() + n));
    try {
      Bundle::open(bad);
      ADD_FAILURE() << "truncation to " << n << " bytes accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::Input) << n << ": " << e.what();
    }
  }
}

TEST(Bundle, TrailingBytesRejected) {
  TempDir dir;
  const fs::path p = dir.path() / "t.kiln";
  three_section_writer().write(p);
  std::vector<uint8_t> b = read_file_bytes(p);
  b.push_back(0);
  write_bytes(p, b);
  EXPECT_NE(open_error(p).find("trailing"), std::string::npos);
}

TEST(Bundle, NewerFormatRejectedWithUpgradeMessage) {
  TempDir dir;
  const fs::path p = dir.path() / "new.kiln";
  json h = base_header();
  h["format"] = 2;
  h["something_new"] = true;  // a newer format may add keys; the version message must win
  write_bytes(p, assemble(h.dump()));
  EXPECT_EQ(open_error(p),
            p.string() + ": bundle format 2 is newer than this kiln supports (1); rebuild it or upgrade kiln");
}

TEST(Bundle, InvalidFormatValuesRejected) {
  TempDir dir;
  const fs::path p = dir.path() / "f.kiln";
  for (const json& v : {json(0), json(-1), json(1.0), json("1"), json(nullptr)}) {
    json h = base_header();
    h["format"] = v;
    write_bytes(p, assemble(h.dump()));
    EXPECT_NE(open_error(p).find("format"), std::string::npos) << v.dump();
  }
}

TEST(Bundle, HeaderKeyErrors) {
  TempDir dir;
  const fs::path p = dir.path() / "k.kiln";
  struct Case {
    std::function<void(json&)> edit;
    std::string expect;
  };
  const std::vector<Case> cases = {
      {[](json& h) { h["extra"] = 1; }, "unknown key 'extra'"},
      {[](json& h) { h.erase("family"); }, "missing key 'family'"},
      {[](json& h) { h["family"] = 3; }, "'family' must be a string"},
      {[](json& h) { h["task"] = "segmentation"; }, "'task'"},
      {[](json& h) { h["backend"] = "tpu"; }, "'backend'"},
      {[](json& h) { h["sections"] = json::array(); }, "'sections' must be an object"},
      {[](json& h) { h["sections"]["bad/name"] = json::object(); }, "invalid section name 'bad/name'"},
      {[](json& h) { h["sections"][std::string(129, 'a')] = json::object(); }, "invalid section name"},
      {[](json& h) { h["sections"]["s"] = {{"offset", 128}, {"length", 0}}; }, "missing key 'sha256'"},
      {[](json& h) { h["sections"]["s"] = {{"offset", 128}, {"length", 0}, {"sha256", "ab"}}; }, "64 lower-case hex"},
      {[](json& h) { h["sections"]["s"] = {{"offset", -64}, {"length", 0}, {"sha256", std::string(64, 'a')}}; },
       "non-negative integer"},
      {[](json& h) { h["sections"]["s"] = {{"offset", 128.0}, {"length", 0}, {"sha256", std::string(64, 'a')}}; },
       "non-negative integer"},
  };
  for (const auto& c : cases) {
    json h = base_header();
    c.edit(h);
    write_bytes(p, assemble(h.dump(), {}, 4096));
    const std::string msg = open_error(p);
    EXPECT_NE(msg.find(c.expect), std::string::npos) << msg;
    EXPECT_EQ(msg.rfind(p.string(), 0), 0u) << msg;  // every message starts with the file
  }
}

TEST(Bundle, OverlappingSectionsRejected) {
  TempDir dir;
  const fs::path p = dir.path() / "o.kiln";
  const std::vector<uint8_t> a(100, 1), b(10, 2);
  // b starts inside a: [512, 612) and [576, 586).
  json h = base_header({{"a.bin", section_entry(512, a)}, {"b.bin", section_entry(576, b)}});
  write_bytes(p, assemble(h.dump(), {{512, a}, {576, b}}));
  const std::string msg = open_error(p);
  EXPECT_NE(msg.find("overlaps"), std::string::npos) << msg;
  // Control: the same sections side by side are accepted.
  h = base_header({{"a.bin", section_entry(512, a)}, {"b.bin", section_entry(640, b)}});
  write_bytes(p, assemble(h.dump(), {{512, a}, {640, b}}));
  EXPECT_EQ(Bundle::open(p).section("b.bin").size, 10u);
}

TEST(Bundle, SectionBoundsAndAlignmentRejected) {
  TempDir dir;
  const fs::path p = dir.path() / "s.kiln";
  const std::vector<uint8_t> a(10, 5);
  auto try_entry = [&](json entry, uint64_t file_size) {
    write_bytes(p, assemble(base_header({{"weights.bin", entry}}).dump(), {}, file_size));
    return open_error(p);
  };
  EXPECT_NE(try_entry(section_entry(320, a), 325).find("beyond the end"), std::string::npos);
  EXPECT_NE(try_entry(section_entry(330, a), 512).find("not 64-byte aligned"), std::string::npos);
  EXPECT_NE(try_entry(section_entry(0, a), 512).find("inside the header"), std::string::npos);
  json huge = section_entry(320, a);
  huge["length"] = UINT64_MAX - 100;  // offset + length wraps around u64
  EXPECT_NE(try_entry(huge, 512).find("beyond the end"), std::string::npos);
  huge = section_entry(UINT64_MAX - 63, a);
  EXPECT_NE(try_entry(huge, 512).find("beyond the end"), std::string::npos);
}

TEST(Bundle, SectionDigestMismatchNamesSection) {
  TempDir dir;
  const fs::path p = dir.path() / "d.kiln";
  std::vector<uint8_t> w(40, 9);
  json h = base_header({{"weights.bin", section_entry(320, w)}});
  w[7] = 10;
  write_bytes(p, assemble(h.dump(), {{320, w}}));
  EXPECT_EQ(open_error(p),
            p.string() + ": section 'weights.bin' is corrupt: sha256 mismatch (file damaged or modified)");
}

TEST(Bundle, NonZeroPaddingRejected) {
  TempDir dir;
  const fs::path p = dir.path() / "z.kiln";
  const std::vector<uint8_t> w(40, 9);
  json h = base_header({{"weights.bin", section_entry(320, w)}});
  auto bytes = assemble(h.dump(), {{320, w}});
  ASSERT_EQ(Bundle::open((write_bytes(p, bytes), p)).section("weights.bin").size, 40u);
  bytes[319] = 1;
  write_bytes(p, bytes);
  EXPECT_NE(open_error(p).find("non-zero padding byte at offset 319"), std::string::npos);
}

TEST(Bundle, PrefixAndJsonErrors) {
  TempDir dir;
  const fs::path p = dir.path() / "h.kiln";
  write_bytes(p, {});
  EXPECT_NE(open_error(p).find("not a kiln bundle"), std::string::npos);
  write_bytes(p, bytes_of("KILNBNDL\x01"));
  EXPECT_NE(open_error(p).find("not a kiln bundle"), std::string::npos);
  auto good = assemble(base_header().dump());
  auto b = good;
  b[0] = 'k';
  write_bytes(p, b);
  EXPECT_NE(open_error(p).find("not a kiln bundle (bad magic)"), std::string::npos);
  b = good;
  std::memset(b.data() + 8, 0, 8);
  write_bytes(p, b);
  EXPECT_NE(open_error(p).find("header length is 0"), std::string::npos);
  b = good;
  std::memset(b.data() + 8, 0, 8);
  b[8] = 1;
  b[11] = 1;  // 16 MiB + 1
  write_bytes(p, b);
  EXPECT_NE(open_error(p).find("exceeds the limit"), std::string::npos);
  b = good;
  b[9] = static_cast<uint8_t>(b[9] + 1);  // 256 bytes longer than the file allows
  write_bytes(p, b);
  EXPECT_NE(open_error(p).find("beyond the end of the file"), std::string::npos);
  write_bytes(p, assemble("{\"format\": 1,"));
  EXPECT_NE(open_error(p).find("not valid JSON"), std::string::npos);
  write_bytes(p, assemble("[1, 2]"));
  EXPECT_NE(open_error(p).find("not a JSON object"), std::string::npos);
  write_bytes(p, assemble("{\"format\": 1, \"format\": 1}"));
  EXPECT_NE(open_error(p).find("duplicate key 'format'"), std::string::npos);
  // A header edited without updating the digest.
  std::string text = base_header().dump();
  auto edited = assemble(text);
  const size_t pos = text.find("resnet");
  edited[16 + pos] = 'R';
  write_bytes(p, edited);
  EXPECT_NE(open_error(p).find("header is corrupt: sha256 mismatch"), std::string::npos);
  // The digest itself truncated away.
  write_bytes(p, std::vector<uint8_t>(good.begin(), good.end() - 1));
  EXPECT_NE(open_error(p).find("digest"), std::string::npos);
}

TEST(Bundle, WriterRejectsBadInput) {
  BundleWriter w(test_info());
  w.add_section("a", std::string("x"));
  auto kind_of = [](const std::function<void()>& f) {
    try {
      f();
    } catch (const Error& e) {
      return e.kind();
    }
    return ErrorKind::Usage;  // "no error" sentinel: never expected below
  };
  EXPECT_EQ(kind_of([&] { w.add_section("a", std::string("y")); }), ErrorKind::Runtime);
  EXPECT_EQ(kind_of([&] { w.add_section("a/b", std::string("y")); }), ErrorKind::Runtime);
  EXPECT_EQ(kind_of([&] { w.add_section("", std::string("y")); }), ErrorKind::Runtime);
  EXPECT_EQ(kind_of([&] { BundleWriter(BundleInfo{1, "v", "f", "segmentation", "cpu"}); }), ErrorKind::Runtime);
  EXPECT_EQ(kind_of([&] { BundleWriter(BundleInfo{1, "v", "f", "detection", "tpu"}); }), ErrorKind::Runtime);
  EXPECT_EQ(kind_of([&] { BundleWriter(BundleInfo{2, "v", "f", "detection", "cpu"}); }), ErrorKind::Runtime);
  EXPECT_TRUE(is_valid_section_name("tactics.sm_90-H200_x.json"));
  EXPECT_TRUE(is_valid_section_name(std::string(128, 'a')));
  EXPECT_FALSE(is_valid_section_name(std::string(129, 'a')));
  EXPECT_FALSE(is_valid_section_name("a b"));
}

TEST(Bundle, WriteFailureLeavesNothingBehind) {
  TempDir dir;
  EXPECT_THROW(three_section_writer().write(dir.path() / "missing" / "m.kiln"), Error);
  EXPECT_TRUE(dir.entries().empty());
  // The rename fails when the target is a directory: the temp file, already
  // written, must be removed again.
  fs::create_directory(dir.path() / "target.kiln");
  EXPECT_THROW(three_section_writer().write(dir.path() / "target.kiln"), std::exception);
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"target.kiln"});
}

TEST(Bundle, OverwriteReplacesAtomically) {
  TempDir dir;
  const fs::path p = dir.path() / "m.kiln";
  three_section_writer().write(p);
  Bundle old_bundle = Bundle::open(p);
  BundleWriter w2(BundleInfo{kBundleFormat, "0.2.0", "yolov10", "detection", "cuda"});
  w2.add_section("weights.bin", std::vector<uint8_t>(5000, 0xab));
  w2.write(p);
  Bundle fresh = Bundle::open(p);
  EXPECT_EQ(fresh.info().family, "yolov10");
  EXPECT_EQ(fresh.section("weights.bin").size, 5000u);
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"m.kiln"});
  // The old mapping still sees the old, complete file: the new one arrived by
  // rename, not by rewriting in place.
  Blob w = old_bundle.section("weights.bin");
  ASSERT_EQ(w.size, 100u);
  EXPECT_EQ(w.data[1], static_cast<uint8_t>(10));
}

TEST(Bundle, SharedAcrossThreads) {
  TempDir dir;
  const fs::path p = dir.path() / "m.kiln";
  three_section_writer().write(p);
  const Bundle b = Bundle::open(p);
  std::vector<std::thread> threads;
  std::atomic<int> ok{0};
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&] {
      for (int i = 0; i < 200; ++i) {
        Bundle copy = b;
        if (copy.section("weights.bin").data[99] == static_cast<uint8_t>(99 * 7 + 3) &&
            copy.section_text("graph.json").size() == 13)
          ++ok;
      }
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok.load(), 800);
}

}  // namespace
}  // namespace kiln
