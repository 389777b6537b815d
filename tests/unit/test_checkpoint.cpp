// Tests for the safetensors reader (single files and sharded indexes). Every
// file is written by the test into its own temporary directory.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cctype>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>

#include "checkpoint/hf_cache.hpp"
#include "checkpoint/hf_config.hpp"
#include "checkpoint/safetensors.hpp"
#include "core/error.hpp"
#include "core/file.hpp"
#include "core/half.hpp"
#include "temp_dir.hpp"

namespace kiln {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using namespace std::string_literals;

using testing::TempDir;
using testing::write_file;
using testing::throws_input;

// --- a tiny safetensors writer ---------------------------------------------

// u64 little-endian header length + header text + data, no checks at all, so
// tests can build any malformed file.
std::string raw_st(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + header + data;
}

struct TensorSpec {
  std::string name, dtype;
  std::vector<int64_t> shape;
  std::string bytes;
};

template <typename T>
std::string bytes_of(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

// A valid file: tensors laid out back to back, header padded with spaces to
// a multiple of 8 as the reference writer does.
std::string make_st(const std::vector<TensorSpec>& ts, const json& metadata = nullptr) {
  json h = json::object();
  std::string data;
  for (const auto& t : ts) {
    h[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {data.size(), data.size() + t.bytes.size()}}};
    data += t.bytes;
  }
  if (!metadata.is_null()) h["__metadata__"] = metadata;
  std::string text = h.dump();
  while (text.size() % 8) text += ' ';
  return raw_st(text, data);
}

const std::vector<float> kF32 = {1.0f, -2.5f, 3.25f, 0.0f, 1e-3f, 65536.0f};
const std::vector<float> kF16 = {1.5f, -2.0f, 0.25f, 65504.0f};
const std::vector<float> kBF16 = {1.0f, -3.5f, 0.15625f, 256.0f};

std::string sample_file() {
  std::vector<uint16_t> h, b;
  for (float f : kF16) h.push_back(f32_to_f16(f));
  for (float f : kBF16) b.push_back(f32_to_bf16(f));
  return make_st({{"fc.weight", "F32", {2, 3}, bytes_of(kF32)},
                  {"fc.bias", "F16", {4}, bytes_of(h)},
                  {"norm.scale", "BF16", {2, 2}, bytes_of(b)}},
                 json{{"format", "pt"}});
}


// --- safetensors: valid files ----------------------------------------------

TEST(Safetensors, ReadsF32F16BF16Exactly) {
  TempDir dir;
  const std::string bytes = sample_file();
  write_file(dir / "model.safetensors", bytes);
  Checkpoint c = Checkpoint::open(dir.path());
  EXPECT_EQ(c.names(), (std::vector<std::string>{"fc.bias", "fc.weight", "norm.scale"}));
  EXPECT_TRUE(c.has("fc.weight"));
  EXPECT_FALSE(c.has("fc"));

  const HostTensor& w = c.get("fc.weight");
  EXPECT_EQ(w.dtype, DType::F32);
  EXPECT_EQ(w.shape, (Shape{2, 3}));
  EXPECT_EQ(w.to_f32(), kF32);
  const HostTensor& b = c.get("fc.bias");
  EXPECT_EQ(b.dtype, DType::F16);
  EXPECT_EQ(b.shape, (Shape{4}));
  EXPECT_EQ(b.to_f32(), kF16);
  const HostTensor& s = c.get("norm.scale");
  EXPECT_EQ(s.dtype, DType::BF16);
  EXPECT_EQ(s.shape, (Shape{2, 2}));
  EXPECT_EQ(s.to_f32(), kBF16);

  ASSERT_EQ(c.files().size(), 1u);
  EXPECT_EQ(c.file_of("fc.bias"), "model.safetensors");
  auto sums = c.file_sha256();
  ASSERT_EQ(sums.size(), 1u);
  EXPECT_EQ(sums["model.safetensors"], sha256_hex(bytes.data(), bytes.size()));
  EXPECT_EQ(c.metadata().at("model.safetensors").at("format"), "pt");
  EXPECT_TRUE(throws_input([&] { c.get("missing.w"); }, {"missing.w", "model.safetensors"}));
  EXPECT_TRUE(throws_input([&] { c.file_of("missing.w"); }, {"missing.w"}));
}

TEST(Safetensors, TensorsBorrowFromTheMapping) {
  TempDir dir;
  write_file(dir / "m.safetensors", sample_file());
  SafetensorsFile f = read_safetensors(dir / "m.safetensors");
  for (const auto& [name, t] : f.tensors) {
    EXPECT_GE(t.blob.data, f.mapping.data) << name;
    EXPECT_LE(t.blob.data + t.blob.size, f.mapping.data + f.mapping.size) << name;
    EXPECT_EQ(t.blob.owner, f.mapping.owner) << name;
  }
  // The tensor keeps the mapping alive after the file object is gone.
  HostTensor keep = f.tensors.at("fc.weight");
  f = SafetensorsFile{};
  EXPECT_EQ(keep.to_f32(), kF32);
}

TEST(Safetensors, AcceptsOtherDtypesScalarsAndEmptyTensors) {
  TempDir dir;
  std::vector<int64_t> i64 = {-1, 1ll << 40};
  std::vector<uint8_t> fp8 = {0x38, 0xb8, 0x7e};  // 1.0, -1.0, 448
  write_file(dir / "x.safetensors",
             make_st({{"steps", "I64", {2}, bytes_of(i64)},
                      {"q", "F8_E4M3", {3}, bytes_of(fp8)},
                      {"scalar", "F32", {}, bytes_of(std::vector<float>{7.0f})},
                      {"empty", "F16", {0, 5}, ""},
                      {"mask", "U8", {1}, "\x01"}}));
  Checkpoint c = Checkpoint::open(dir / "x.safetensors");
  EXPECT_EQ(c.get("steps").dtype, DType::I64);
  int64_t v;
  std::memcpy(&v, c.get("steps").blob.data + 8, 8);
  EXPECT_EQ(v, 1ll << 40);
  EXPECT_EQ(c.get("q").to_f32(), (std::vector<float>{1.0f, -1.0f, 448.0f}));
  EXPECT_EQ(c.get("scalar").shape, Shape{});
  EXPECT_EQ(c.get("scalar").to_f32(), std::vector<float>{7.0f});
  EXPECT_EQ(c.get("empty").numel(), 0);
  EXPECT_EQ(c.get("mask").dtype, DType::U8);
}

TEST(Safetensors, MisalignedDataIsCopiedNotMisread) {
  // Header of odd length: the F32 data starts at an odd offset in the file.
  std::string header = json{{"w", {{"dtype", "F32"}, {"shape", {2}}, {"data_offsets", {0, 8}}}}}.dump();
  if (header.size() % 2 == 0) header += ' ';
  std::string file = raw_st(header, bytes_of(std::vector<float>{2.0f, -4.0f}));
  SafetensorsFile f = parse_safetensors(Blob::copy_of(file.data(), file.size()), "odd.safetensors");
  const HostTensor& t = f.tensors.at("w");
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.blob.data) % 4, 0u);
  EXPECT_EQ(t.to_f32(), (std::vector<float>{2.0f, -4.0f}));
}

TEST(Safetensors, DirectoryResolution) {
  TempDir dir;
  write_file(dir / "a" / "weights.safetensors", sample_file());
  EXPECT_EQ(Checkpoint::open(dir / "a").files()[0].filename(), "weights.safetensors");
  write_file(dir / "a" / "other.safetensors", sample_file());
  EXPECT_TRUE(throws_input([&] { Checkpoint::open(dir / "a"); }, {"other.safetensors", "weights.safetensors"}));
  write_file(dir / "a" / "model.safetensors", sample_file());  // model.safetensors wins
  EXPECT_EQ(Checkpoint::open(dir / "a").files()[0].filename(), "model.safetensors");
  fs::create_directories(dir / "empty");
  EXPECT_TRUE(throws_input([&] { Checkpoint::open(dir / "empty"); }, {"empty", "model.safetensors"}));
  EXPECT_TRUE(throws_input([&] { Checkpoint::open(dir / "nope.safetensors"); }, {"nope.safetensors"}));
}

// --- safetensors: sharded ---------------------------------------------------

struct Shards {
  TempDir dir;
  Shards() {
    write_file(dir / "model-00001-of-00002.safetensors",
               make_st({{"a.w", "F32", {2}, bytes_of(std::vector<float>{1, 2})},
                        {"a.b", "F32", {1}, bytes_of(std::vector<float>{3})}}));
    write_file(dir / "model-00002-of-00002.safetensors",
               make_st({{"b.w", "F32", {3}, bytes_of(std::vector<float>{4, 5, 6})}}));
    map = {{"a.w", "model-00001-of-00002.safetensors"},
           {"a.b", "model-00001-of-00002.safetensors"},
           {"b.w", "model-00002-of-00002.safetensors"}};
  }
  fs::path write_index(const json& index) {
    fs::path p = dir / "model.safetensors.index.json";
    write_file(p, index.dump());
    return p;
  }
  fs::path write_index() { return write_index(json{{"metadata", {{"total_size", 24}}}, {"weight_map", map}}); }
  json map;
};

TEST(Safetensors, ShardedIndexWithTwoShards) {
  Shards s;
  const fs::path index = s.write_index();
  for (const fs::path& p : {s.dir.path(), index}) {
    Checkpoint c = Checkpoint::open(p);
    EXPECT_EQ(c.names(), (std::vector<std::string>{"a.b", "a.w", "b.w"}));
    EXPECT_EQ(c.files().size(), 2u);
    EXPECT_EQ(c.file_of("a.w"), "model-00001-of-00002.safetensors");
    EXPECT_EQ(c.file_of("b.w"), "model-00002-of-00002.safetensors");
    EXPECT_EQ(c.get("b.w").to_f32(), (std::vector<float>{4, 5, 6}));
    EXPECT_EQ(c.get("a.b").to_f32(), (std::vector<float>{3}));
    auto sums = c.file_sha256();
    ASSERT_EQ(sums.size(), 2u);
    EXPECT_EQ(sums["model-00002-of-00002.safetensors"],
              sha256_file_hex(s.dir / "model-00002-of-00002.safetensors"));
    EXPECT_TRUE(throws_input([&] { c.get("c.w"); }, {"c.w", "model.safetensors.index.json"}));
  }
}

TEST(Safetensors, ShardedIndexErrors) {
  const std::string idx = "model.safetensors.index.json";
  auto expect_bad = [&](const std::function<void(Shards&)>& edit, std::vector<std::string> needles) {
    Shards s;
    edit(s);
    needles.push_back(idx);
    EXPECT_TRUE(throws_input([&] { Checkpoint::open(s.dir.path()); }, needles));
  };
  for (const char* evil : {"../model-00002-of-00002.safetensors", "sub/x.safetensors", "..", "/etc/passwd", ""})
    expect_bad([&](Shards& s) { s.map["b.w"] = evil; s.write_index(); }, {"b.w", "not a plain file name"});
  expect_bad([](Shards& s) { s.map["c.w"] = "model-00003-of-00003.safetensors"; s.write_index(); },
             {"model-00003-of-00003.safetensors"});
  expect_bad([](Shards& s) { s.map["c.w"] = "model-00002-of-00002.safetensors"; s.write_index(); },
             {"c.w", "does not contain"});
  expect_bad([](Shards& s) { s.map["b.w"] = "model-00001-of-00002.safetensors"; s.write_index(); },
             {"b.w", "does not contain"});
  expect_bad([](Shards& s) { s.map["a.w"] = "model-00002-of-00002.safetensors"; s.write_index(); },
             {"a.w", "is listed in model-00002-of-00002.safetensors but is in model-00001"});
  expect_bad([](Shards& s) {
    write_file(s.dir / "model-00002-of-00002.safetensors",
               make_st({{"a.w", "F32", {1}, bytes_of(std::vector<float>{9})}}));
    s.map.erase("b.w");
    s.map["a.w2"] = "model-00002-of-00002.safetensors";
    s.write_index();
  }, {"a.w", "appears in both"});
  expect_bad([](Shards& s) { s.map["b.w"] = 3; s.write_index(); }, {"b.w", "must be a string"});
  expect_bad([](Shards& s) { s.write_index(json{{"weight_map", json::array()}}); }, {"weight_map"});
  expect_bad([](Shards& s) { s.write_index(json{{"weight_map", json::object()}}); }, {"weight_map"});
  expect_bad([](Shards& s) { s.write_index(json{{"metadata", json::object()}}); }, {"missing key 'weight_map'"});
  expect_bad([](Shards& s) { write_file(s.dir / "model.safetensors.index.json", "{\"weight_map\": {"); }, {"not valid JSON"});
}

// --- safetensors: malformed files -------------------------------------------

struct BadCase {
  std::string id, bytes, needle;
  std::string tensor;  // must appear in the message when non-empty
};

std::string entry(const std::string& name, const json& e) { return json{{name, e}}.dump(); }
json tensor_json(const std::string& dtype, const json& shape, const json& offsets) {
  return {{"dtype", dtype}, {"shape", shape}, {"data_offsets", offsets}};
}

std::vector<BadCase> bad_cases() {
  const std::string d8(8, '\0');
  const uint64_t big = 1ull << 62;
  std::string huge_len(8, '\0');
  huge_len[4] = 1;  // 2^32 bytes of header
  std::vector<BadCase> v = {
      {"empty", "", "too short", ""},
      {"seven", "\x02\0\0\0\0\0\0"s, "too short", ""},
      {"overcap", raw_st("{}", "").replace(0, 8, huge_len), "exceeds", ""},
      {"pastend", raw_st("{}", "").replace(0, 1, "\x40"), "past the end", ""},
      {"notjson", raw_st("{\"w\": [", ""), "not valid JSON", ""},
      {"notobject", raw_st("[1,2]", ""), "must be a JSON object", ""},
      {"badutf8", raw_st("{\"w\xff\": 1}", ""), "UTF-8", ""},
      {"dupkey", raw_st(entry("w", tensor_json("F32", {1}, {0, 4})).insert(1, "\"w\":{},"), d8), "more than once", "w"},
      {"entrynotobj", raw_st(entry("w.e", 5), ""), "must be an object", "w.e"},
      {"nodtype", raw_st(entry("w.d", {{"shape", {1}}, {"data_offsets", {0, 4}}}), d8), "'dtype'", "w.d"},
      {"noshape", raw_st(entry("w.s", {{"dtype", "F32"}, {"data_offsets", {0, 4}}}), d8), "'shape'", "w.s"},
      {"nooffsets", raw_st(entry("w.o", {{"dtype", "F32"}, {"shape", {1}}}), d8), "'data_offsets'", "w.o"},
      {"dtypetype", raw_st(entry("w.t", {{"dtype", 4}, {"shape", {1}}, {"data_offsets", {0, 4}}}), d8), "string", "w.t"},
      {"unkdtype", raw_st(entry("w.u", tensor_json("F64", {1}, {0, 8})), d8), "unknown dtype 'F64'", "w.u"},
      {"shapetype", raw_st(entry("w.st", tensor_json("F32", "1", {0, 4})), d8), "'shape' must be an array", "w.st"},
      {"negdim", raw_st(entry("w.n", tensor_json("F32", {-1, 2}, {0, 4})), d8), "negative", "w.n"},
      {"floatdim", raw_st(entry("w.f", tensor_json("F32", {1.5}, {0, 4})), d8), "integers", "w.f"},
      {"offs3", raw_st(entry("w.3", tensor_json("F32", {1}, {0, 4, 8})), d8), "two non-negative", "w.3"},
      {"offsneg", raw_st(entry("w.ng", tensor_json("F32", {1}, {-4, 0})), d8), "two non-negative", "w.ng"},
      {"offsstr", raw_st(entry("w.os", tensor_json("F32", {1}, {"0", "4"})), d8), "two non-negative", "w.os"},
      {"beginend", raw_st(entry("w.be", tensor_json("F32", {0}, {8, 4})), d8), "begin > end", "w.be"},
      {"beyond", raw_st(entry("w.by", tensor_json("F32", {4}, {0, 16})), d8), "beyond the data region", "w.by"},
      {"sizemismatch", raw_st(entry("w.sm", tensor_json("F32", {3}, {0, 8})), d8), "data_offsets span", "w.sm"},
      {"numeloverflow", raw_st(entry("w.ov", tensor_json("F32", {big, big}, {0, 0})), ""), "too many", "w.ov"},
      {"zeroandoverflow", raw_st(entry("w.zo", tensor_json("F32", {0, big, big}, {0, 0})), ""), "too many", "w.zo"},
      {"bytesoverflow", raw_st(entry("w.bo", tensor_json("I64", {big}, {0, 0})), ""), "needs", "w.bo"},
      {"metanotobj", raw_st(json{{"__metadata__", 3}}.dump(), ""), "__metadata__", ""},
      {"metavalue", raw_st(json{{"__metadata__", {{"k", 1}}}}.dump(), ""), "'k'", ""},
      {"emptyname", raw_st(entry("", tensor_json("F32", {1}, {0, 4})), d8), "empty name", ""},
  };
  json overlap = {{"w.first", tensor_json("F32", {2}, {0, 8})}, {"w.second", tensor_json("F32", {2}, {4, 12})}};
  v.push_back({"overlap", raw_st(overlap.dump(), std::string(12, '\0')), "overlaps", "w.second"});
  return v;
}

TEST(Safetensors, EachMalformedFileIsAnInputErrorNamingFileAndTensor) {
  TempDir dir;
  const auto cases = bad_cases();
  for (const auto& bc : cases) {
    const std::string fname = "bad_" + bc.id + ".safetensors";
    write_file(dir / fname, bc.bytes);
    std::vector<std::string> needles = {fname, bc.needle};
    if (!bc.tensor.empty()) needles.push_back("'" + bc.tensor + "'");
    EXPECT_TRUE(throws_input([&] { Checkpoint::open(dir / fname); }, needles)) << "case " << bc.id;
  }
  EXPECT_GE(cases.size(), 29u);
}

TEST(Safetensors, EveryTruncationThrows) {
  TempDir dir;
  const std::string full = sample_file();
  write_file(dir / "full.safetensors", full);
  ASSERT_NO_THROW(Checkpoint::open(dir / "full.safetensors"));
  for (size_t len = 0; len < full.size(); ++len) {
    const fs::path p = dir / "cut.safetensors";
    write_file(p, full.substr(0, len));
    EXPECT_TRUE(throws_input([&] { Checkpoint::open(p); }, {"cut.safetensors"})) << "length " << len;
  }
}

TEST(Safetensors, RandomGarbageAndMutationsNeverCrash) {
  std::mt19937 rng(1234);
  auto parse = [](const std::string& b) {
    return parse_safetensors(Blob::copy_of(b.data(), b.size()), "fuzz.safetensors");
  };
  for (int i = 0; i < 2000; ++i) {  // pure garbage: always rejected
    std::string b(rng() % 300, '\0');
    for (char& ch : b) ch = static_cast<char>(rng());
    EXPECT_TRUE(throws_input([&] { parse(b); }, {"fuzz.safetensors"})) << "iteration " << i;
    // Garbage behind a plausible length: gets past the length checks.
    std::string g = raw_st(b.substr(0, b.size() / 2), b.substr(b.size() / 2));
    EXPECT_TRUE(throws_input([&] { parse(g); }, {"fuzz.safetensors"})) << "iteration " << i;
  }
  // Byte flips of a valid file may still parse; they must never crash or
  // throw anything but kiln::Error.
  const std::string valid = sample_file();
  int rejected = 0;
  for (int i = 0; i < 3000; ++i) {
    std::string m = valid;
    for (int k = 0, n = 1 + rng() % 4; k < n; ++k) m[rng() % m.size()] = static_cast<char>(rng());
    try {
      SafetensorsFile f = parse(m);
      for (auto& [name, t] : f.tensors) ASSERT_LE(t.nbytes(), t.blob.size) << name;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::Input);
      ++rejected;
    }
  }
  EXPECT_GT(rejected, 0);
}

// --- config.json ------------------------------------------------------------

}  // namespace
}  // namespace kiln
